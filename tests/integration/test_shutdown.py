"""SIGTERM drains: new sequences get UNAVAILABLE, running ones finish (unary HTTP and gRPC and
the gRPC stream), then the process exits 0; a sequence that never ends is cut off at
--exit-timeout-secs."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tests.integration._util import (
    Client,
    SyncStream,
    expect_error,
    grpc_input,
    http_request,
    new_int_id,
    new_str_id,
)
from tests.integration.conftest import ServerProcess

STOPPING = "Server is stopping"


def _wait_not_ready(srv: ServerProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_request(srv, "GET", "/v2/health/ready").status != 200:
            return
        time.sleep(0.02)
    raise AssertionError("server still ready after SIGTERM")


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
