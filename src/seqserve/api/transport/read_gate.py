"""A gate over the reading of every connection of a process. A front-end worker process
(``serve --workers N``) closes it while its request ring or slab pool is full
(api/workers/ring_client.py): its connections stop reading, so their clients' TCP windows fill
and they stop sending, rather than the worker reading requests it cannot pass on. It opens once
the requests read so far are all on the ring. One process has no gate (``None``) and its
servers never check one.

A connection registers while it is open and is told when the gate closes or opens; it combines
that with its own reasons to pause (a full write buffer, frames left for the next turn)."""

from __future__ import annotations

import time
from typing import Protocol


class GatedConnection(Protocol):
    def gate_closed(self) -> None:
        """Stop reading (until ``gate_opened``)."""

    def gate_opened(self) -> None:
        """Read again, unless the connection has its own reason not to."""


class ReadGate:
    """Open, or closed with every registered connection paused. Counts its closings and the
    time spent closed (the worker's metrics)."""

    __slots__ = ("_closed_at", "_connections", "closed_s", "closings")

    def __init__(self) -> None:
        self._connections: set[GatedConnection] = set()
        self._closed_at: float | None = None
        self.closings = 0
        self.closed_s = 0.0  # over the closings that ended

    @property
    def is_open(self) -> bool:
        return self._closed_at is None

    @property
    def connections(self) -> int:
        return len(self._connections)

    def register(self, conn: GatedConnection) -> None:
        self._connections.add(conn)
        if self._closed_at is not None:
            conn.gate_closed()

    def unregister(self, conn: GatedConnection) -> None:
        self._connections.discard(conn)

    def close(self) -> None:
        if self._closed_at is not None:
            return
        self._closed_at = time.monotonic()
        self.closings += 1
        for conn in list(self._connections):
            conn.gate_closed()

    def open(self) -> None:
        if self._closed_at is None:
            return
        self.closed_s += time.monotonic() - self._closed_at
        self._closed_at = None
        for conn in list(self._connections):
            conn.gate_opened()

    def closed_for(self) -> float:
        """Seconds closed in all, the current closing included."""
        now = 0.0 if self._closed_at is None else time.monotonic() - self._closed_at
        return self.closed_s + now
