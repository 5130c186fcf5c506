"""The asyncio side of one HTTP/2 connection: an ``asyncio.Protocol`` that feeds the sans-IO
``H2Connection`` what the socket reads, hands its events to the layer above (an
``EventHandler``), writes what it has to send once per loop turn, and owns the timers and
the reading and writing pauses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from seqserve.api.transport.h2_connection import H2Connection
from seqserve.api.transport.h2_events import Event
from seqserve.api.transport.h2_frames import INTERNAL_ERROR
from seqserve.api.transport.read_gate import ReadGate

log = logging.getLogger("seqserve.grpc")

#: after a GOAWAY and close, the longest the socket waits for the client to read what is left
CLOSE_TIMEOUT_S = 5.0


class EventHandler(Protocol):
    """The layer above one connection (the gRPC calls)."""

    def handle(self, events: Iterable[Event]) -> None:
        """Act on each event in turn: each before the next frame is handled."""

    def connection_made(self, transport: Any) -> None: ...

    def connection_lost(self) -> None:
        """The connection ended; the streams' resets were handled before."""

    def writable(self) -> None:
        """The transport takes writes again (its buffer drained below the low mark)."""


class H2Protocol(asyncio.Protocol):
    """One server connection. ``make_handler`` builds the layer above, given this protocol."""

    def __init__(
        self,
        make_handler: Callable[[H2Protocol], EventHandler],
        *,
        max_concurrent_streams: int,
        max_header_list_bytes: int,
        read_gate: ReadGate | None = None,
    ) -> None:
        """``read_gate``: the process's gate (a worker's), which pauses reading while closed."""
        self.loop = asyncio.get_running_loop()
        self.h2 = H2Connection(
            max_concurrent_streams=max_concurrent_streams,
            max_header_list_bytes=max_header_list_bytes,
            on_output=self._output,
            clock=self.loop.time,
        )
        self.transport: Any = None  # uvloop's transports are no asyncio.Transport subclasses
        self.opened = self.loop.time()
        self.write_paused = False
        self.write_paused_since: float | None = None
        self._closing = False  # the transport was told to close
        self._read_paused_by: set[str] = set()
        self._gate = read_gate
        self._turn_handle: asyncio.Handle | None = None
        self._abort_handle: asyncio.TimerHandle | None = None
        self.handler = make_handler(self)

    # ------------------------------------------------------------------------ transport

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.h2.initiate()
        transport.write(self.h2.data_to_send())
        self.handler.connection_made(transport)
        if self._gate is not None:
            self._gate.register(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._gate is not None:
            self._gate.unregister(self)
        h2 = self.h2
        h2.connection_lost()
        if self._turn_handle is not None:
            self._turn_handle.cancel()
        if self._abort_handle is not None:
            self._abort_handle.cancel()
        self.handler.handle(h2.take_events())
        self.handler.connection_lost()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading("write")
        self.write_paused_since = self.loop.time()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        self.write_paused = False
        self._resume_reading("write")
        self.handler.writable()

    def gate_closed(self) -> None:
        self._pause_reading("gate")

    def gate_opened(self) -> None:
        self._resume_reading("gate")

    @property
    def held_by_gate(self) -> bool:
        """Not read because the process's gate is closed: its silence is not the client's."""
        return "gate" in self._read_paused_by

    def _pause_reading(self, why: str) -> None:
        if not self._read_paused_by and not self.h2.closed:
            self.transport.pause_reading()
        self._read_paused_by.add(why)

    def _resume_reading(self, why: str) -> None:
        self._read_paused_by.discard(why)
        if not self._read_paused_by and not self.h2.closed:
            self.transport.resume_reading()

    def _output(self) -> None:
        """The connection has bytes to send: what is written during one turn of the loop goes
        out in one ``transport.write`` (one system call) at its end, so a batch's replies on
        a stream, or the replies of unary calls answered together, cost one send, not one
        each. Once the connection is closed (a GOAWAY queued), at once, and the socket closes."""
        if not self.h2.closed:
            self.loop.call_soon(self.flush)
            return
        if self._closing or self.transport is None:
            return
        self._closing = True
        data = self.h2.data_to_send()
        if data:
            self.transport.write(data)
        self.transport.close()
        # a client that reads nothing would keep the socket (and its streams) while the
        # transport waits to flush: it gets CLOSE_TIMEOUT_S
        self._abort_handle = self.loop.call_later(CLOSE_TIMEOUT_S, self.abort)

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.h2.closed:
            self.transport.write(data)

    def close(self, code: int, message: str = "") -> None:
        """GOAWAY with ``code``, then close once what is written is sent."""
        self.h2.close(code, message)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -------------------------------------------------------------------------- reading

    def data_received(self, data: bytes) -> None:
        h2 = self.h2
        h2.feed(data)
        if self._turn_handle is None:
            self._handle(h2.events())

    def _next_turn(self) -> None:
        self._turn_handle = None
        self._resume_reading("turn")
        self._handle(self.h2.events())

    def _handle(self, events: Iterable[Event]) -> None:
        h2 = self.h2
        try:
            self.handler.handle(events)
        except Exception:  # a bug: this connection ends, the server goes on
            log.exception("gRPC connection failed")
            h2.close(INTERNAL_ERROR, "internal error")
            return
        if h2.backlog:  # frames left for the next turn of the loop
            self._pause_reading("turn")
            self._turn_handle = self.loop.call_soon(self._next_turn)
