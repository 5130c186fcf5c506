"""Replicas sharing a state store, as real `seqserve serve` processes over HTTP (tritonclient
with the Inference-Session-Id header, and plain sequence_id requests): a sequence started on A
continues on B after A drains (SIGTERM), a live owner hands a sequence over, idle sequences
spill and come back, a step that still reaches a draining replica gets 503 + Retry-After, and
two replicas racing for one released sequence lose no step. Running sums of the demo
accumulator make any lost or doubled step visible."""

from __future__ import annotations

import http.client
import json
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.clients import new_int_id, new_str_id, session_step
from tests.support.process import ServerProcess

pytest.importorskip("seqserve.engine.replicas.checkpoint", reason="needs the engine's checkpoint API")

Launch = Callable[..., ServerProcess]


@pytest.fixture(params=["redis", "dir"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    return f"dir://{tmp_path}/store"


def replica(launch: Launch, store: str, name: str, *flags: str, exit_timeout_s: float = 5.0) -> ServerProcess:
    return launch(None, "--state-store", store, "--replica-id", name, *flags, exit_timeout_s=exit_timeout_s)


def infer(
    srv: ServerProcess, x: float, *, session: str | None = None, sequence_id: int | str = 0, start: bool = False
) -> float:
    """One accumulator step through tritonclient HTTP: the running sum."""
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[x]], np.float32))
        headers = {"Inference-Session-Id": session} if session else None
        result = client.infer("accumulator", [inp], headers=headers, sequence_id=sequence_id, sequence_start=start)
        return float(result.as_numpy("OUTPUT").reshape(-1)[0])
    finally:
        client.close()


def raw_infer(srv: ServerProcess, x: float, session: str) -> tuple[int, dict[str, str], Any]:
    """The same step as a raw request: status, headers (lower case) and body."""
    r = session_step(srv, session, x)
    return r.status, r.headers, json.loads(r.body or b"null")


def live_count(srv: ServerProcess, model: str = "accumulator") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
    try:
        conn.request("GET", f"/v2/models/{model}/sequences")
        return int(json.loads(conn.getresponse().read())["total"])
    finally:
        conn.close()


def test_sequences_continue_on_another_replica_after_sigterm(launch: Launch, store_url: str) -> None:
    a = replica(launch, store_url, "A")
    b = replica(launch, store_url, "B")
    sessions = [new_str_id() for _ in range(3)]
    ids = [new_int_id() for _ in range(3)]
    sums = {k: 0.0 for k in [*sessions, *ids]}
    for step in range(1, 6):
        for s in sessions:
            sums[s] += step
            assert infer(a, step, session=s) == sums[s]
        for i in ids:
            sums[i] += step
            assert infer(a, step, sequence_id=i, start=step == 1) == sums[i]
    assert a.stop() == 0, a.log()
    assert "handed off" in a.log()
    for step in range(6, 9):
        for s in sessions:
            sums[s] += step
            assert infer(b, step, session=s) == sums[s]
        for i in ids:
            sums[i] += step
            assert infer(b, step, sequence_id=i) == sums[i]
    # a sequence nobody knows still gets Triton's START error
    with pytest.raises(Exception, match="must specify the START flag"):
        infer(b, 1.0, sequence_id=new_int_id())


def test_live_owner_hands_over(launch: Launch, store_url: str) -> None:
    a = replica(launch, store_url, "A")
    b = replica(launch, store_url, "B")
    s, i = new_str_id(), new_int_id()
    assert infer(a, 1, session=s) == 1
    assert infer(a, 1, sequence_id=i, start=True) == 1
    time.sleep(0.3)  # the registrations reach the store in the background
    assert infer(b, 2, session=s) == 3  # B asks A; A lets go between two steps
    assert infer(b, 2, sequence_id=i) == 3
    assert infer(a, 3, session=s) == 6  # and back
    assert infer(b, 4, session=s) == 10


