"""Scheduling through a real `seqserve serve` subprocess and tritonclient: the `priority` and
`timeout` request parameters over HTTP and gRPC reaching the dynamic batcher, the status codes of
"Exceeds maximum queue size", and the two brief configs (python backend) served over the gRPC
stream.

The scheduling server runs with TRITONSERVER_DELAY_SCHEDULER=N, so each model's first batch is
held until N requests are queued: batch composition does not depend on timing. Every test uses
its own model (the hold only applies to a model's first batch). Where the order in which requests
reach the server matters, they go in groups 1 s apart, on connections opened beforehand, or a
request waits for an earlier one's reply.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.support.clients import SyncStream
from tests.support.models import BRIEF_A_MODEL, BRIEF_B_IO, BRIEF_B_MODEL, python_brief, write_model
from tests.support.process import ServerProcess, serving

HOLD = 4  # TRITONSERVER_DELAY_SCHEDULER for the scheduling server
GAP_S = 1.0  # between groups of requests that must arrive in order: far beyond a send's latency

# Each row: OUT_X = IN_X, BATCH = how many batches this instance ran before this one.
BATCH_MODEL = """
import numpy as np

class Model:
    def initialize(self, ctx):
        self.batches = 0

    def execute(self, batch):
        x = batch.inputs["IN_X"]
        n = np.full(x.shape, self.batches, np.int32)
        self.batches += 1
        return {"OUT_X": x.copy(), "BATCH": n}
"""


def dyn_config(name: str, dyn: str, mbs: int = 2) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "IN_X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT_X" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ {dyn} }}
"""


PRIORITY = "priority_levels: 2 default_priority_level: 2"
TIMEOUT = "default_queue_policy { default_timeout_microseconds: 20000000 allow_timeout_override: true }"
QUEUE = "priority_levels: 2 default_priority_level: 2 priority_queue_policy { key: 1 value: { max_queue_size: 1 } }"
PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def sched_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("sched-repo")
    for proto in PROTOCOLS:
        write_model(repo, f"prio_{proto}", dyn_config(f"prio_{proto}", PRIORITY), BATCH_MODEL)
        write_model(repo, f"timeout_{proto}", dyn_config(f"timeout_{proto}", TIMEOUT, mbs=4), BATCH_MODEL)
        for rid in ("id", "noid"):
            name = f"qfull_{proto}_{rid}"
            write_model(repo, name, dyn_config(name, QUEUE, mbs=4), BATCH_MODEL)
    with serving(repo, log_dir=repo, env={"TRITONSERVER_DELAY_SCHEDULER": str(HOLD)}) as srv:
        yield srv


class Proto:
    """One aio tritonclient (HTTP or gRPC) with the bits these tests need."""

    def __init__(self, proto: str, srv: ServerProcess) -> None:
        self.proto = proto
        self.mod: Any = httpaio if proto == "http" else grpcaio
        self.client: Any = self.mod.InferenceServerClient(srv.http_url if proto == "http" else srv.grpc_url)

    def unavailable(self) -> str:
        return "503" if self.proto == "http" else "StatusCode.UNAVAILABLE"

    async def infer(self, model: str, value: int, **kwargs: Any) -> tuple[int, int]:
        inp = self.mod.InferInput("IN_X", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], np.int32))
        r = await self.client.infer(model, [inp], **kwargs)
        return int(r.as_numpy("OUT_X")[0, 0]), int(r.as_numpy("BATCH")[0, 0])

    async def warm(self, connections: int) -> None:
        """Open the client's connections: a request on a new one (TCP, and HTTP/2 for gRPC) is
        the slowest to arrive, and would blur the order in which requests reach the server."""
        await asyncio.gather(*(self.client.is_server_live() for _ in range(connections)))

    async def close(self) -> None:
        await self.client.close()


@pytest.fixture(params=PROTOCOLS)
async def proto(request: pytest.FixtureRequest, sched_server: ServerProcess) -> Any:
    p = Proto(request.param, sched_server)
    await p.warm(HOLD + 2)
    yield p
    await p.close()


