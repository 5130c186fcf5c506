"""SIGTERM drains: new sequences get UNAVAILABLE, running ones finish (unary HTTP and gRPC and
the gRPC stream), then the process exits 0; a sequence that never ends is cut off at
--exit-timeout-secs."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.checks import WAIT_S, wait_until_sync
from tests.support.clients import (
    Client,
    SyncStream,
    expect_error,
    grpc_input,
    http_request,
    new_int_id,
    new_str_id,
    raw_output,
)
from tests.support.models import copy_demo_models, write_model
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, start_server

STOPPING = "Server is stopping"


def _wait_not_ready(srv: ServerProcess) -> None:
    wait_until_sync(lambda: http_request(srv, "GET", "/v2/health/ready").status != 200, "not ready after SIGTERM")


async def test_sigterm_drains_sequences(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, exit_timeout_s=20.0)
    http, grpc_ = Client("http", srv), Client("grpc_aio", srv)
    stream = SyncStream(srv)
    try:
        a, b, c = new_int_id(), new_str_id(), new_int_id()
        assert await grpc_.step("accumulator", a, 1, sequence_start=True) == 1
        assert await http.step("accumulator_corrid", c, 10, sequence_start=True) == 10
        stream.send("accumulator", [grpc_input(100)], request_id="s0", sequence_id=b, sequence_start=True)
        result, error = stream.get()
        assert error is None and float(result.as_numpy("OUTPUT")[0, 0]) == 100

        srv.terminate()
        _wait_not_ready(srv)
        assert srv.alive()

        # new sequences are refused with UNAVAILABLE, on every path
        for cl in (http, grpc_):
            await expect_error(cl.step("accumulator", new_int_id(), 1, sequence_start=True), cl.code("UNAVAILABLE"),
                               STOPPING)  # fmt: skip
        doc = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
               "parameters": {"sequence_id": "late", "sequence_start": True}}  # fmt: skip
        r = http_request(srv, "POST", "/v2/models/accumulator/infer", doc)
        assert r.status == 503 and STOPPING in r.error()
        stream.send("accumulator", [grpc_input(1)], request_id="late", sequence_id=new_int_id(), sequence_start=True)
        result, error = stream.get()
        assert result is None and STOPPING in error.message()

        # the running sequences go on and end normally
        assert await grpc_.step("accumulator", a, 2) == 3
        assert await http.step("accumulator_corrid", c, 20) == 30
        stream.send("accumulator", [grpc_input(200)], request_id="s1", sequence_id=b)
        result, error = stream.get()
        assert error is None and float(result.as_numpy("OUTPUT")[0, 0]) == 300
        assert srv.alive()
        assert await grpc_.step("accumulator", a, 3, sequence_end=True) == 6
        assert await http.step("accumulator_corrid", c, 30, sequence_end=True) == 60
        stream.send("accumulator", [grpc_input(300)], request_id="s2", sequence_id=b, sequence_end=True)
        result, error = stream.get()
        assert error is None and float(result.as_numpy("OUTPUT")[0, 0]) == 600
        ended = time.monotonic()
    finally:
        stream.close()
        await http.close()
        await grpc_.close()
    # with nothing left running, the exit does not wait for the 20 s exit timeout
    assert srv.wait(15) == 0, srv.log()
    assert time.monotonic() - ended < 10, "the drain waited for the exit timeout"


async def test_exit_timeout_cuts_off_unfinished_sequences(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, exit_timeout_s=1.0)
    cl = Client("grpc", srv)
    try:
        sid = new_int_id()
        assert await cl.step("accumulator", sid, 1, sequence_start=True) == 1
        a = np.ones((1, 4), dtype=np.float32)
        await cl("infer", "add_sub", [cl.input("INPUT0", a), cl.input("INPUT1", a)])
    finally:
        await cl.close()
    t0 = time.monotonic()
    srv.terminate()
    assert srv.wait(15) == 0, srv.log()
    elapsed = time.monotonic() - t0
    assert 0.8 < elapsed < 8, elapsed  # about the 1 s exit timeout (plus front-end grace)


# ------------------------------------------------------------------ hangs, signals, drain

STOPPING_FULL = "Server is stopping, scheduler for model has stopped accepting new inference requests"

# A sequence model whose execute never returns (an hour, as in issue 12): two slots on one
# instance, so a second sequence queues behind the hung batch.
HANG_CFG = """
name: "hang"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching { max_sequence_idle_microseconds: 60000000 direct { } }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
HANG_PY = """
import sys
import time

class Model:
    def execute(self, batch):
        print("hang: in execute", file=sys.stderr, flush=True)
        time.sleep(3600)
        return {"OUTPUT": batch.inputs["INPUT"]}
"""

