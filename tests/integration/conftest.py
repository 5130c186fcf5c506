"""Fixtures that run the real `seqserve serve` as a subprocess on free ports.

`server` is one server on the bundled demo repository for the whole session; `launch` (in
tests/conftest.py) starts extra servers (a custom repository, other flags) for one test. Every
server is stopped with SIGTERM at teardown and must exit 0.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from tests.support.clients import FLAVOURS, Client
from tests.support.models import copy_demo_models, copy_model
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, serving, under_workers

#: files that run the same with and without SEQSERVE_TEST_WORKERS: they start no `seqserve serve`
#: (in-process transports, the rings between processes) or give `--workers` themselves. The
#: integration pass under workers (.ci/run) skips them, as the first pass has run them already.
SAME_UNDER_WORKERS = frozenset({
    "test_grpc_builtin_server.py", "test_http1_server.py", "test_protos_over_grpc.py",
    "test_ring_feeder_processes.py", "test_rings_processes.py",
    "test_workers.py", "test_workers_backpressure.py",
})  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not under_workers():
        return
    same = pytest.mark.skip(reason="the same without SEQSERVE_TEST_WORKERS (no server, or its own --workers)")
    for item in items:
        if item.path.name in SAME_UNDER_WORKERS:
            item.add_marker(same)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The demo repository (accumulator, accumulator_corrid, add_sub), shared by the session."""
    with serving(DEMO_REPO, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


# ------------------------------------------------------------------------ custom repos


@pytest.fixture
def custom_repo(tmp_path: Path) -> Path:
    """A tmp repository: a copy of the demo models plus `identity` (every datatype)."""
    repo = copy_demo_models(tmp_path / "models")
    copy_model(repo, "identity")
    return repo


@pytest.fixture
def custom_server(custom_repo: Path, launch: Callable[..., ServerProcess]) -> ServerProcess:
    """A function-scoped server on `custom_repo`."""
    return launch(custom_repo)


@pytest.fixture(scope="module")
def identity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server on a tmp repository holding only `identity`, shared by one module."""
    repo = tmp_path_factory.mktemp("identity-repo")
    copy_model(repo, "identity")
    with serving(repo, log_dir=repo) as srv:
        yield srv


@pytest.fixture(params=FLAVOURS)
async def client(request: pytest.FixtureRequest, server: ServerProcess) -> AsyncIterator[Client]:
    """Each of tritonclient.http, .http.aio, .grpc and .grpc.aio on the session server."""
    cl = Client(request.param, server)
    yield cl
    await cl.close()
