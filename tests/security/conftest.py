"""Fixtures of the security suite (issue 11): every test here is marked `security`
(`pytest -m security` selects them; they run in the default suite too).

`hostile` is the session's hostile-traffic server with live sequences stepping beside it
(tests/support/hostile.py); `launch` (tests/conftest.py) starts a dedicated server for the
tests that measure latency or memory, or that must not disturb the shared one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hostile import Harness, build_repo

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.security)


@pytest.fixture(scope="session")
def security_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repo(tmp_path_factory.mktemp("security-repo"))


@pytest.fixture(scope="session")
def harness(security_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    h = Harness(security_repo, tmp_path_factory.mktemp("security-logs"))
    h.start()
    yield h
    rc = h.close()
    assert rc == 0, f"the hostile-traffic server exited with {rc}"


@pytest.fixture
def hostile(harness: Harness) -> Harness:
    """The shared server, restarted first if an earlier case killed or wedged it."""
    harness.ensure()
    return harness
