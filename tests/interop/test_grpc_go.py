"""grpc-go (Go's gRPC, its own HTTP/2 and HPACK) against the builtin gRPC server, through the
client in tests/interop/go/seqclient, built offline from Debian's packages by tools/build_go.sh
(GOPATH mode, no module download; the bench's load generator is built the same way)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT
from tests.support.process import ServerProcess
from tests.support.tools import unavailable

CLIENT_SOURCE = ROOT / "tests" / "interop" / "go" / "seqclient"
BUILD_SCRIPT = ROOT / "tools" / "build_go.sh"
TOOLCHAIN_MISSING = 3  # build_go.sh's exit status when go, protoc or Debian's Go sources are missing
BUILD_TIMEOUT_S = 600
RUN_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def seqclient(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The grpc-go client, built once per session."""
    out = tmp_path_factory.mktemp("grpc-go")
    run = subprocess.run(
        [str(BUILD_SCRIPT), str(CLIENT_SOURCE), str(out)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if run.returncode == TOOLCHAIN_MISSING:
        unavailable(run.stderr.strip())
    assert run.returncode == 0, f"build_go.sh: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return out / CLIENT_SOURCE.name


def run_client(client: Path, srv: ServerProcess, *args: str) -> tuple[int, dict[str, Any], str]:
    """seqclient's exit status, its JSON report and its stderr."""
    run = subprocess.run(
        [str(client), "-addr", srv.grpc_url, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    report = json.loads(run.stdout) if run.returncode == 0 else {}
    return run.returncode, report, run.stderr


def test_health_and_server_metadata(seqclient: Path, interop: ServerProcess) -> None:
    rc, report, err = run_client(seqclient, interop, "health")
    assert rc == 0, err
    assert report["live"] is True and report["ready"] is True
    assert report["name"] == "seqserve"


def test_sequences_unary_and_streamed(seqclient: Path, interop: ServerProcess) -> None:
    """A sequence over ModelInfer and one over ModelStreamInfer side by side, 20 steps each:
    seqclient checks the running sum after every step and a clean end of the stream."""
    rc, report, err = run_client(seqclient, interop, "sequence", "-model", "accumulator", "-steps", "20")
    assert rc == 0, err
    assert report == {"steps": 20, "unary_sum": 210, "stream_sum": 420}


@pytest.mark.parametrize(
    "entries",
    [
        100,
        130,
    ],
)
def test_many_metadata_entries(seqclient: Path, interop: ServerProcess, entries: int) -> None:
    """A call with `entries` metadata entries (about 30 bytes each, far under the advertised
    header list size) is served, and a stream already open on the same connection lives on."""
    rc, report, err = run_client(seqclient, interop, "metadata", "-entries", str(entries))
    assert rc == 0, err
    assert report["code"] == "OK", report
    assert report["stream_survived"] is True
