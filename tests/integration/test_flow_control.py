"""Flow control against a real `seqserve serve` with real tritonclient clients: the bound on
backlogged sequences (HTTP 503 + Retry-After, gRPC UNAVAILABLE), cancellation when a client
goes away (HTTP disconnect, gRPC stream closed), stream-scoped sequences, completion-order
stream replies, the stall line, and the idle clock that waits for the START's answer.

Each server gets a one-slot accumulator (`acc1`) whose idle timeout is long enough that only
the behaviour under test frees a slot. States that matter are reached through what a client can
observe (a reply, a refusal, a statistic, a log line), never by sleeping and hoping.
"""

from __future__ import annotations

import http.client
import json
import queue
import select
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.clients import acc_input, http_request, raw_output
from tests.support.models import write_model
from tests.support.process import under_workers

ACC_MODEL = """
class Model:
    def execute(self, batch):
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total, "SUM_OUT": total}
"""


def acc_config(name: str, *, slots: int = 1, idle_us: int = 60_000_000, instances: int = 1) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {slots}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  direct {{ }}
  state [ {{
    input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }}
  }} ]
}}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "models"
    write_model(r, "acc1", acc_config("acc1"), ACC_MODEL)
    write_model(r, "acc2", acc_config("acc2", slots=2), ACC_MODEL)
    write_model(r, "acc_idle", acc_config("acc_idle", idle_us=2_000_000), ACC_MODEL)
    return r


# ------------------------------------------------------------------------------- helpers


def cancelled_message(model: str, seq_id: int) -> str:
    return f"sequence {seq_id} of model '{model}' was cancelled: a request of the sequence was cancelled before it ran"


def full_message(model: str, n: int) -> str:
    return (
        f"the backlog of model '{model}' is full: {n} sequences are waiting for a slot (max_backlog_sequences {n}); "
        "retry later"
    )


def start_error(model: str, seq_id: int) -> str:
    return (
        f"inference request for sequence {seq_id} to model '{model}' must specify the START flag on the first "
        "request of the sequence"
    )


def grpc_input(value: float) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return inp


def http_step(srv: Any, model: str, seq_id: int, value: float = 1.0, **params: Any) -> Any:
    """One raw HTTP step; returns the RawResponse."""
    body = {"inputs": [acc_input(value)], "parameters": {"sequence_id": seq_id, **params}}
    return http_request(srv, "POST", f"/v2/models/{model}/infer", body)