async def in_order(*groups: list[Any]) -> list[Any]:
    """Start each group of coroutines together, GAP_S after the previous group, so that the
    groups reach the server in order; the results (or exceptions) of all, flattened."""
    started = []
    for k, group in enumerate(groups):
        if k:
            await asyncio.sleep(GAP_S)
        started += [asyncio.ensure_future(c) for c in group]
    return await asyncio.wait_for(asyncio.gather(*started, return_exceptions=True), 20)


def unavailable(e: Any, p: Proto, message: str) -> None:
    assert isinstance(e, InferenceServerException), e
    assert e.status() == p.unavailable(), (e.status(), e.message())
    assert e.message() == message


# ------------------------------------------------------------------- priority parameter


async def test_priority_parameter_orders_the_batches(proto: Proto) -> None:
    model = f"prio_{proto.proto}"
    got = await in_order(
        [proto.infer(model, 1), proto.infer(model, 2, priority=2)],  # default level (2), and 2
        [proto.infer(model, 3, priority=1), proto.infer(model, 4, priority=1)],
    )
    # (value, batch): the two level-1 requests form the first batch although they came last
    assert got == [(1, 1), (2, 1), (3, 0), (4, 0)]


# -------------------------------------------------------------------- timeout parameter


async def test_timeout_parameter_expires_queued_request(proto: Proto) -> None:
    model = f"timeout_{proto.proto}"
    # the first is held by the delay hook (GAP_S) beyond its 0.1 s timeout before the rest come
    first, *rest = await in_order(
        [proto.infer(model, 1, timeout=100_000, request_id="t-1")],  # µs
        [proto.infer(model, 2), proto.infer(model, 3, timeout=15_000_000), proto.infer(model, 4)],
    )
    unavailable(first, proto, "Request timeout expired")
    assert rest == [(2, 0), (3, 0), (4, 0)]  # a longer timeout than needed changes nothing


# ---------------------------------------------------------------- queue size and status


@pytest.mark.parametrize("with_id", [True, False], ids=["request_id", "no_request_id"])
async def test_exceeds_maximum_queue_size_status(proto: Proto, with_id: bool) -> None:
    model = f"qfull_{proto.proto}_{'id' if with_id else 'noid'}"
    rid = f"q-{secrets.token_hex(3)}" if with_id else ""
    queued = [
        asyncio.ensure_future(proto.infer(model, 1)),  # level 2: unlimited
        asyncio.ensure_future(proto.infer(model, 2, priority=1)),  # level 1: fills its queue of 1
    ]
    await asyncio.sleep(GAP_S)
    # refused at once: its reply comes before the rest are sent
    (refused,) = await asyncio.wait_for(
        asyncio.gather(proto.infer(model, 3, priority=1, request_id=rid), return_exceptions=True), 20
    )
    unavailable(refused, proto, f"[request id: {rid or '<id_unknown>'}] Exceeds maximum queue size")
    queued += [asyncio.ensure_future(proto.infer(model, v)) for v in (4, 5)]  # the 4th queued releases the hold
    got = await asyncio.wait_for(asyncio.gather(*queued), 20)
    assert got == [(1, 0), (2, 0), (4, 0), (5, 0)]
    # The queue has room again.
    assert await proto.infer(model, 6, priority=1) == (6, 1)


# ---------------------------------------------------------------- brief configs (gRPC stream)


@pytest.fixture(scope="module")
def brief_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("brief-repo")
    python_brief(repo, "lstm_from_brief_a", "my_lstm_model", BRIEF_A_MODEL)
    python_brief(repo, "rnn_from_brief_b", "rnn_model", BRIEF_B_MODEL, BRIEF_B_IO)
    with serving(repo, log_dir=repo) as srv:
        yield srv


def grpc_in(name: str, shape: list[int], value: float) -> Any:
    import tritonclient.grpc as grpcclient

    arr = np.zeros(shape, np.float32)
    arr.flat[0] = value
    inp = grpcclient.InferInput(name, shape, "FP32")
    inp.set_data_from_numpy(arr)
    return inp


