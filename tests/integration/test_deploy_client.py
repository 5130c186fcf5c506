"""deploy/client_example.py (the client of docs/deployment.md) runs as printed: one session over
HTTP, gRPC calls and a gRPC stream, against a server directly (test_scaleout.py runs sessions
through HAProxy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.support.process import ServerProcess


@pytest.mark.parametrize("protocol", ["http", "grpc", "stream"])
def test_example_client(server: ServerProcess, protocol: str) -> None:
    url = server.http_url if protocol == "http" else server.grpc_url
    out = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "client_example.py"), "--url", url, "--protocol", protocol,
         "--session", f"example-{protocol}", "--steps", "5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [f"example-{protocol}", "1", "3", "6", "10", "15"]