# The accumulator, slowed down so that requests are in flight when the signal comes.
SLOW_CFG = """
name: "slow_acc"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  direct { }
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state { name: "zero" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
SLOW_PY = """
import time

class Model:
    def execute(self, batch):
        time.sleep(0.2)
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total, "SUM_OUT": total}
"""


@pytest.fixture
def drain_repo(tmp_path: Path) -> Path:
    repo = copy_demo_models(tmp_path / "models")
    write_model(repo, "hang", HANG_CFG, HANG_PY)
    write_model(repo, "slow_acc", SLOW_CFG, SLOW_PY)
    return repo


@contextlib.contextmanager
def _own_server(repo: Path, tmp_path: Path, *args: str, exit_timeout_s: float) -> Iterator[ServerProcess]:
    """A server whose exit (code, timing) the test checks itself; killed if it is still up."""
    srv = start_server(repo, *args, log_dir=tmp_path, exit_timeout_s=exit_timeout_s)
    try:
        yield srv
    finally:
        if srv.alive():
            srv.proc.kill()
            srv.proc.wait(5)


def _wait_log(srv: ServerProcess, pattern: str, count: int = 1, timeout: float = WAIT_S) -> list[str]:
    """Wait until the server log has `count` lines matching `pattern`; returns them."""
    rx = re.compile(pattern)

    def lines() -> list[str]:
        return [line for line in srv.log().splitlines() if rx.search(line)]

    wait_until_sync(lambda: len(lines()) >= count, f"the log has {count} x {pattern!r}\n{srv.log()}", timeout)
    return lines()


def _exit_code(srv: ServerProcess, within: float) -> tuple[int, float]:
    """Wait for the process to end (at most `within` s): its exit code and how long it took."""
    t0 = time.monotonic()
    try:
        rc = srv.proc.wait(within)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"server still running {within} s later\n{srv.log()}") from None
    return rc, time.monotonic() - t0


def _in_thread(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    fut = pool.submit(fn)
    pool.shutdown(wait=False)
    return fut


def _acc_doc(value: float, sequence_id: int | str, **params: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
        "parameters": {"sequence_id": sequence_id, **params},
    }


def test_hung_model_sigterm_exits_within_the_exit_timeout(drain_repo: Path, tmp_path: Path) -> None:
    """An execute that never returns: SIGTERM with --exit-timeout-secs 3 ends the process
    within 8 s, the log names the model and instance, and the requests waiting on the hung
    instance (the one in execute, and the sequence's next step queued behind it) get
    UNAVAILABLE instead of waiting forever."""
    with _own_server(drain_repo, tmp_path, exit_timeout_s=3.0) as srv:
        path = "/v2/models/hang/infer"
        first = _in_thread(lambda: http_request(srv, "POST", path, _acc_doc(1, 7, sequence_start=True)))
        _wait_log(srv, "hang: in execute")
        # queued behind the hung batch (a running sequence's step is accepted during the drain too)
        second = _in_thread(lambda: http_request(srv, "POST", path, _acc_doc(2, 7)))
        t0 = time.monotonic()
        srv.terminate()
        rc, _ = _exit_code(srv, 8.0)
        took = time.monotonic() - t0
        log = srv.log()
        assert took < 8.0, took
        assert rc == 1, log  # not a clean stop: a thread was left behind
        assert (
            "model 'hang' instance 'hang_0_0' did not return from execute within the exit timeout; exiting anyway"
        ) in log
        assert "exiting without waiting for model 'hang' instance 'hang_0_0'" in log
        r1 = first.result(timeout=WAIT_S)
        assert r1.status == 503, (r1.status, r1.body)
        assert "model 'hang' instance 'hang_0_0' did not return from execute within the exit timeout" in r1.error()
        r2 = second.result(timeout=WAIT_S)
        assert r2.status == 503, (r2.status, r2.body)
        assert "model 'hang' was unloaded before the request ran" in r2.error()


async def test_second_sigint_exits_at_once(tmp_path: Path) -> None:
    """The first SIGINT turns readiness false at once (HTTP, gRPC, model readiness) while a
    sequence is open, and the drain logs every second what is open and how long is left; a
    second SIGINT ends the process at once with 130."""
    with _own_server(DEMO_REPO, tmp_path, exit_timeout_s=30.0) as srv:
        grpc_ = Client("grpc", srv)
        try:
            sid = new_int_id()
            assert await grpc_.step("accumulator", sid, 1, sequence_start=True) == 1
            srv.proc.send_signal(signal.SIGINT)
            _wait_log(srv, r"received SIGINT: shutting down; draining 1 sequence and 0 requests \(up to 30 s")
            # readiness is false right away, with Triton's answers
            r = http_request(srv, "GET", "/v2/health/ready")
            assert (r.status, r.error()) == (503, "Server exiting")
            r = http_request(srv, "GET", "/v2/health/live")
            assert (r.status, r.error()) == (503, "Server exiting")
            r = http_request(srv, "GET", "/v2/models/accumulator/ready")
            assert (r.status, r.error()) == (503, "Server not ready")
            assert await grpc_("is_server_ready") is False
            assert await grpc_("is_model_ready", "accumulator") is False
            # the drain says every second what is still open and how long is left
            lines = _wait_log(srv, r"shutting down: 1 sequence and 0 requests still open .*; \d+ s left", count=2)
            left = [int(re.search(r"(\d+) s left", line).group(1)) for line in lines[:2]]  # type: ignore[union-attr]
            assert left[0] > left[1] and 25 <= left[1] <= 29, lines
            assert "'accumulator' version 1: 1 sequence, 0 requests" in lines[0]
            assert srv.alive()
            srv.proc.send_signal(signal.SIGINT)
            rc, took = _exit_code(srv, 3.0)
        finally:
            await grpc_.close()
        assert rc == 130, srv.log()
        assert took < 3.0, took
        assert "received SIGINT again: exiting at once with 1 sequence and 0 requests still open" in srv.log()


def test_second_sigterm_exits_with_143(tmp_path: Path) -> None:
    with _own_server(DEMO_REPO, tmp_path, exit_timeout_s=30.0) as srv:
        r = http_request(srv, "POST", "/v2/models/accumulator/infer", _acc_doc(1, 11, sequence_start=True))
        assert r.status == 200, r.body
        srv.terminate()
        _wait_log(srv, "received SIGTERM: shutting down")
        srv.terminate()
        rc, _ = _exit_code(srv, 3.0)
        assert rc == 143, srv.log()
        assert "received SIGTERM again: exiting at once" in srv.log()


async def test_drain_answers_stopping_and_finishes_running_sequences(tmp_path: Path) -> None:
    """During the drain: a model already retired (nothing of it was open) answers 503 with
    Triton's "Server is stopping" (never 404 "unknown model"), as do its metadata and a model
    that does not exist; a new sequence is refused; the open sequence's next steps and its END
    still run, HTTP replies close their connections, and the process then exits 0."""
    with _own_server(DEMO_REPO, tmp_path, exit_timeout_s=20.0) as srv:
        grpc_ = Client("grpc_aio", srv)
        try:
            sid = new_int_id()
            conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
            r = http_request(
                srv, "POST", "/v2/models/accumulator/infer", _acc_doc(5, sid, sequence_start=True), conn=conn
            )
            assert r.status == 200 and r.headers.get("connection") != "close"
            srv.terminate()
            _wait_log(srv, r"model 'add_sub' versions \[1\] stopped")  # retired: nothing of it was open
            a = np.ones((1, 4), dtype=np.float32)
            doc = {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": a.ravel().tolist()},
                    {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": a.ravel().tolist()},
                ]
            }
            for path, body in (
                ("/v2/models/add_sub/infer", doc),
                ("/v2/models/no_such_model/infer", doc),
            ):
                r = http_request(srv, "POST", path, body)
                assert (r.status, r.error()) == (503, STOPPING_FULL), path
                assert r.headers.get("connection") == "close"
            r = http_request(srv, "GET", "/v2/models/add_sub")
            assert (r.status, r.error()) == (503, STOPPING_FULL)
            await expect_error(
                grpc_("infer", "add_sub", [grpc_.input("INPUT0", a), grpc_.input("INPUT1", a)]),
                "StatusCode.UNAVAILABLE",
                STOPPING_FULL,
            )
            # new sequences are refused; the open one goes on to its END (on a fresh connection:
            # the server closed the keep-alive one after its reply)
            r = http_request(
                srv, "POST", "/v2/models/accumulator/infer", _acc_doc(1, new_int_id(), sequence_start=True)
            )
            assert (r.status, r.error()) == (503, STOPPING_FULL)
            r = http_request(srv, "POST", "/v2/models/accumulator/infer", _acc_doc(6, sid), conn=conn)
            assert r.status == 200 and raw_output(r) == [11.0]
            assert r.headers.get("connection") == "close"
            assert await grpc_.step("accumulator", sid, 7, sequence_end=True) == 18
            ended = time.monotonic()
            rc, _ = _exit_code(srv, 10.0)
        finally:
            await grpc_.close()
        assert rc == 0, srv.log()
        assert time.monotonic() - ended < 5, "the drain waited for the exit timeout"
        log = srv.log()
        assert "Exit timeout expired" not in log
        assert re.search(r"model 'accumulator' versions \[1\] stopped", log)


def _poll_health(srv: ServerProcess, stop: threading.Event) -> list[tuple[bool, int | str]]:
    """Health checks back to back on one keep-alive HTTPConnection (it reconnects when the
    server closes the connection) until the server is gone: (reused connection, status or
    error) for each."""
    seen: list[tuple[bool, int | str]] = []
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
    try:
        while not stop.is_set():
            reused = conn.sock is not None
            try:
                conn.request("GET", "/v2/health/ready")
                r = conn.getresponse()
                r.read()
            except (ConnectionError, http.client.HTTPException) as e:
                seen.append((reused, type(e).__name__))
                if not reused:  # the listener is gone (refused, or reset from its backlog)
                    return seen
                conn.close()
                continue
            seen.append((reused, r.status))
            if r.status == 503:
                assert r.getheader("connection") == "close"
    finally:
        conn.close()
    return seen


@pytest.mark.parametrize("http_server", ["builtin", "granian", "hypercorn"])
def test_in_flight_requests_get_their_answers(drain_repo: Path, tmp_path: Path, http_server: str) -> None:
    """Clients on keep-alive connections run sequences through a slow model, and SIGTERM comes
    while requests are in flight: every request gets an HTTP answer (the steps and ENDs of the
    running sequences succeed, new sequences get 503), none sees a connection reset; a client
    that polls health on a keep-alive connection through the whole shutdown only ever fails
    to connect, never on a connection the server had accepted."""
    with _own_server(drain_repo, tmp_path, "--http-server", http_server, exit_timeout_s=20.0) as srv:
        started = threading.Barrier(5)
        signalled = threading.Event()
        stop_polling = threading.Event()
        poller = _in_thread(lambda: _poll_health(srv, stop_polling))

        def client(k: int) -> list[tuple[str, int]]:
            seen: list[tuple[str, int]] = []
            conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
            path = "/v2/models/slow_acc/infer"
            sid = f"flight-{k}"
            total = 1.0

            def step(what: str, **params: Any) -> None:
                nonlocal total
                r = http_request(srv, "POST", path, _acc_doc(1, sid, **params), conn=conn)
                seen.append((what, r.status))
                total += 1
                assert r.status != 200 or raw_output(r) == [total], (what, r.body)

            try:
                r = http_request(srv, "POST", path, _acc_doc(1, sid, sequence_start=True), conn=conn)
                seen.append(("start", r.status))
                started.wait(WAIT_S)
                step("step")  # in flight when the signal comes
                step("step")
                signalled.wait(WAIT_S)
                r = http_request(srv, "POST", path, _acc_doc(1, f"{sid}-late", sequence_start=True))
                seen.append(("late start", r.status))
                step("step")
                step("end", sequence_end=True)
            finally:
                conn.close()
            return seen

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(client, k) for k in range(4)]
            started.wait(WAIT_S)  # every sequence is open; their next steps are being sent
            srv.terminate()
            _wait_log(srv, "received SIGTERM")
            signalled.set()
            results = [f.result(timeout=30) for f in futures]  # a reset would raise here
        for seen in results:
            assert seen == [
                ("start", 200),
                ("step", 200),
                ("step", 200),
                ("late start", 503),
                ("step", 200),
                ("end", 200),
            ], seen
        try:
            rc, _ = _exit_code(srv, 10.0)
        finally:
            stop_polling.set()
        assert rc == 0, srv.log()
        assert "Exit timeout expired" not in srv.log()
        polled = poller.result(timeout=WAIT_S)
        assert (True, 200) in polled and (False, 503) in polled, polled
        assert all(isinstance(status, int) for reused, status in polled if reused), polled


def test_hung_model_unload_is_bounded(tmp_path: Path) -> None:
    """Explicit unload of a model hung in execute returns within the exit timeout (the waiting
    request fails), the server keeps serving, and a later SIGTERM does not wait for the thread."""
    repo = tmp_path / "models"
    write_model(repo, "hang", HANG_CFG, HANG_PY)
    copy_demo_models(repo, "accumulator")
    with _own_server(
        repo, tmp_path, "--model-control-mode", "explicit", "--load-model", "*", exit_timeout_s=2.0
    ) as srv:
        first = _in_thread(
            lambda: http_request(srv, "POST", "/v2/models/hang/infer", _acc_doc(1, 3, sequence_start=True))
        )
        _wait_log(srv, "hang: in execute")
        t0 = time.monotonic()
        r = http_request(srv, "POST", "/v2/repository/models/hang/unload")
        assert r.status == 200, r.body
        assert time.monotonic() - t0 < 5
        assert (
            "model 'hang' instance 'hang_0_0' did not return from execute within the exit timeout; unloading anyway"
            in srv.log()
        )
        r1 = first.result(timeout=WAIT_S)
        assert r1.status == 503 and "did not return from execute" in r1.error()
        # the server goes on
        r = http_request(
            srv, "POST", "/v2/models/accumulator/infer", _acc_doc(2, 4, sequence_start=True, sequence_end=True)
        )
        assert r.status == 200 and raw_output(r) == [2.0]
        assert http_request(srv, "GET", "/v2/health/ready").status == 200
        srv.terminate()
        rc, _ = _exit_code(srv, 6.0)
        assert rc == 1, srv.log()
