"""grpclib (a pure-Python gRPC on the h2 library, sharing no code with grpcio or seqserve)
against the builtin gRPC server: unary and streaming sequence steps with Triton's sequence
parameters, every running sum checked, sequences interleaved on one connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from seqserve._proto import grpc_service_pb2 as pb
from tests.support.clients import new_int_id
from tests.support.interop import first_output, method_path, step_request
from tests.support.process import ServerProcess
from tests.support.tools import require_python_module

CALL_TIMEOUT_S = 30.0


@pytest.fixture
async def channel(interop: ServerProcess) -> AsyncIterator[Any]:
    require_python_module("grpclib", install="pip install -e '.[test]'")
    from grpclib.client import Channel

    ch = Channel("127.0.0.1", interop.grpc_port)
    yield ch
    ch.close()


def model_infer(channel: Any) -> Any:
    from grpclib.client import UnaryUnaryMethod

    return UnaryUnaryMethod(channel, method_path("ModelInfer"), pb.ModelInferRequest, pb.ModelInferResponse)


def model_stream_infer(channel: Any) -> Any:
    from grpclib.client import StreamStreamMethod

    return StreamStreamMethod(
        channel, method_path("ModelStreamInfer"), pb.ModelInferRequest, pb.ModelStreamInferResponse
    )


async def test_health_and_metadata(channel: Any) -> None:
    from grpclib.client import UnaryUnaryMethod

    live = UnaryUnaryMethod(channel, method_path("ServerLive"), pb.ServerLiveRequest, pb.ServerLiveResponse)
    assert (await live(pb.ServerLiveRequest(), timeout=CALL_TIMEOUT_S, metadata={"x-interop": "grpclib"})).live
    meta = UnaryUnaryMethod(channel, method_path("ModelMetadata"), pb.ModelMetadataRequest, pb.ModelMetadataResponse)
    reply = await meta(pb.ModelMetadataRequest(name="accumulator"), timeout=CALL_TIMEOUT_S)
    assert [t.name for t in reply.inputs] == ["INPUT"] and [t.name for t in reply.outputs] == ["OUTPUT"]


async def test_unary_sequences_side_by_side(channel: Any) -> None:
    """Eight sequences of twelve steps at once on one connection, each sum checked."""
    infer = model_infer(channel)

    async def run(seq: int) -> float:
        total = 0.0
        for i in range(1, 13):
            total += i
            reply = await infer(step_request(seq, i, start=i == 1, end=i == 12), timeout=CALL_TIMEOUT_S)
            assert first_output(reply) == [total], (seq, i)
        return total

    assert await asyncio.gather(*(run(new_int_id()) for _ in range(8))) == [78.0] * 8


async def test_stream_sequences(channel: Any) -> None:
    """Two sequences interleaved on one ModelStreamInfer stream: each reply follows its request."""
    first, second = new_int_id(), new_int_id()
    sums = {first: 0.0, second: 0.0}
    async with model_stream_infer(channel).open(timeout=CALL_TIMEOUT_S) as stream:
        for i in range(1, 9):
            for seq, scale in ((first, 1.0), (second, 10.0)):
                sums[seq] += scale * i
                await stream.send_message(step_request(seq, scale * i, start=i == 1, end=i == 8))
                reply = await stream.recv_message()
                assert reply is not None and reply.error_message == "", reply
                assert first_output(reply.infer_response) == [sums[seq]]
        await stream.end()
        assert await stream.recv_message() is None
    assert sums == {first: 36.0, second: 360.0}


async def test_refused_call_leaves_the_connection_working(channel: Any) -> None:
    from grpclib.const import Status
    from grpclib.exceptions import GRPCError

    infer = model_infer(channel)
    with pytest.raises(GRPCError) as refused:
        await infer(pb.ModelInferRequest(model_name="nope"), timeout=CALL_TIMEOUT_S)
    assert refused.value.status == Status.NOT_FOUND
    seq = new_int_id()
    reply = await infer(step_request(seq, 2.0, start=True, end=True), timeout=CALL_TIMEOUT_S)
    assert first_output(reply) == [2.0]
