"""docs/cli.md prints `seqserve serve --help` as the command prints it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.docs.markdown import ROOT, code_blocks

CLI_MD = ROOT / "docs" / "cli.md"


def test_cli_md_shows_the_current_help() -> None:
    (shown,) = (b.text for b in code_blocks(CLI_MD) if b.text.startswith("usage: seqserve serve"))
    env = dict(os.environ, COLUMNS="100")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, "-m", "seqserve", "serve", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert shown.rstrip() == out.stdout.rstrip(), "regenerate with `COLUMNS=100 seqserve serve --help`"
