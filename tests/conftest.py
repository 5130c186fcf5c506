"""Shared fixtures: build throw-away model repositories and run an in-process Server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.helpers")

from seqserve.engine import Server  # noqa: E402

# Re-exported: test modules import these from tests.helpers; older imports keep working.
from tests.helpers import RECORDING_MODEL, expect_error, recorded, write_model  # noqa: E402, F401


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "models"
    r.mkdir()
    return r


@pytest.fixture
async def serve(repo: Path) -> AsyncIterator[Callable[..., object]]:
    """`server = await serve()` starts a Server on `repo`; it is shut down after the test."""
    servers: list[Server] = []

    async def start(**kwargs: object) -> Server:
        s = Server(repo, **kwargs)  # type: ignore[arg-type]
        await s.start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        await s.shutdown(timeout_s=0)
