"""The control channel between the engine process and one worker: a Unix socket pair carrying
length-prefixed frames, each one pickled message (both ends are this program, started by the
engine process). Calls (``call``) are answered by id; anything else is a one-way message.

Frames are parsed as they arrive, on the event loop's read callback. A side may take some
messages there (``on_message``): a worker applies the engine's snapshots and drain notices at
once, so a reply that comes back through the rings after the engine sent them is never written
before the worker knows (a reply read in the same turn of the loop resumes its handler in the
next one); the rest waits for ``receive``."""

from __future__ import annotations

import asyncio
import collections
import itertools
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any, cast

_LENGTH = struct.Struct("!I")
#: the largest frame either side accepts (a request too large for the rings travels here whole)
MAX_FRAME_BYTES = 1 << 31


class ChannelClosed(Exception):
    """The other process is gone (its end of the socket closed)."""


class Channel(asyncio.Protocol):
    """One end of a control channel, on this process's event loop."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._inbox: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed: str | None = None
        #: takes a message on the read callback (True: taken); the others go to ``receive``
        self.on_message: Callable[[Any], bool] | None = None

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        _, channel = await asyncio.get_running_loop().create_unix_connection(cls, sock=sock)
        return channel

    # ------------------------------------------------------------------------- protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        start = 0
        while len(buf) - start >= _LENGTH.size:
            (n,) = _LENGTH.unpack_from(buf, start)
            if n > MAX_FRAME_BYTES:
                self._end(f"frame of {n} bytes")
                if self._transport is not None:
                    self._transport.abort()
                return
            if len(buf) - start - _LENGTH.size < n:
                break
            body = start + _LENGTH.size
            with memoryview(buf) as view:  # released before the buffer is trimmed
                message = pickle.loads(view[body : body + n])
            start = body + n
            self._take(message)
        del buf[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(str(exc) if exc is not None else "the other process closed its end")

    def _take(self, message: Any) -> None:
        if type(message) is tuple and message and message[0] == "ret":
            fut = self._calls.get(message[1])
            if fut is not None and not fut.done():
                fut.set_result(message[2])
            return
        if self.on_message is not None and self.on_message(message):
            return
        self._inbox.append(message)
        self._wake()

    def _end(self, why: str) -> None:
        if self._closed is not None:
            return
        self._closed = why
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(ChannelClosed("the other process is gone"))
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ------------------------------------------------------------------------------ API

    def take_with(self, on_message: Callable[[Any], bool]) -> None:
        """Install ``on_message``, after running what waits for ``receive`` through it, in
        order (what it does not take keeps waiting)."""
        self.on_message = on_message
        waiting, self._inbox = self._inbox, collections.deque()
        for message in waiting:
            if not on_message(message):
                self._inbox.append(message)

    def send(self, message: Any) -> None:
        """Queue one message (frames are written in order)."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        t = self._transport
        if t is None or t.is_closing():
            return
        t.write(_LENGTH.pack(len(data)) + data)

    async def call(self, kind: str, payload: Any) -> Any:
        """Send a call and wait for its answer (``answer`` on the other side)."""
        if self._closed is not None:
            raise ChannelClosed("the other process is gone")
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        try:
            self.send(("call", call_id, kind, payload))
            return await fut
        finally:
            self._calls.pop(call_id, None)

    def answer(self, call_id: int, result: Any) -> None:
        self.send(("ret", call_id, result))

    async def receive(self) -> Any:
        """The next message that is neither an answer (answers resolve their calls) nor taken
        by ``on_message``; ChannelClosed at the end."""
        while not self._inbox:
            if self._closed is not None:
                raise ChannelClosed(self._closed)
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._inbox.popleft()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
