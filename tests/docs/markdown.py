"""Just enough Markdown for the docs tests: fenced code blocks, headings and their GitHub
anchors, and local links.

The docs' convention for code blocks: a block fenced as `python`, `bash` or `sh` is a complete
example that tests/docs/test_examples.py runs; one whose info string also has the word `norun`
(```` ```python norun ````) is an excerpt or a command that needs what a test cannot have (a
cluster, an install), and is only checked for syntax. Other blocks (output, diagrams, configs,
JSON) are text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE_LANGUAGES = ("python", "bash", "sh")
NORUN = "norun"

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


@dataclass(frozen=True)
class CodeBlock:
    path: Path
    line: int  # of the opening fence, 1-based
    info: str  # the fence's info string: "python", "bash norun", ""
    text: str

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def runnable(self) -> bool:
        return self.language in RUNNABLE_LANGUAGES and NORUN not in self.info.split()[1:]

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def split_code(path: Path) -> tuple[list[CodeBlock], list[tuple[int, str]]]:
    """The page's fenced code blocks, and its other lines (line number, text)."""
    blocks: list[CodeBlock] = []
    prose: list[tuple[int, str]] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        indent, marker, info = fence.groups()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(marker[0])}{{{len(marker)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append(CodeBlock(path, i + 1, info.strip(), "\n".join(body) + "\n"))
        i = j + 1
    return blocks, prose


def code_blocks(path: Path) -> list[CodeBlock]:
    return split_code(path)[0]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lowercased, punctuation other than `-`
    and `_` dropped, spaces made hyphens."""
    text = _LINK.sub(lambda m: m.group(0)[1 : m.group(0).index("](")], heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link into the page may name: its headings' slugs (a repeated heading gets
    `-1`, `-2`, ... as on GitHub) and explicit `<a name=...>` / `id=` anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in split_code(path)[1]:
        found.update(_HTML_ANCHOR.findall(line))
        heading = _HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def local_links(path: Path) -> list[tuple[int, str]]:
    """The page's links and images that point into the repository (line, target), outside code.
    A link's text may wrap onto the next line, so the prose is searched as one string."""
    numbered = dict(split_code(path)[1])
    last = max(numbered, default=0)
    text = "\n".join(_INLINE_CODE.sub("", numbered.get(n, "")) for n in range(1, last + 1))
    out: list[tuple[int, str]] = []
    for match in [*_LINK.finditer(text), *_IMAGE.finditer(text)]:
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        out.append((text.count("\n", 0, match.start(1)) + 1, target))
    return sorted(out)


def pages() -> list[Path]:
    """The Markdown a reader follows: README.md, docs/, deploy/ and bench/."""
    found = [ROOT / "README.md"]
    for folder in ("docs", "deploy", "bench"):
        found += sorted((ROOT / folder).rglob("*.md"))
    return found