def test_idle_sequences_spill_and_come_back(launch: Launch, store_url: str) -> None:
    a = replica(launch, store_url, "A", "--spill-idle-secs", "0.3")
    sessions = [new_str_id() for _ in range(20)]  # more than the accumulator's 16 slots
    for s in sessions:
        assert infer(a, 1, session=s) == 1
        time.sleep(0.03)
    deadline = time.monotonic() + 10
    while live_count(a) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_count(a) == 0
    for s in sessions:
        assert infer(a, 2, session=s) == 3


def test_draining_replica_answers_503_with_retry_after(launch: Launch, store_url: str) -> None:
    a = replica(launch, store_url, "A", exit_timeout_s=4.0)
    b = replica(launch, store_url, "B")
    s = new_str_id()
    assert infer(a, 5, session=s) == 5
    # a sequence of a model that keeps its own state holds A's drain open (until its exit timeout)
    client = httpclient.InferenceServerClient(a.http_url)
    inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[1]], np.float32))
    client.infer("accumulator_corrid", [inp], sequence_id=new_int_id(), sequence_start=True)
    client.close()
    a.terminate()
    total = 5.0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        status, headers, body = raw_infer(a, 1, s)
        if status == 503:
            break
        # a step that reaches A before its SIGTERM is handled is served, and handed off with the rest
        assert status == 200, (status, body)
        total += 1
        time.sleep(0.05)
    assert status == 503, (status, body)
    assert int(headers["retry-after"]) >= 1
    # refused before the core while its sequences leave, then as a stopped model: a retry either way
    assert "leaving this replica" in body["error"] or "Server is stopping" in body["error"], body
    assert infer(b, 1, session=s) == total + 1  # where the balancer retries it
    assert a.wait() == 0, a.log()


def test_two_replicas_race_for_one_released_sequence(launch: Launch, store_url: str) -> None:
    a = replica(launch, store_url, "A")
    b = replica(launch, store_url, "B")
    c = replica(launch, store_url, "C")
    s = new_str_id()
    assert infer(a, 1, session=s) == 1
    assert a.stop() == 0, a.log()
    with ThreadPoolExecutor(2) as pool:
        got = sorted(pool.map(lambda srv_x: infer(srv_x[0], srv_x[1], session=s), [(b, 10.0), (c, 100.0)]))
    # both steps ran, once each, one after the other on whoever held the sequence then
    assert got in ([11.0, 111.0], [101.0, 111.0]), got


def grpc_step(
    client: grpcclient.InferenceServerClient, x: float, *, session: str | None = None, sequence_id: int = 0
) -> float:
    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[x]], np.float32))
    headers = {"inference-session-id": session} if session else None
    result = client.infer("accumulator", [inp], headers=headers, sequence_id=sequence_id)
    return float(result.as_numpy("OUTPUT").reshape(-1)[0])


def stream_steps(srv: ServerProcess, sequence_id: int, xs: list[float], *, start: bool) -> list[float]:
    """Steps of one sequence on one gRPC stream (ModelStreamInfer), sent back to back."""
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        for n, x in enumerate(xs):
            inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[x]], np.float32))
            client.async_stream_infer("accumulator", [inp], sequence_id=sequence_id, sequence_start=start and n == 0)
        out = []
        for _ in xs:
            got = results.get(timeout=20)
            if isinstance(got, Exception):
                raise got
            out.append(float(got.as_numpy("OUTPUT").reshape(-1)[0]))
        return out
    finally:
        client.stop_stream()
        client.close()


def test_grpc_sessions_and_streams_move(launch: Launch, store_url: str) -> None:
    a = replica(launch, store_url, "A")
    b = replica(launch, store_url, "B")
    s, i = new_str_id(), new_int_id()
    ca = grpcclient.InferenceServerClient(a.grpc_url)
    assert grpc_step(ca, 1, session=s) == 1
    assert grpc_step(ca, 2, session=s) == 3
    ca.close()
    assert stream_steps(a, i, [1, 2, 3], start=True) == [1, 3, 6]
    assert a.stop() == 0, a.log()
    cb = grpcclient.InferenceServerClient(b.grpc_url)
    assert grpc_step(cb, 3, session=s) == 6
    cb.close()
    # a stream to B continues the sequence: its first step waits for the store, the ones behind it
    # queue in order
    assert stream_steps(b, i, [4, 5, 6], start=False) == [10, 15, 21]
