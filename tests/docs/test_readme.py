"""The README stays a front page: short, opening with the two commands a newcomer needs, and the
demo model it prints "in full" is the shipped one."""

from __future__ import annotations

import re

from tests.docs.markdown import ROOT, code_blocks

README = ROOT / "README.md"
MAX_LINES = 250


def test_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_readme_opens_with_install_and_serve_then_the_tests_then_cpu_torch() -> None:
    first, second, third = (block.text.strip() for block in code_blocks(README)[:3])
    assert first.startswith("python3 -m venv") and "pip install ." in first and first.endswith("seqserve serve")
    assert second == "bash .ci/run"
    assert "torch==" in third and "+cpu" in third and "https://download.pytorch.org/whl/cpu" in third
    ci = (ROOT / ".ci" / "run").read_text()
    pinned = re.search(r"TORCH=\$\{SEQSERVE_TORCH:-(torch==\S+)\}", ci)
    assert pinned is not None and pinned.group(1) in third  # the README installs what CI tests


def _code_lines(text: str) -> list[str]:
    return [line.split("#", 1)[0].rstrip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_the_python_model_printed_in_full_is_the_demo_accumulator() -> None:
    section = README.read_text().split("## Writing a Python model", 1)[1]
    block = next(b for b in code_blocks(README) if b.text.strip() in section)
    shipped = _code_lines((ROOT / "src/seqserve/examples/models/accumulator/1/model.py").read_text())
    for line in _code_lines(block.text):
        assert line in shipped, line
