"""Fixtures for every test: a throw-away model repository (`repo`), an in-process Server on it
(`serve`), a real `seqserve serve` process for one test (`launch`) and a redis-server for the
state store's tests (`redis_url`). Harness code lives in tests/support."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.support")

from seqserve.engine import Server  # noqa: E402
from tests.support.paths import DEMO_REPO  # noqa: E402
from tests.support.process import ServerProcess, start_server  # noqa: E402
from tests.support.redis_server import redis_server  # noqa: E402


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


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """`launch(repo, *flags)` starts a server for this test only; stopped (exit 0 checked) after it."""
    started: list[ServerProcess] = []

    def _launch(
        repo: Path | None = None,
        *args: str,
        exit_timeout_s: float = 3.0,
        tls: bool = False,
        probe: Callable[[ServerProcess], bool] | None = None,
    ) -> ServerProcess:
        srv = start_server(
            repo or DEMO_REPO, *args, log_dir=tmp_path, exit_timeout_s=exit_timeout_s, tls=tls, probe=probe
        )
        started.append(srv)
        return srv

    yield _launch
    for srv in started:
        srv.terminate()
    failures = []
    for srv in started:
        try:
            rc = srv.wait()
        except AssertionError as e:
            failures.append(str(e))
            continue
        if rc != 0:
            failures.append(f"server {srv.args} exited with {rc}\n{srv.log()}")
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server for one module (the test skips without one): its URL."""
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url
