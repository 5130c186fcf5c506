"""The request-body deadline (api/http/body.py): a stalled client gets BodyTimeout, a read the
server itself holds (a worker's read gate closed: its rings are full) does not."""

from __future__ import annotations

import asyncio

import pytest

from seqserve.api.http.body import BodyTimeout, BodyWatch, read_body

TIMEOUT_S = 0.2


class StalledBody:
    """A body source whose client sends nothing until `send` is called."""

    def __init__(self, held: bool) -> None:
        self.held = held
        self.parts: asyncio.Queue[tuple[bytes, bool]] = asyncio.Queue()

    async def receive(self) -> tuple[bytes, bool] | None:
        return await self.parts.get()

    async def wait_disconnect(self) -> None:
        await asyncio.Event().wait()

    def send(self, data: bytes, more: bool) -> None:
        self.parts.put_nowait((data, more))


async def reading(source: StalledBody, watch: BodyWatch) -> asyncio.Task[bytes]:
    task = asyncio.get_running_loop().create_task(read_body(source, None, 1 << 20, watch))
    await asyncio.sleep(0)
    return task


async def test_a_stalled_client_times_out() -> None:
    task = await reading(StalledBody(held=False), BodyWatch(TIMEOUT_S))
    with pytest.raises(BodyTimeout):
        await asyncio.wait_for(task, 5 * TIMEOUT_S)


async def test_a_read_the_server_holds_does_not_time_out_and_its_clock_restarts_when_released() -> None:
    source, watch = StalledBody(held=True), BodyWatch(TIMEOUT_S)
    task = await reading(source, watch)
    await asyncio.sleep(4 * TIMEOUT_S)
    assert not task.done()  # held four deadlines long: the server's wait, not the client's
    source.held = False
    released = asyncio.get_running_loop().time()
    with pytest.raises(BodyTimeout):
        await asyncio.wait_for(task, 5 * TIMEOUT_S)
    # the deadline counts from the release (the watchdog's last tick before it), not from the
    # start of the read four deadlines earlier
    assert asyncio.get_running_loop().time() - released >= TIMEOUT_S - watch.tick
    assert not watch.reading and not watch.sources


async def test_a_held_read_completes_when_the_body_comes() -> None:
    source, watch = StalledBody(held=True), BodyWatch(TIMEOUT_S)
    task = await reading(source, watch)
    await asyncio.sleep(2 * TIMEOUT_S)
    source.send(b"ab", True)
    source.send(b"c", False)
    assert await asyncio.wait_for(task, 1.0) == b"abc"
    assert not watch.reading and not watch.sources
