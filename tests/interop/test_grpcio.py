"""grpcio's synchronous client (gRPC's C core: its own HTTP/2 and HPACK) against the builtin gRPC
server, at the edges: many metadata entries and one large one with a stream open beside the
call, gzip, 32 MiB messages, cancellation and deadlines. Every call checks its reply; a limit
one call hits must leave the other calls of the connection running."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from tests.support.checks import wait_until_sync
from tests.support.clients import new_int_id
from tests.support.interop import (
    LARGE_METADATA_BYTES,
    MAX_MESSAGE_BYTES,
    bytes_request,
    first_output,
    many_metadata,
    step_request,
    uc_stops,
    until_cancelled_request,
)
from tests.support.process import ServerProcess

CALL_TIMEOUT_S = 30.0
MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@pytest.fixture
def channel(interop: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(interop.grpc_url, options=MESSAGE_OPTIONS) as ch:
        yield ch


class OpenStream:
    """A ModelStreamInfer call whose requests are sent one at a time (`step`)."""

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub, **call: object) -> None:
        self.requests: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
        self.call = stub.ModelStreamInfer(iter(self.requests.get, None), **call)

    def send(self, request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        self.requests.put(request)
        reply: pb.ModelStreamInferResponse = next(self.call)
        assert reply.error_message == "", reply.error_message
        return reply

    def close(self) -> None:
        self.requests.put(None)
        assert list(self.call) == []


class RunningSum:
    """An accumulator sequence on an open stream, its sum checked at every step."""

    def __init__(self, stream: OpenStream) -> None:
        self.stream, self.seq, self.total, self.steps = stream, new_int_id(), 0.0, 0

    def step(self, value: float, end: bool = False) -> None:
        self.total += value
        reply = self.stream.send(step_request(self.seq, value, start=self.steps == 0, end=end))
        self.steps += 1
        assert first_output(reply.infer_response) == [self.total]


@pytest.mark.parametrize(
    "entries",
    [60, 120],
)
def test_many_metadata_entries(channel: grpc.Channel, entries: int) -> None:
    """The call is served, and a sequence streaming on the same connection carries on."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    stream = OpenStream(stub, timeout=CALL_TIMEOUT_S)
    running = RunningSum(stream)
    running.step(1.0)
    reply, call = stub.ServerLive.with_call(pb.ServerLiveRequest(), metadata=many_metadata(entries), timeout=10)
    assert reply.live and call.code() == grpc.StatusCode.OK
    running.step(2.0, end=True)
    stream.close()


def test_large_metadata_value_fails_that_call_alone(channel: grpc.Channel) -> None:
    """A 30 KiB value (over the advertised header list size): RESOURCE_EXHAUSTED, not a GOAWAY
    that the client would see as UNAVAILABLE (and retry); the stream beside it and the next
    call on the connection are served."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    stream = OpenStream(stub, timeout=CALL_TIMEOUT_S)
    running = RunningSum(stream)
    running.step(1.0)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ServerLive(pb.ServerLiveRequest(), metadata=[("x-large", "a" * LARGE_METADATA_BYTES)], timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    running.step(2.0, end=True)
    stream.close()
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


def test_gzip_both_ways(interop: ServerProcess) -> None:
    """A channel that compresses every request (grpc-encoding: gzip) with 4 MiB that gzip shrinks."""
    payload = b"seqserve " * ((4 << 20) // 9)
    with grpc.insecure_channel(interop.grpc_url, options=MESSAGE_OPTIONS, compression=grpc.Compression.Gzip) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        reply = stub.ModelInfer(bytes_request(payload), timeout=CALL_TIMEOUT_S)
        seq = new_int_id()
        step = stub.ModelInfer(step_request(seq, 5.0, start=True, end=True), timeout=CALL_TIMEOUT_S)
    assert reply.raw_output_contents[0][4:] == payload
    assert first_output(step) == [5.0]


def test_32_mib_messages(channel: grpc.Channel) -> None:
    """A 32 MiB request and its 32 MiB reply (the server runs with 64 MiB message limits)."""
    payload = bytes(range(256)) * (32 << 20 >> 8)
    reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(bytes_request(payload), timeout=CALL_TIMEOUT_S)
    assert len(reply.raw_output_contents[0]) == 4 + len(payload)
    assert reply.raw_output_contents[0][4:] == payload


def test_cancelled_stream_stops_the_model(interop: ServerProcess, channel: grpc.Channel) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    before = len(uc_stops(interop))
    stream = OpenStream(stub, timeout=CALL_TIMEOUT_S)
    stream.send(until_cancelled_request())
    for _ in range(3):
        assert next(stream.call).error_message == ""
    stream.call.cancel()
    with pytest.raises(grpc.RpcError) as ended:
        next(stream.call)
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    wait_until_sync(lambda: len(uc_stops(interop)) > before, timeout=CALL_TIMEOUT_S, what="uc to stop")
    assert "cancelled=True" in uc_stops(interop)[-1]
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


def test_deadline_ends_the_stream_and_the_model(interop: ServerProcess, channel: grpc.Channel) -> None:
    """A stream with a 1 s deadline to a model that never ends by itself: DEADLINE_EXCEEDED for the
    client, and the server cancels the request (grpc-timeout)."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    before = len(uc_stops(interop))
    stream = OpenStream(stub, timeout=1.0)
    stream.send(until_cancelled_request())
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream.call:
            pass
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until_sync(lambda: len(uc_stops(interop)) > before, timeout=CALL_TIMEOUT_S, what="uc to stop")
    assert "cancelled=True" in uc_stops(interop)[-1]
    seq = new_int_id()
    reply = stub.ModelInfer(step_request(seq, 1.0, start=True, end=True), timeout=CALL_TIMEOUT_S)
    assert first_output(reply) == [1.0]
