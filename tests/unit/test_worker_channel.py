"""The control channel between the engine and a worker: frames in order, calls answered by id,
messages taken on the read callback (``on_message``, ``take_with``) and the end of the peer."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from seqserve.api.workers.channel import MAX_FRAME_BYTES, Channel, ChannelClosed


async def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    return await Channel.open(a), await Channel.open(b)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


async def test_messages_arrive_in_order_and_calls_are_answered() -> None:
    engine, worker = await _pair()
    big = b"x" * (1 << 20)  # a frame larger than one read
    for message in (("a", 1), ("big", big), ("c", 3)):
        worker.send(message)
    assert [await engine.receive() for _ in range(3)] == [("a", 1), ("big", big), ("c", 3)]

    async def answer() -> None:
        kind, call_id, what, payload = await engine.receive()
        assert (kind, what) == ("call", "double")
        engine.answer(call_id, payload * 2)

    task = asyncio.create_task(answer())
    assert await worker.call("double", 21) == 42
    await task


async def test_on_message_takes_messages_as_they_are_read_and_take_with_keeps_order() -> None:
    engine, worker = await _pair()
    engine.send(("snapshot", 1))
    engine.send(("stop",))
    engine.send(("snapshot", 2))
    await _settle()
    taken: list[Any] = []

    def take(message: Any) -> bool:
        if message[0] != "snapshot":
            return False
        taken.append(message[1])
        return True

    worker.take_with(take)  # what waited goes through it first, in order
    assert taken == [1, 2]
    engine.send(("snapshot", 3))
    await _settle()
    assert taken == [1, 2, 3]  # applied on the read callback: nobody called receive
    assert await worker.receive() == ("stop",)


async def test_the_peer_going_away_ends_receive_and_pending_calls() -> None:
    engine, worker = await _pair()
    call = asyncio.create_task(worker.call("never", None))
    await engine.receive()
    engine.close()
    with pytest.raises(ChannelClosed):
        await call
    with pytest.raises(ChannelClosed):
        await worker.receive()


async def test_a_frame_over_the_bound_ends_the_channel() -> None:
    a, b = socket.socketpair()
    channel = await Channel.open(b)
    a.sendall(struct.pack("!I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ChannelClosed, match="frame of"):
        await asyncio.wait_for(channel.receive(), 5)
    a.close()
