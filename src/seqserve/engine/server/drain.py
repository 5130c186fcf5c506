"""Shutdown: the drain of open sequences and requests, bounded by the exit timeout, with
progress logs; with a state store, the handoff of sequences to other replicas and the linger
while requests still arrive."""

from __future__ import annotations

import asyncio
import logging
import time

from seqserve.engine.replicas.coordinator import ReplicaCoordinator
from seqserve.engine.server.models import ModelTable

log = logging.getLogger("seqserve.server")

#: Triton's answer (UNAVAILABLE) to the health checks once the server is exiting
SERVER_EXITING = "Server exiting"

#: after a drain with a state store, how long no request must have come before the front-ends
#: stop (a balancer's health checks see the replica not ready within about a second), and the
#: longest wait for that (still bounded by the exit timeout)
LINGER_QUIET_S = 0.5
LINGER_CAP_S = 5.0

#: what a request refused during the drain is told to wait before it tries another replica
#: (only with a state store: its sequences went on elsewhere)
REPLICA_RETRY_AFTER_S = 1.0


class Drain:
    """The shutdown of one server's model table. Event-loop only."""

    def __init__(self, table: ModelTable) -> None:
        self.table = table
        self._replicas: ReplicaCoordinator | None = None
        self._started = False
        self._deadline: float | None = None  # time.monotonic() when the drain ends

    def attach(self, replicas: ReplicaCoordinator) -> None:
        """With a state store: sequences go to other replicas at the shutdown, and the
        front-ends linger while requests still come (``linger_while_requested``)."""
        self._replicas = replicas

    def started(self) -> None:
        """The server finished starting: it is live until the shutdown begins."""
        self._started = True

    @property
    def live(self) -> bool:
        return self._started and self._deadline is None

    @property
    def exiting(self) -> bool:
        """The shutdown has begun (``begin_shutdown``)."""
        return self._deadline is not None

    @property
    def deadline(self) -> float | None:
        """When the drain ends (time.monotonic()); None until the shutdown begins."""
        return self._deadline

    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """See ``Server.begin_shutdown``. Idempotent."""
        if self._deadline is not None:
            return
        self._deadline = time.monotonic() + (self.table.exit_timeout_s if timeout_s is None else timeout_s)
        self.table.close(retry_after_s=None if self._replicas is None else REPLICA_RETRY_AFTER_S)
        if self._replicas is not None:  # sequences with implicit state move to the shared store
            self._replicas.begin_drain(self._deadline)

    def open_work(self) -> tuple[int, int, list[str]]:
        """See ``Server.open_work``."""
        sequences = requests = 0
        details = []
        for m in self.table.loaded():
            seq = m.inflight_sequences if m.is_sequence else 0
            req = m.open_requests
            if seq or req:
                sequences += seq
                requests += req
                details.append(f"'{m.name}' version {m.version}: {_count(seq, 'sequence')}, {_count(req, 'request')}")
        return sequences, requests, details

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """See ``Server.shutdown``."""
        self.begin_shutdown(timeout_s)
        deadline = self._deadline
        assert deadline is not None
        progress = asyncio.create_task(self._log_progress(deadline), name="seqserve-shutdown-progress")
        try:
            await self.table.stop_polling()
            if await self.table.retire_all(deadline):
                log.warning("Exit timeout expired. Exiting immediately.")
            if self._replicas is not None:  # the handoffs' writes reach the store, then it closes
                await self._replicas.finish(deadline)
        finally:
            progress.cancel()
        await self.table.remove_uploads()

    async def linger_while_requested(self, quiet_s: float = LINGER_QUIET_S, cap_s: float = LINGER_CAP_S) -> None:
        """See ``Server.linger_while_requested``."""
        if self._replicas is None:
            return
        start = time.monotonic()
        end = start + cap_s
        if self._deadline is not None:
            end = min(end, self._deadline)
        while (now := time.monotonic()) < end:
            quiet_since = max(start, self.table.last_refusal_at)
            if now - quiet_since >= quiet_s:
                return
            await asyncio.sleep(min(quiet_s - (now - quiet_since), end - now) + 0.01)
        log.info("requests still arrived %.1f s after the drain; stopping the front-ends anyway", cap_s)

    async def _log_progress(self, deadline: float) -> None:
        while True:
            await asyncio.sleep(1.0)
            sequences, requests, details = self.open_work()
            left = max(deadline - time.monotonic(), 0.0)
            log.info(
                "shutting down: %s and %s still open%s; %.0f s left",
                _count(sequences, "sequence"),
                _count(requests, "request"),
                f" ({'; '.join(details)})" if details else "",
                left,
            )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
