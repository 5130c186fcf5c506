"""Shutdown: the drain of open sequences and requests, bounded by the exit timeout,
with progress logs, and the retirement of models (hung executors left behind)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seqserve.engine.handoff import Handoff
from seqserve.engine.server_state import (
    MIN_CLOSE_WAIT_S,
    ModelState,
    _count,
    log,
)
from seqserve.engine.uploads import UploadDirs

#: after a drain with a state store, how long no request must have come before the front-ends
#: stop (a balancer's health checks see the replica not ready within about a second), and the
#: longest wait for that (still bounded by the exit timeout)
LINGER_QUIET_S = 0.5
LINGER_CAP_S = 5.0


class Drain:
    """Part of ``Server``; see ``seqserve.engine.server``."""

    # Server's state and methods that this part uses (for type checkers; set in Server.__init__)
    if TYPE_CHECKING:
        _control_lock: asyncio.Lock
        _models: dict[str, ModelState]
        _uploads: UploadDirs
        _exiting: bool
        _live: bool
        _poll_task: asyncio.Task[None] | None
        _shutdown_deadline: float | None
        exit_timeout_s: float
        last_refusal_at: float
        hung_instances: list[tuple[str, str]]
        _handoff: Handoff | None

    async def _retire(
        self, state: ModelState, timeout_s: float | None = None, *, deadline: float | None = None
    ) -> bool:
        """Let running sequences finish (bounded), then stop the model. The bound is ``deadline``
        (a time.monotonic()), or ``timeout_s`` (default: exit_timeout_s) from now; it bounds the
        wait for the executors too (at least MIN_CLOSE_WAIT_S): an instance still in execute
        then is left behind and its requests fail. True when the bound cut the drain short."""
        models = list(state.versions.values())
        for m in models:
            m.stop_accepting()
        if deadline is None:
            deadline = time.monotonic() + (self.exit_timeout_s if timeout_s is None else timeout_s)
        # running sequences, and requests whose responses are still streaming
        while any(m.inflight_sequences or m.open_responses for m in models) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        forced = any(m.inflight_sequences for m in models)
        cut_off = forced or any(m.open_responses for m in models)
        for m in models:
            wait = max(deadline - time.monotonic(), MIN_CLOSE_WAIT_S)
            for instance in await asyncio.to_thread(m.close, force=forced, timeout_s=wait):
                self.hung_instances.append((m.name, instance))
                log.error(
                    "model '%s' instance '%s' did not return from execute within the exit timeout; %s",
                    m.name,
                    instance,
                    "exiting anyway" if self._exiting else "unloading anyway (its thread is left behind)",
                )
        return cut_off

    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """The synchronous first step of ``shutdown`` (an application calls it from its signal
        handler): from now on the server and its models are not ready, new sequences (and
        requests to models without sequences) get UNAVAILABLE, and the drain's deadline is set,
        ``timeout_s`` (default: exit_timeout_s) from now. Idempotent."""
        if self._shutdown_deadline is not None:
            return
        self._shutdown_deadline = time.monotonic() + (self.exit_timeout_s if timeout_s is None else timeout_s)
        self._exiting = True
        self._live = False
        for s in self._models.values():  # at once, even while a load holds the lock
            for m in s.versions.values():
                m.stop_accepting()
        if self._handoff is not None:  # sequences with implicit state move to the shared store
            self._handoff.begin_drain(self._shutdown_deadline)

    def open_work(self) -> tuple[int, int, list[str]]:
        """(sequences, requests, per-model details) still open: sequences holding a slot (or
        backlogged) and requests not answered for good, over every loaded model version."""
        sequences = requests = 0
        details = []
        for s in self._models.values():
            for v, m in sorted(s.versions.items()):
                seq = m.inflight_sequences if m.is_sequence else 0
                req = m.open_requests
                if seq or req:
                    sequences += seq
                    requests += req
                    details.append(f"'{m.name}' version {v}: {_count(seq, 'sequence')}, {_count(req, 'request')}")
        return sequences, requests, details

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Orderly stop, bounded by ``timeout_s`` (default: exit_timeout_s) from the moment it
        begins (see ``begin_shutdown``): new STARTs get UNAVAILABLE, running sequences go on
        to their END, open requests get their answers; every second a log line says what is
        still open. At the deadline the models are closed anyway: what never ran fails with
        UNAVAILABLE, and an instance that does not return from execute is left behind (see
        ``hung_instances``). Polling stops; a load or unload in progress ends first (unless it
        outlasts the deadline). Upload folders are removed."""
        self.begin_shutdown(timeout_s)
        deadline = self._shutdown_deadline
        assert deadline is not None
        progress = asyncio.create_task(self._log_progress(deadline), name="seqserve-shutdown-progress")
        try:
            if self._poll_task is not None:
                self._poll_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._poll_task
                self._poll_task = None
            locked = await self._acquire_control_lock(deadline)
            try:
                await self._shutdown_models(deadline)
            finally:
                if locked:
                    self._control_lock.release()
            if self._handoff is not None:  # the handoffs' writes reach the store, then it closes
                await self._handoff.finish(deadline)
        finally:
            progress.cancel()
        await asyncio.to_thread(self._uploads.remove_all)

    async def linger_while_requested(self, quiet_s: float = LINGER_QUIET_S, cap_s: float = LINGER_CAP_S) -> None:
        """With a state store, after ``shutdown``: keep the front-ends up, answering UNAVAILABLE
        (whose clients and balancer retry on another replica), while requests still come. A
        balancer sees this replica not ready only at its next health checks, and a request it
        sends to a connection that closes meanwhile fails as CANCELLED (gRPC through HAProxy),
        which no client retries. Returns once no request was refused for ``quiet_s``, or after
        ``cap_s``, or at the exit deadline. Without a store, returns at once."""
        if self._handoff is None:
            return
        start = time.monotonic()
        end = start + cap_s
        if self._shutdown_deadline is not None:
            end = min(end, self._shutdown_deadline)
        while (now := time.monotonic()) < end:
            quiet_since = max(start, self.last_refusal_at)
            if now - quiet_since >= quiet_s:
                return
            await asyncio.sleep(min(quiet_s - (now - quiet_since), end - now) + 0.01)
        log.info("requests still arrived %.1f s after the drain; stopping the front-ends anyway", cap_s)

    async def _acquire_control_lock(self, deadline: float) -> bool:
        """The control lock, unless a load or unload still holds it at the deadline (a model's
        initialize that never returns must not hold the shutdown)."""
        try:
            await asyncio.wait_for(self._control_lock.acquire(), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            log.warning("a model load or unload is still running at the exit timeout; not waiting for it")
            return False
        return True

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

    async def _shutdown_models(self, deadline: float) -> None:
        states = [s for s in self._models.values() if s.versions]
        for s in states:
            for m in s.versions.values():
                m.stop_accepting()
        cut_off = await asyncio.gather(*(self._retire_at_exit(s, deadline) for s in states))
        if any(cut_off):
            log.warning("Exit timeout expired. Exiting immediately.")

    async def _retire_at_exit(self, state: ModelState, deadline: float) -> bool:
        """Each model goes as soon as its own sequences and requests are done; requests for it
        then get SERVER_STOPPING (see ``model``)."""
        cut_off = await self._retire(state, deadline=deadline)
        versions = sorted(state.versions)
        state.versions = {}
        state.state = "UNAVAILABLE"
        state.reason = "server is shut down"
        log.info("model '%s' versions %s stopped", state.name, versions)
        return cut_off
