"""grpcio's asyncio client (grpc.aio) against the builtin gRPC server: the edges of
test_grpcio.py with calls running at the same time on one channel, as an async service makes
them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from tests.support.checks import wait_until
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
async def stub(interop: ServerProcess) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    async with grpc.aio.insecure_channel(interop.grpc_url, options=MESSAGE_OPTIONS) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


async def stream_sequence(
    stub: pb_grpc.GRPCInferenceServiceStub, steps: int, midway: asyncio.Event, resume: asyncio.Event
) -> float:
    """A running sum on a ModelStreamInfer stream, every sum checked, that sets `midway` after
    half its steps and then waits for `resume` (set once the other call is over)."""
    call: Any = stub.ModelStreamInfer(timeout=CALL_TIMEOUT_S)
    seq, total = new_int_id(), 0.0
    for i in range(1, steps + 1):
        if i == steps // 2 + 1:
            midway.set()
            await resume.wait()
        total += i
        await call.write(step_request(seq, i, start=i == 1, end=i == steps))
        reply = await call.read()
        assert reply.error_message == "", reply.error_message
        assert first_output(reply.infer_response) == [total]
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    return total


async def beside_a_stream(stub: pb_grpc.GRPCInferenceServiceStub, metadata: list[tuple[str, str]]) -> Any:
    """A ServerLive call with `metadata`, made while a sequence streams on the same channel; the
    stream must finish (sum 55) whatever the call's fate. The call's outcome: its reply or error."""
    midway, resume = asyncio.Event(), asyncio.Event()
    streaming = asyncio.create_task(stream_sequence(stub, 10, midway, resume))
    await asyncio.wait_for(midway.wait(), CALL_TIMEOUT_S)
    try:
        outcome: Any = await stub.ServerLive(pb.ServerLiveRequest(), metadata=metadata, timeout=10)
    except grpc.aio.AioRpcError as e:
        outcome = e
    resume.set()
    assert await streaming == 55.0
    return outcome


@pytest.mark.parametrize(
    "entries",
    [60, 120],
)
async def test_many_metadata_entries(stub: pb_grpc.GRPCInferenceServiceStub, entries: int) -> None:
    outcome = await beside_a_stream(stub, many_metadata(entries))
    assert isinstance(outcome, pb.ServerLiveResponse) and outcome.live, outcome


async def test_large_metadata_value_fails_that_call_alone(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    outcome = await beside_a_stream(stub, [("x-large", "a" * LARGE_METADATA_BYTES)])
    assert isinstance(outcome, grpc.aio.AioRpcError), outcome
    assert outcome.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome.details()
    assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)).live


async def test_gzip_and_32_mib_at_once(interop: ServerProcess) -> None:
    """A gzip channel carrying a 32 MiB message while small calls run beside it."""
    payload = bytes(range(256)) * (32 << 20 >> 8)
    async with grpc.aio.insecure_channel(
        interop.grpc_url, options=MESSAGE_OPTIONS, compression=grpc.Compression.Gzip
    ) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        seqs = [new_int_id() for _ in range(4)]
        large, *small = await asyncio.gather(
            stub.ModelInfer(bytes_request(payload), timeout=CALL_TIMEOUT_S),
            *(stub.ModelInfer(step_request(s, 3.0, start=True, end=True), timeout=CALL_TIMEOUT_S) for s in seqs),
        )
    assert large.raw_output_contents[0][4:] == payload
    assert [first_output(r) for r in small] == [[3.0]] * 4


async def test_cancelled_stream_stops_the_model(interop: ServerProcess, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    before = len(uc_stops(interop))
    call: Any = stub.ModelStreamInfer(timeout=CALL_TIMEOUT_S)
    await call.write(until_cancelled_request())
    for _ in range(3):
        assert (await call.read()).error_message == ""
    assert call.cancel()
    assert call.cancelled()
    await wait_until(lambda: len(uc_stops(interop)) > before, "uc stops", timeout=CALL_TIMEOUT_S)
    assert "cancelled=True" in uc_stops(interop)[-1]
    assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)).live


async def test_deadline_ends_the_stream_and_the_model(
    interop: ServerProcess, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    before = len(uc_stops(interop))
    call: Any = stub.ModelStreamInfer(timeout=1.0)
    await call.write(until_cancelled_request())
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        while await call.read() != grpc.aio.EOF:
            pass
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_until(lambda: len(uc_stops(interop)) > before, "uc stops", timeout=CALL_TIMEOUT_S)
    assert "cancelled=True" in uc_stops(interop)[-1]


async def test_unary_deadline_shorter_than_the_call(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """A 32 MiB call with a 1 ms deadline ends DEADLINE_EXCEEDED; the channel serves the next call."""
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await stub.ModelInfer(bytes_request(bytes(32 << 20)), timeout=0.001)
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    seq = new_int_id()
    assert first_output(await stub.ModelInfer(step_request(seq, 7.0, start=True, end=True), timeout=10)) == [7.0]
