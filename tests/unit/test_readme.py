"""The README's embedding example runs as printed and prints what its comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_embedding_example_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Embedding the engine", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.split() == ["[[2.]]", "1", "[[3.]]"]
