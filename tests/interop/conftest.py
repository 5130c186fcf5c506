"""The interop tests: clients that share no code with seqserve (nghttp2's h2load and nghttp,
curl, wrk, grpc-go, grpclib on the h2 library, grpcio) against a real `seqserve serve` with its
default builtin HTTP/1.1 and HTTP/2 servers. One server serves the whole session; each test
checks every reply it gets. A missing program skips its tests with the install line, and fails
them under CI=true (tests/support/tools.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.interop import interop_server
from tests.support.process import ServerProcess


@pytest.fixture(scope="session")
def interop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """accumulator, add_sub, echo_bytes and uc (until_cancelled), 64 MiB gRPC messages."""
    with interop_server(tmp_path_factory.mktemp("interop")) as srv:
        yield srv
