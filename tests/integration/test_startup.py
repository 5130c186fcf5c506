"""Startup of real `seqserve serve` processes: a port that cannot be bound and a model that
fails to load end startup with one line and a non-zero exit (Triton's --exit-on-error), before
anything says "ready"; --strict-readiness; several --model-repository; --http-address,
--grpc-address; --log-verbose. Every process here is bounded in time."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from tests.support.clients import http_request
from tests.support.models import copy_model
from tests.support.paths import DEMO_REPO, ROOT
from tests.support.process import ServerProcess, live, run_serve, under_workers

BROKEN_PY = "raise RuntimeError('this model does not load')\n"


def run_on(*args: str, repo: Path = DEMO_REPO) -> subprocess.CompletedProcess[str]:
    """`seqserve serve` on `repo` and 127.0.0.1 that must end by itself (startup fails): its exit
    status and output. Ports the arguments do not set are free ones."""
    return run_serve("--host", "127.0.0.1", "--model-repository", str(repo), *args)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other socket listens on."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def _error_lines(out: str) -> list[str]:
    """Error lines in Triton's default log format (E<MMDD> ...), and anything that looks like one."""
    return [line for line in out.splitlines() if re.match(r"E\d{4} ", line) or "Error" in line or "Traceback" in line]


def _assert_one_line_failure(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out, out
    assert " ready" not in out, out
    errors = _error_lines(out)
    assert len(errors) == 1, out
    for f in fragments:
        assert f in errors[0], errors[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("http_server", ["builtin", "hypercorn", "granian"])
def test_busy_http_port_ends_startup(busy_port: int, http_server: str) -> None:
    proc = run_on("--http-port", str(busy_port), "--http-server", http_server)
    _assert_one_line_failure(
        proc, f"cannot listen for HTTP on 127.0.0.1:{busy_port} (port {busy_port})", "address already in use"
    )
    if not under_workers():  # with workers the engine binds every port before anything starts
        assert "gRPC (builtin) listening" in proc.stderr  # gRPC started first, and was stopped


@pytest.mark.timeout(120)
def test_busy_grpc_port_ends_startup(busy_port: int) -> None:
    proc = run_on("--http-port", "off", "--grpc-port", str(busy_port))
    _assert_one_line_failure(
        proc, f"cannot listen for gRPC on 127.0.0.1:{busy_port} (port {busy_port})", "address already in use"
    )
    assert "uvloop" not in proc.stderr  # no chained, unrelated ImportError


def _repo_with_broken_model(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    copy_model(repo, "plus_one", "good")
    copy_model(repo, "plus_one", "broken", model_py=BROKEN_PY)
    return repo


@pytest.mark.timeout(120)
def test_model_that_fails_ends_startup(tmp_path: Path) -> None:
    proc = run_on(repo=_repo_with_broken_model(tmp_path))
    out = proc.stderr
    assert proc.returncode == 1, out
    assert "failed to load model 'broken': failed to import" in out
    assert "failed to load all models (broken)" in out
    assert "listening" not in out and " ready" not in out and "Traceback" not in out, out


@pytest.mark.timeout(120)
def test_exit_on_error_false_serves_the_others_and_strict_readiness(
    tmp_path: Path, launch: Callable[..., ServerProcess]
) -> None:
    repo = _repo_with_broken_model(tmp_path)
    # strict readiness (the default): not ready while 'broken' failed; the launch helper waits
    # for readiness, so this server uses --strict-readiness=false, and the strict one is probed
    lax = launch(repo, "--exit-on-error=false", "--strict-readiness=false")
    assert http_request(lax, "GET", "/v2/health/ready").status == 200
    assert http_request(lax, "GET", "/v2/models/good/ready").status == 200
    assert http_request(lax, "GET", "/v2/models/broken/ready").status == 400

    strict = launch(repo, "--exit-on-error", "false", probe=live)  # waits until live, not ready
    assert http_request(strict, "GET", "/v2/health/live").status == 200
    assert http_request(strict, "GET", "/v2/health/ready").status == 400
    with grpc.insecure_channel(strict.grpc_url) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready is False
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live is True
    assert http_request(strict, "GET", "/v2/models/good/ready").status == 200


@pytest.mark.timeout(120)
def test_several_model_repositories(tmp_path: Path, launch: Callable[..., ServerProcess]) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    copy_model(first, "plus_one", "one")
    copy_model(second, "plus_one", "two")
    srv = launch(first, "--model-repository", str(second))
    index = http_request(srv, "POST", "/v2/repository/index", {}).json()
    assert {(m["name"], m["state"]) for m in index} == {("one", "READY"), ("two", "READY")}
    for name in ("one", "two"):
        body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [41]}]}
        r = http_request(srv, "POST", f"/v2/models/{name}/infer", body)
        assert r.json()["outputs"][0]["data"] == [42]


@pytest.mark.timeout(120)
def test_model_in_two_repositories_is_an_error(tmp_path: Path, launch: Callable[..., ServerProcess]) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    copy_model(first, "plus_one", "one")
    copy_model(first, "plus_one", "twice")
    copy_model(second, "plus_one", "twice")
    proc = run_on("--model-repository", str(second), repo=first)
    assert proc.returncode == 1, proc.stderr
    assert "failed to poll model 'twice': not unique across all model repositories" in proc.stderr
    assert "failed to load all models (twice)" in proc.stderr

    srv = launch(first, "--model-repository", str(second), "--exit-on-error=false", "--strict-readiness=false")
    index = {m["name"]: m for m in http_request(srv, "POST", "/v2/repository/index", {}).json()}
    assert index["one"]["state"] == "READY"
    assert (index["twice"]["state"], index["twice"]["reason"]) == (
        "UNAVAILABLE",
        "model appears in two or more repositories",
    )
    assert http_request(srv, "GET", "/v2/models/twice/ready").status == 400


@pytest.mark.timeout(120)
def test_http_and_grpc_addresses(launch: Callable[..., ServerProcess]) -> None:
    # --host for both, then each front-end on its own loopback address
    srv = launch(None, "--grpc-address", "127.0.0.2", "--http-address", "127.0.0.1", "--log-verbose", "1")
    assert http_request(srv, "GET", "/v2/health/ready").status == 200
    with grpc.insecure_channel(f"127.0.0.2:{srv.grpc_port}") as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready is True
    with grpc.insecure_channel(srv.grpc_url) as ch:  # not on 127.0.0.1
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.ServerReady(pb.ServerReadyRequest(), timeout=5)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    log = srv.log()
    assert f"gRPC (builtin) listening on 127.0.0.2:{srv.grpc_port}" in log
    assert f"listening on http://127.0.0.1:{srv.http_port}" in log
    assert "hpack" not in log and "asyncio" not in log  # --log-verbose 1 is seqserve's own loggers only


def test_help_lists_the_startup_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "seqserve", "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    for flag in (
        "--exit-on-error",
        "--strict-readiness",
        "--log-verbose",
        "--http-address",
        "--grpc-address",
        "--host",
        "--model-repository",
        "--http-server",
    ):
        assert flag in out, flag


def test_bad_boolean_is_a_usage_error() -> None:
    proc = run_on("--exit-on-error", "maybe")
    assert proc.returncode == 2
    assert "'maybe' is not a boolean" in proc.stderr
