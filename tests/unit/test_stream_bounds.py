"""The front-ends' bounds of issue 24, without sockets: a stream's temporary refusals written at
once (not held in request order), its read bound, the connection caps per peer address, the
listener's handshake filter."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.grpc.stream import StreamSession, StreamStats
from seqserve.api.limits import ConnectionAdmission, peer_host
from seqserve.api.transport.listener import accept_queue_length, refuse_new_handshakes
from seqserve.engine import Code, InferenceError, InferRequest, InferResult, OrderedRelease

FULL = "the backlog of model 'm' is full: 1 sequences are waiting for a slot (max_backlog_sequences 1); retry later"


class _Server:
    """A Server stand-in: model "full" refuses every request as a full backlog does (at once, or
    with ``later`` through the callback, as a state store's arrivals do); others are held until
    the test answers them."""

    def __init__(self, *, later: bool = False) -> None:
        self.later = later
        self.submitted: dict[str, Callable[[Any, bool], None]] = {}

    def model(self, name: str, version: str) -> Any:
        return SimpleNamespace(decoupled=False)

    def enqueue_streaming(
        self, request: InferRequest, on_response: Callable[[Any, bool], None], *, model: Any = None
    ) -> Callable[[], None]:
        if request.model == "full":
            refusal = InferenceError(Code.UNAVAILABLE, FULL, retry_after_s=1.0)
            if not self.later:
                raise refusal
            asyncio.get_running_loop().call_soon(on_response, refusal, True)
        self.submitted[request.id] = on_response
        return _nothing


def _nothing() -> None:
    pass


async def _replies(session: StreamSession, n: int) -> list[pb.ModelStreamInferResponse]:
    out: list[Any] = []
    while len(out) < n:
        batch = await asyncio.wait_for(session.next_replies(), 1)
        assert batch is not None
        out += batch
    return [pb.ModelStreamInferResponse.FromString(r) for r in out]


@pytest.mark.parametrize("later", [False, True])
async def test_temporary_refusals_overtake_the_replies_in_line(later: bool) -> None:
    server = _Server(later=later)
    stats = StreamStats()
    session = StreamSession(server, grpc_errors=False, stats=stats)  # type: ignore[arg-type]
    session.submit(pb.ModelInferRequest(model_name="m", id="head"))  # waits (a START in the backlog)
    session.submit(pb.ModelInferRequest(model_name="full", id="r1"))
    session.submit(pb.ModelInferRequest(model_name="m", id="next"))
    session.submit(pb.ModelInferRequest(model_name="full", id="r2"))
    refused = await _replies(session, 2)
    assert [r.infer_response.id for r in refused] == ["r1", "r2"]
    assert [r.error_message for r in refused] == [f"[request id: r1] {FULL}", f"[request id: r2] {FULL}"]
    assert stats.refused_at_once == 2
    server.submitted["next"](InferResult("m", "1", "next", {}), True)
    server.submitted["head"](InferResult("m", "1", "head", {}), True)
    assert [r.infer_response.id for r in await _replies(session, 2)] == ["head", "next"]  # in order still
    session.close()


async def test_completion_order_refusals_keep_their_message() -> None:
    session = StreamSession(_Server(), grpc_errors=False, completion_order=True)  # type: ignore[arg-type]
    session.submit(pb.ModelInferRequest(model_name="full", id="r1"))
    (reply,) = await _replies(session, 1)
    assert reply.error_message == FULL and reply.infer_response.id == "r1"
    session.close()


async def test_a_stream_reads_no_further_than_its_backlog() -> None:
    """With 3 requests unanswered the stream stops reading; a reply written lets one more in."""
    server = _Server()
    stats = StreamStats()
    session = StreamSession(server, grpc_errors=False, stats=stats, max_backlog=3)  # type: ignore[arg-type]
    reads = 0

    async def read() -> object:
        nonlocal reads
        reads += 1
        return pb.ModelInferRequest(model_name="m", id=str(reads)).SerializeToString()

    session.start_calls(read)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(server.submitted) == 3 and stats.reading_paused == 1
    server.submitted["1"](InferResult("m", "1", "1", {}), True)
    assert len(await _replies(session, 1)) == 1
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(server.submitted) == 4 and stats.reading_paused == 2
    session.drain("done")
    session.close()


def test_ordered_release_withdraw() -> None:
    released: list[str] = []
    order: OrderedRelease[Any] = OrderedRelease(lambda s: released.append(s.outcome))
    a, b, c = (SimpleNamespace(outcome=None) for _ in range(3))
    for s in (a, b, c):
        order.add(s)
    order.withdraw(c)  # the last: O(1)
    b.outcome = "b"
    order.withdraw(a)  # the head: what waited behind it and is known goes out
    assert released == ["b"] and len(order) == 0


def test_connection_admission_per_peer_and_total() -> None:
    caps = ConnectionAdmission(max_total=4, max_per_peer=2)
    assert [caps.admit("10.0.0.1") for _ in range(3)] == [None, None, "peer"]
    assert caps.admit("10.0.0.2") is None and caps.admit(None) is None  # unknown: the total only
    assert caps.admit("10.0.0.3") == "total"
    assert caps.admit("10.0.0.3", stopping=True) == "stopping"
    caps.release("10.0.0.1")
    assert caps.admit("10.0.0.1") is None
    assert caps.refused == {"total": 1, "peer": 1, "stopping": 1}
    assert caps.total == 4 and caps.by_peer == {"10.0.0.1": 2, "10.0.0.2": 1}
    assert "at most 2 per client" in caps.refusal_message("peer")
    assert "at most 4 at once" in caps.refusal_message("total")
    unbounded = ConnectionAdmission(max_total=10, max_per_peer=0)
    assert all(unbounded.admit("10.0.0.1") is None for _ in range(10))
    assert peer_host(("::1", 5, 0, 0)) == "::1" and peer_host("") is None


def test_listener_drops_new_handshakes_but_keeps_its_queue() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port))
    try:
        assert accept_queue_length(listener) == 1
        assert refuse_new_handshakes(listener)
        late = socket.socket()
        late.settimeout(0.3)
        with pytest.raises(TimeoutError):  # its SYN is dropped
            late.connect(("127.0.0.1", port))
        late.close()
        accepted, _ = listener.accept()
        queued.sendall(b"request")
        accepted.settimeout(5)
        assert accepted.recv(16) == b"request"
        assert accept_queue_length(listener) == 0
        accepted.close()
    finally:
        queued.close()
        listener.close()
