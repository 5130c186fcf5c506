"""Every local link in the Markdown a reader follows resolves: the file (or folder) exists, and
a `#anchor` names a heading of the target page (GitHub's slugs) or of the same page."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.docs.markdown import ROOT, anchors, local_links, pages, slug


def _problem(page: Path, target: str) -> str | None:
    file_part, _, anchor = target.partition("#")
    dest = (page.parent / unquote(file_part)).resolve() if file_part else page
    if not dest.exists():
        return "no such file"
    if ROOT not in dest.parents and dest != ROOT:
        return "outside the repository"
    if anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
        return f"no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(page: Path) -> None:
    broken = [
        f"{page.relative_to(ROOT)}:{line}: {target}: {why}"
        for line, target in local_links(page)
        if (why := _problem(page, target)) is not None
    ]
    assert not broken, "\n".join(broken)


def test_slugs_follow_github() -> None:
    assert slug("Side by side with Triton 2.51") == "side-by-side-with-triton-251"
    assert slug("Operating: metrics, sequence listing, remembered sessions") == (
        "operating-metrics-sequence-listing-remembered-sessions"
    )
    assert slug("`seqserve serve` and `--http-port`") == "seqserve-serve-and---http-port"
    assert slug("Triton's QA suites") == "tritons-qa-suites"
    assert slug("TLS and mTLS") == "tls-and-mtls"
    assert slug("See [the docs](docs/x.md) now") == "see-the-docs-now"
    assert slug("snake_case stays") == "snake_case-stays"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Only heading\n")
    page = tmp_path / "a.md"
    page.write_text(
        "# A\n[ok](b.md#only-heading) [self](#a) and [wrapped\ntext](b.md#nope)\n"
        "`[in code](missing.md)`\n```\n[in a block](missing.md)\n```\n[gone](missing.md)\n"
    )
    found = {(line, target) for line, target in local_links(page)}
    assert found == {(2, "b.md#only-heading"), (2, "#a"), (3, "b.md#nope"), (8, "missing.md")}
    assert anchors(page) == {"a"}