def stream_steps(
    srv: ServerProcess, model: str, name: str, shape: list[int], out: str, steps: list[tuple[Any, float, bool, bool]]
) -> list[float]:
    """Send (id, value, start, end) steps over one stream, one at a time; the first output
    element of every reply."""
    stream = SyncStream(srv)
    got = []
    try:
        for k, (sid, value, start, end) in enumerate(steps):
            stream.send(
                model,
                [grpc_in(name, shape, value)],
                request_id=str(k),
                sequence_id=sid,
                sequence_start=start,
                sequence_end=end,
            )
            result, error = stream.get()
            assert error is None, error
            assert result.get_response().id == str(k)
            got.append(float(result.as_numpy(out).flat[0]))
    finally:
        stream.close()
    return got


def interleaved(ids: list[Any], values: list[list[float]]) -> tuple[list[tuple[Any, float, bool, bool]], list[float]]:
    steps, sums, expected = [], {}, []
    n = len(values[0])
    for k in range(n):
        for sid, vals in zip(ids, values, strict=True):
            sums[sid] = sums.get(sid, 0.0) + vals[k]
            steps.append((sid, vals[k], k == 0, k == n - 1))
            expected.append(sums[sid])
    return steps, expected


def test_brief_a_sequences_over_grpc_stream(brief_server: ServerProcess) -> None:
    steps, expected = interleaved([7, "lstm-a", 8], [[1, 2, 3], [10, 20, 30], [0.5, 0.25, 4]])
    got = stream_steps(brief_server, "my_lstm_model", "INPUT__0", [1, 128], "OUTPUT__0", steps)
    assert got == expected


def test_brief_b_sequences_over_grpc_stream(brief_server: ServerProcess) -> None:
    steps, expected = interleaved([11, "rnn-b"], [[1, 2, 3, 4], [5, 6, 7, 8]])
    got = stream_steps(brief_server, "rnn_model", "INPUT", [1, 1], "OUTPUT", steps)
    assert got == expected


def test_brief_b_generated_sequence_id_over_grpc_stream(brief_server: ServerProcess) -> None:
    # stateful_model_policy makes rnn_model a sequence model: a request without an id starts a
    # sequence under a generated id, returned as the `sequence_id` response parameter.
    stream = SyncStream(brief_server)
    try:
        stream.send("rnn_model", [grpc_in("INPUT", [1, 1], 2.0)], request_id="first")
        result, error = stream.get()
        assert error is None, error
        params = result.get_response().parameters
        assert "sequence_id" in params
        p = params["sequence_id"]
        sid = getattr(p, p.WhichOneof("parameter_choice"))
        assert sid
        assert float(result.as_numpy("OUTPUT")[0, 0]) == 2.0
        stream.send("rnn_model", [grpc_in("INPUT", [1, 1], 3.0)], sequence_id=sid, sequence_end=True)
        result, error = stream.get()
        assert error is None, error
        assert float(result.as_numpy("OUTPUT")[0, 0]) == 5.0
        # ended: the id needs START again
        stream.send("rnn_model", [grpc_in("INPUT", [1, 1], 1.0)], sequence_id=sid)
        result, error = stream.get()
        assert result is None and error is not None
        assert "must specify the START flag" in error.message()
    finally:
        stream.close()


def test_brief_configs_served_as_configured(brief_server: ServerProcess) -> None:
    # HTTP: the server's own JSON, extensions included (tritonclient's gRPC protos do not know
    # seqserve's extension fields, so its JSON conversion drops them).
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(brief_server.http_url)
    try:
        a = client.get_model_config("my_lstm_model")
        sb = a["sequence_batching"]
        assert sb["reusable_batch"] == {"max_size": 8, "candidate_batch_size": [4, 8]}
        (st,) = sb["state"]
        assert (st["name"], st["input_name"], st["output_name"]) == ("lstm_state",) * 3
        assert st["dims"] == [2, 1024]
        assert a["dynamic_batching"]["preferred_batch_size"] == [4, 8]  # default_batch_size 4 + max 8
        b = client.get_model_config("rnn_model")
        assert b["sequence_batching"]["max_sequence_idle_microseconds"] == 300_000_000
        assert b["model_transaction_policy"]["stateful_model_policy"]["timeout_action"] == "DESCRIBE"
    finally:
        client.close()