def until(pred: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def failures(srv: Any, model: str) -> int:
    doc = http_request(srv, "GET", f"/v2/models/{model}/stats").json()
    return int(doc["model_stats"][0]["inference_stats"]["fail"]["count"])


class Stream:
    """tritonclient.grpc start_stream with headers; replies (request id, value or error) in a queue."""

    def __init__(self, srv: Any, headers: dict[str, str] | None = None) -> None:
        self.client = grpcclient.InferenceServerClient(srv.grpc_url)
        self.replies: queue.Queue[tuple[str, float | None, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=partial(self._callback, self.replies), headers=headers)
        self.closed = False

    @staticmethod
    def _callback(q: queue.Queue[Any], result: Any, error: Any) -> None:
        if error is not None:
            q.put(("", None, error))
        else:
            rid = result.get_response().id
            q.put((rid, float(result.as_numpy("OUTPUT")[0, 0]), None))

    def send(self, model: str, rid: str, seq_id: int, value: float = 1.0, **kwargs: Any) -> None:
        self.client.async_stream_infer(model, [grpc_input(value)], request_id=rid, sequence_id=seq_id, **kwargs)

    def get(self, timeout: float = 10.0) -> tuple[str, float | None, InferenceServerException | None]:
        return self.replies.get(timeout=timeout)

    def cancel(self) -> None:
        """Close the stream at once (the client goes away), without waiting for replies."""
        if not self.closed:
            self.closed = True
            self.client.stop_stream(cancel_requests=True)
            self.client.close()


@pytest.fixture
def streams() -> Iterator[Callable[..., Stream]]:
    opened: list[Stream] = []

    def _open(srv: Any, headers: dict[str, str] | None = None) -> Stream:
        s = Stream(srv, headers)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.cancel()


COMPLETION = {"seqserve-reply-order": "completion"}


def park_in_backlog(stream: Stream, model: str, running: int, waiting: int) -> None:
    """START `waiting` on a completion-order stream and wait until it sits in the backlog: a
    step of the `running` sequence sent after it comes back first."""
    stream.send(model, "park", waiting, 0.0, sequence_start=True)
    stream.send(model, "probe", running, 0.0)
    rid, _, err = stream.get()
    assert (rid, err) == ("probe", None)


# ------------------------------------------------------------------- admission control


def test_full_backlog_is_refused_with_503_and_unavailable(launch, repo, streams):
    srv = launch(repo, "--max-backlog-sequences", "1")
    assert http_step(srv, "acc1", 1, sequence_start=True).status == 200  # holds the only slot
    park_in_backlog(streams(srv, COMPLETION), "acc1", running=1, waiting=2)
    # HTTP: 503, Retry-After, and a message that names the model and the bound
    r = http_step(srv, "acc1", 3, sequence_start=True)
    assert (r.status, r.headers.get("retry-after"), r.error()) == (503, "1", full_message("acc1", 1))
    with pytest.raises(InferenceServerException) as ei:
        httpclient.InferenceServerClient(srv.http_url).infer(
            "acc1", [_http_input(1.0)], sequence_id=4, sequence_start=True
        )
    assert (ei.value.status(), ei.value.message()) == ("503", full_message("acc1", 1))
    # gRPC unary: UNAVAILABLE
    with pytest.raises(InferenceServerException) as ei:
        grpcclient.InferenceServerClient(srv.grpc_url).infer(
            "acc1", [grpc_input(1.0)], sequence_id=5, sequence_start=True
        )
    assert (ei.value.status(), ei.value.message()) == ("StatusCode.UNAVAILABLE", full_message("acc1", 1))
    # requests of the running sequence go on
    assert raw_output(http_step(srv, "acc1", 1, 2.0)) == [3.0]


def _http_input(value: float) -> httpclient.InferInput:
    inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return inp


# ------------------------------------------------------------------------ cancellation


def test_http_disconnect_cancels_a_backlogged_start(launch, repo):
    srv = launch(repo)
    assert http_step(srv, "acc1", 1, sequence_start=True).status == 200  # holds the only slot
    start = _send(srv, "acc1", 2, 5.0, sequence_start=True)  # waits in the backlog
    # A step of sequence 2 is refused at once until its START is in the backlog, then joins it.
    while True:
        probe = _send(srv, "acc1", 2, 3.0)
        if not select.select([probe.sock], [], [], 1.0)[0]:
            break  # queued behind the START
        r = probe.getresponse()
        assert (r.status, json.loads(r.read())["error"]) == (400, start_error("acc1", 2))
    start.close()  # the client goes away: its backlogged sequence is cancelled, the probe with it
    probe.sock.settimeout(10)
    r = probe.getresponse()
    assert (r.status, json.loads(r.read())["error"]) == (400, cancelled_message("acc1", 2))
    # the backlog is empty: when 1 ends, a new sequence takes the slot at once
    assert http_step(srv, "acc1", 1, sequence_end=True).status == 200
    r2 = http_step(srv, "acc1", 4, 7.0, sequence_start=True)
    assert (r2.status, raw_output(r2)) == (200, [7.0])
    assert http_step(srv, "acc1", 2, 1.0).error() == start_error("acc1", 2)


def _send(srv: Any, model: str, seq_id: int, value: float, **params: Any) -> http.client.HTTPConnection:
    """Send one infer request on a new connection without reading the reply."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    body = json.dumps({"inputs": [acc_input(value)], "parameters": {"sequence_id": seq_id, **params}})
    conn.request("POST", f"/v2/models/{model}/infer", body=body, headers={"Content-Type": "application/json"})
    return conn


def test_closed_stream_cancels_its_backlogged_start(launch, repo, streams):
    srv = launch(repo, "--max-backlog-sequences", "1")
    assert http_step(srv, "acc1", 1, sequence_start=True).status == 200
    stream = streams(srv, COMPLETION)
    park_in_backlog(stream, "acc1", running=1, waiting=2)
    refused = failures(srv, "acc1")
    stream.cancel()
    until(lambda: failures(srv, "acc1") == refused + 1, "the backlogged START to be cancelled")
    assert http_step(srv, "acc1", 1, sequence_end=True).status == 200
    r = http_step(srv, "acc1", 3, 4.0, sequence_start=True)
    assert (r.status, raw_output(r)) == (200, [4.0])


# ------------------------------------------------------------------ stream-scoped sequences


@pytest.mark.parametrize(
    ("flags", "headers", "scoped"),
    [
        (("--stream-scoped-sequences",), None, True),
        ((), {"seqserve-stream-scoped": "true"}, True),
        (("--stream-scoped-sequences",), {"seqserve-stream-scoped": "false"}, False),
        ((), None, False),
    ],
    ids=["server-flag", "header", "header-opts-out", "default"],
)
def test_stream_scoped_sequences_end_with_their_stream(launch, repo, streams, flags, headers, scoped):
    srv = launch(repo, *flags)
    stream = streams(srv, headers)
    stream.send("acc2", "a", 1, 1.0, sequence_start=True)
    assert stream.get()[2] is None
    if scoped:
        stream.cancel()
        until(lambda: http_step(srv, "acc2", 1, 0.0).status == 400, "sequence 1 to end")
        assert http_step(srv, "acc2", 1, 0.0).error() == start_error("acc2", 1)
        t0 = time.monotonic()  # its slot is free: two new sequences run at once
        assert http_step(srv, "acc2", 3, sequence_start=True).status == 200
        assert http_step(srv, "acc2", 4, sequence_start=True).status == 200
        assert time.monotonic() - t0 < 2.0
    else:
        # a scoped probe stream, closed after the stream under test: once its sequence has
        # ended, the server has (in practice) handled the first close too
        probe = streams(srv, {"seqserve-stream-scoped": "true"})
        probe.send("acc2", "b", 2, 1.0, sequence_start=True)
        assert probe.get()[2] is None
        stream.cancel()
        probe.cancel()
        until(lambda: http_step(srv, "acc2", 2, 0.0).status == 400, "the probe's sequence to end")
        r = http_step(srv, "acc2", 1, 2.0)
        assert (r.status, raw_output(r)) == (200, [3.0])  # lives on until its END or idle timeout


def test_bad_stream_header_is_refused(launch, repo, streams):
    srv = launch(repo)
    stream = streams(srv, {"seqserve-reply-order": "sideways"})  # refused as it opens
    _, _, err = stream.get()
    assert err is not None and err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "header 'seqserve-reply-order' must be 'request' or 'completion', got 'sideways'" in err.message()


# --------------------------------------------------------------------- reply order, stalls


def _stream_order(srv: Any, stream: Stream) -> list[str]:
    stream.send("acc1", "start-1", 1, 1.0, sequence_start=True)
    stream.send("acc1", "start-2", 2, 10.0, sequence_start=True)  # backlogged behind 1
    stream.send("acc1", "step-1", 1, 1.0)
    stream.send("acc1", "end-1", 1, 1.0, sequence_end=True)  # frees the slot for 2
    got = [stream.get() for _ in range(4)]
    assert all(err is None for _, _, err in got), got
    assert {rid: v for rid, v, _ in got} == {"start-1": 1.0, "start-2": 10.0, "step-1": 2.0, "end-1": 3.0}
    return [rid for rid, _, _ in got]


def test_replies_keep_request_order_by_default(launch, repo, streams):
    srv = launch(repo)
    assert _stream_order(srv, streams(srv)) == ["start-1", "start-2", "step-1", "end-1"]


def test_completion_order_header(launch, repo, streams):
    srv = launch(repo)
    assert _stream_order(srv, streams(srv, COMPLETION)) == ["start-1", "step-1", "end-1", "start-2"]


@pytest.mark.skipif(
    under_workers(), reason="a worker's stall line cannot ask the engine's slot table (no backlog note)"
)
def test_stalled_stream_is_logged(launch, repo, streams):
    srv = launch(repo)
    stream = streams(srv)
    stream.send("acc1", "start-1", 1, 1.0, sequence_start=True)
    assert stream.get()[0] == "start-1"
    stream.send("acc1", "start-2", 2, 1.0, sequence_start=True)  # waits in the backlog ...
    stream.send("acc1", "step-1", 1, 1.0)  # ... and holds back this reply, ready at once
    until(lambda: "gRPC stream stalled" in srv.log(), "the stall line", timeout=10.0)
    line = next(line for line in srv.log().splitlines() if "gRPC stream stalled" in line)
    assert "the reply to request 'start-2' to model 'acc1' (sequence 2, START, waiting in the backlog" in line
    assert "has held back 1 later replies" in line
    assert "'seqserve-reply-order: completion'" in line
    stream.send("acc1", "end-1", 1, 1.0, sequence_end=True)  # frees the slot: everything flows
    assert [stream.get()[0] for _ in range(3)] == ["start-2", "step-1", "end-1"]


# -------------------------------------------------------------------------- idle clock


def test_wait_in_the_backlog_does_not_count_as_idle(launch, repo):
    # acc_idle: one slot, 2 s idle timeout. Sequence 2's START waits in the backlog for 3 s
    # while sequence 1 keeps the slot busy; once answered, a step 0.3 s later (far more than
    # Triton's 50 ms grace, well under the limit) must still find the sequence.
    srv = launch(repo)
    assert http_step(srv, "acc_idle", 1, sequence_start=True).status == 200
    waiting: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: waiting.update(r=http_step(srv, "acc_idle", 2, 5.0, sequence_start=True)), daemon=True
    )
    t.start()
    for _ in range(6):  # 3 s of steps keep 1 alive
        time.sleep(0.5)
        assert http_step(srv, "acc_idle", 1).status == 200
    assert "r" not in waiting  # still waiting in the backlog
    assert http_step(srv, "acc_idle", 1, sequence_end=True).status == 200
    t.join(10)
    assert raw_output(waiting["r"]) == [5.0]
    time.sleep(0.3)  # the client thinks
    r = http_step(srv, "acc_idle", 2, 1.0)
    assert (r.status, raw_output(r)) == (200, [6.0])


# ------------------------------------------------------------------------ acceptance


def test_acceptance_bounded_backlog_and_stream_scoped_sequences(launch, streams):
    # 1000 STARTs on one stream to the demo accumulator (16 slots): 16 run, 64 wait in the
    # backlog, the rest are refused at once. When the stream closes, its sequences end and its
    # backlogged ones are dropped, so 16 fresh sequences from another client start within 2 s.
    # The stream asks for completion order: in request order the refusals would sit behind
    # the backlogged STARTs' replies.
    srv = launch(None, "--max-backlog-sequences", "64", "--stream-scoped-sequences")
    stream = streams(srv, COMPLETION)
    for i in range(1000):
        stream.send("accumulator", f"r{i}", 10_000 + i, 1.0, sequence_start=True)
    ok = refused = 0
    while ok + refused < 1000 - 64:
        _, _, err = stream.get(timeout=30)
        if err is None:
            ok += 1
        else:
            assert err.message() == full_message("accumulator", 64), err.message()
            refused += 1
    assert (ok, refused) == (16, 920)
    assert refused >= 900

    def metrics() -> str:  # refreshed every --metrics-interval-ms
        with urllib.request.urlopen(srv.metrics_url, timeout=10) as r:
            return str(r.read().decode())

    full = 'seqserve_sequence_backlog_full_total{model="accumulator",version="1"} 920'
    until(lambda: full in metrics().splitlines(), "the refusals in the metrics")
    assert 'seqserve_sequence_backlog{model="accumulator",version="1"} 64' in metrics().splitlines()
    stream.cancel()
    # Another client starts 16 sequences. It may get there before the server has seen the
    # stream close: a START refused for the full backlog is retried, as Retry-After suggests
    # (sooner here), within the same 2 s.
    t0 = time.monotonic()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    results: queue.Queue[tuple[int, Any, Any]] = queue.Queue()

    def start(i: int) -> None:
        client.async_infer(
            "accumulator",
            [grpc_input(float(i))],
            partial(lambda q, i, result, error: q.put((i, result, error)), results, i),
            sequence_id=20_000 + i,
            sequence_start=True,
            client_timeout=10,
        )

    for i in range(16):
        start(i)
    sums: dict[int, float] = {}
    retries = 0
    while len(sums) < 16:
        i, result, error = results.get(timeout=10)
        if error is not None:
            assert "is full" in error.message(), error.message()
            retries += 1
            time.sleep(0.02)
            start(i)
            continue
        sums[i] = float(result.as_numpy("OUTPUT")[0, 0])
    elapsed = time.monotonic() - t0
    client.close()
    assert sums == {i: float(i) for i in range(16)}
    assert elapsed < 2.0, f"fresh sequences took {elapsed:.2f} s ({retries} refused STARTs retried)"
