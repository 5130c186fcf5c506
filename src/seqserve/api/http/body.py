"""Reading an HTTP request body within its size limit and its deadline (slow or stalled clients)."""

from __future__ import annotations

import asyncio
from typing import Any

from seqserve.api.limits import TooLarge
from seqserve.api.transport.exchange import BodySource


class BodyTimeout(Exception):
    def __init__(self, secs: float) -> None:
        super().__init__(f"request body timed out: no data arrived for {secs:g} s")


class ClientGone(Exception):
    """The body ended early: the client disconnected, or (granian reports it the same way) its
    framing was malformed (a bad chunk size). Answered with 400, which a departed client
    never reads."""

    MESSAGE = "the request body ended early: the connection closed or its framing (chunks, Content-Length) is malformed"


class BodyWatch:
    """Times out request bodies that stop arriving with one watchdog task for all requests, not
    a timer each: a request registers while it reads its body (and notes each chunk); every
    ``tick`` the watchdog cancels the reads that made no progress for ``timeout_s``, which then
    raise BodyTimeout. So a 408 comes between ``timeout_s`` and ``timeout_s + tick``, and a body
    that arrives at once costs a dict entry, not a timer. The watchdog runs only while some
    request is reading.

    A read whose source says it is ``held`` (a worker process's connection that the server
    stopped reading: its rings to the engine are full) is waiting on the server, not the
    client, so its clock starts again when the server reads on (within one tick)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.tick = min(1.0, timeout_s / 4)
        self.reading: dict[asyncio.Task[Any], float] = {}  # task -> when it last made progress
        self.sources: dict[asyncio.Task[Any], BodySource] = {}
        self.expired: set[asyncio.Task[Any]] = set()
        self._watchdog: asyncio.Task[None] | None = None

    def begin(self, task: asyncio.Task[Any], now: float, source: BodySource | None = None) -> None:
        self.reading[task] = now
        if source is not None:
            self.sources[task] = source
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    def end(self, task: asyncio.Task[Any]) -> None:
        self.reading.pop(task, None)
        self.sources.pop(task, None)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.reading:
                await asyncio.sleep(self.tick)
                now = loop.time()
                stalled_since = now - self.timeout_s
                for task, since in list(self.reading.items()):
                    if getattr(self.sources.get(task), "held", False):
                        self.reading[task] = now  # the server is not reading: not the client's stall
                    elif since < stalled_since:
                        self.end(task)
                        self.expired.add(task)
                        task.cancel()  # at its only await while registered: receive()
        finally:
            self._watchdog = None

    def timed_out(self, task: asyncio.Task[Any]) -> bool:
        """After a CancelledError in ``task``'s read: whether it was the watchdog's (then the
        cancellation is withdrawn and the read ends with BodyTimeout)."""
        if task not in self.expired:
            return False
        self.expired.discard(task)
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        return True


async def read_body(source: BodySource, length: str | None, limit: int, watch: BodyWatch) -> bytes:
    """The whole request body from ``source``: TooLarge past ``limit`` (at once when the
    Content-Length says so), BodyTimeout when no data arrives for ``watch.timeout_s``,
    ClientGone on a disconnect."""
    if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
        raise TooLarge(int(length), limit)
    body = _Body(limit)
    task = asyncio.current_task()
    if task is None:  # not run by a task: a deadline per receive
        while True:
            try:
                got = await asyncio.wait_for(source.receive(), watch.timeout_s)
            except asyncio.TimeoutError:
                raise BodyTimeout(watch.timeout_s) from None
            if not body.add(got):
                return body.joined()
    loop = task.get_loop()
    watch.begin(task, loop.time(), source)
    try:
        while body.add(await source.receive()):
            watch.reading[task] = loop.time()  # the deadline is for progress
    except asyncio.CancelledError:
        if watch.timed_out(task):
            raise BodyTimeout(watch.timeout_s) from None
        raise
    finally:
        watch.end(task)
    return body.joined()


class _Body:
    """The chunks read so far, within the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.chunks: list[bytes] = []

    def add(self, got: tuple[bytes, bool] | None) -> bool:
        """Takes what one receive gave; whether more is to come (ClientGone on a disconnect)."""
        if got is None:
            raise ClientGone
        chunk, more = got
        if chunk:
            self.total += len(chunk)
            if self.total > self.limit:
                raise TooLarge(self.total, self.limit)
            self.chunks.append(chunk)
        return more

    def joined(self) -> bytes:
        return self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
