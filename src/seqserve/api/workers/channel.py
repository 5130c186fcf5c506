"""The control channel between the engine process and one worker: a Unix socket pair carrying
length-prefixed frames, each one pickled message (both ends are this program, started by the
engine process). Calls (``call``) are answered by id; anything else is a one-way message."""

from __future__ import annotations

import asyncio
import itertools
import pickle
import socket
import struct
from typing import Any

_LENGTH = struct.Struct("!I")
#: the largest frame either side accepts (a request too large for the rings travels here whole)
MAX_FRAME_BYTES = 1 << 31


class ChannelClosed(Exception):
    """The other process is gone (its end of the socket closed)."""


class Channel:
    """One end of a control channel, on this process's event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[Any]] = {}

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer)

    def send(self, message: Any) -> None:
        """Queue one message (frames are written in order)."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if self._writer.is_closing():
            return
        self._writer.write(_LENGTH.pack(len(data)) + data)

    async def call(self, kind: str, payload: Any) -> Any:
        """Send a call and wait for its answer (``answer`` on the other side)."""
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
        """The next message that is not an answer (answers resolve their calls);
        ChannelClosed at the end."""
        while True:
            try:
                head = await self._reader.readexactly(_LENGTH.size)
                (n,) = _LENGTH.unpack(head)
                if n > MAX_FRAME_BYTES:
                    raise ChannelClosed(f"frame of {n} bytes")
                message = pickle.loads(await self._reader.readexactly(n))
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                self._fail()
                raise ChannelClosed(str(e)) from None
            if type(message) is tuple and message and message[0] == "ret":
                fut = self._calls.get(message[1])
                if fut is not None and not fut.done():
                    fut.set_result(message[2])
                continue
            return message

    def _fail(self) -> None:
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(ChannelClosed("the other process is gone"))

    def close(self) -> None:
        self._writer.close()
