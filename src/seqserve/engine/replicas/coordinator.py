"""A replica's side of the shared state store (docs/state-store.md): it records which sequences
this replica runs, hands them off (on drain, on an owner's handover request, when idle), and
brings sequences it does not hold back from the store when their next step arrives here.

``Server.enable_state_store`` gives a ``ReplicaCoordinator`` the server's model table and
session policy. The request path pays for it only where it must: a step of a sequence live here
goes to the core untouched (one slot lookup for steps without START); a START waits for its
ownership record to be in the store (``Ownership``: the STARTs of one loop turn share one round
trip), so that no replica can take the sequence for new after this one answered it; ENDs queue a
store write that a background task sends in batches. A step for a sequence this replica does not
hold (``Arrivals``, which the coordinator owns) waits for the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model import LoadedModel
from seqserve.engine.replicas.arrivals import Arrivals
from seqserve.engine.replicas.checkpoint import SequenceBusyError, SequenceCheckpoint
from seqserve.engine.replicas.ownership import Ownership
from seqserve.engine.replicas.store import SequenceKey, StateStore, Status, StoreError, StoreLostError
from seqserve.engine.replicas.tasks import stop_tasks
from seqserve.engine.request import InferRequest
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.server.models import ModelTable
from seqserve.engine.sessions import SessionPolicy

log = logging.getLogger("seqserve.handoff")

#: how long entries outlive the model's idle timeout (live ones are refreshed while they run)
DEFAULT_MARGIN_S = 30.0
#: the longest pause between two tries to checkpoint a sequence whose step is running
_BUSY_RETRY_S = 0.01
#: sequences checkpointed per round of the spill task, so that one round never holds the loop long
_SPILL_BATCH = 256


class ReplicaCoordinator:
    """See the module's docstring. Event-loop only."""

    def __init__(
        self,
        table: ModelTable,
        sessions: SessionPolicy,
        store: StateStore,
        *,
        spill_idle_s: float = 0.0,
        handover_timeout_s: float = 2.0,
        margin_s: float = DEFAULT_MARGIN_S,
    ) -> None:
        if spill_idle_s < 0 or handover_timeout_s <= 0 or margin_s <= 0:
            raise ValueError("spill_idle_s must be >= 0, handover_timeout_s and margin_s > 0")
        self.table = table
        self.sessions = sessions
        self.store = store
        self.replica_id = store.replica_id
        self.spill_idle_s = spill_idle_s
        self.handover_timeout_s = handover_timeout_s
        self.margin_s = margin_s
        self.draining = False
        #: the sequences this replica holds in the store, and the writes that keep it so
        self.ownership = Ownership(store, self._model, self._entry_ttl, self.tombstone_s, self.loss_window_s)
        #: sequences whose state is on its way into the store (the release write in flight)
        self._releasing: dict[SequenceKey, asyncio.Future[None]] = {}
        #: sequences being handed over to another replica: their steps are refused meanwhile
        self._leaving: set[SequenceKey] = set()
        #: steps of sequences this replica does not hold
        self.arrivals = Arrivals(self, table)
        self._tasks: list[asyncio.Task[None]] = []
        self._drain_task: asyncio.Task[None] | None = None
        self._stateful: dict[str, tuple[LoadedModel, bool]] = {}

    # --------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.store.open(self._on_handover)
        if self.store.created_epoch:
            # An empty store: new, or restarted empty. Replicas that knew the old epoch notice at
            # their next heartbeat (at most 1 s) and mark the loss window before this one serves.
            await asyncio.sleep(1.5)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.ownership.flusher(), name="seqserve-handoff-flush"),
            loop.create_task(self._beat(), name="seqserve-handoff-heartbeat"),
        ]
        if self.spill_idle_s > 0:
            self._tasks.append(loop.create_task(self._spill_loop(), name="seqserve-handoff-spill"))
        log.info(
            "state store: replica '%s'%s", self.replica_id,
            f", idle sequences spill after {self.spill_idle_s:g} s" if self.spill_idle_s else "",
        )  # fmt: skip

    def begin_drain(self, deadline: float) -> None:
        """The shutdown began (synchronous, from the signal handler): from now on every step of a
        model with implicit state is refused with UNAVAILABLE + retry-after, and each live
        sequence moves to the store after its running step."""
        if self.draining:
            return
        self.draining = True
        self._drain_task = asyncio.get_running_loop().create_task(
            self._handoff_all(deadline), name="seqserve-handoff-drain"
        )

    async def finish(self, deadline: float) -> None:
        """The end of the shutdown: the drain's handoffs and the queued writes reach the store
        (bounded by ``deadline``), then the store closes."""
        if self._drain_task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._drain_task), max(deadline - time.monotonic(), 0.1))
        self.ownership.wake()
        pending = list(self._releasing.values())
        if pending:
            await asyncio.wait(pending, timeout=max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ownership.flush(), max(deadline - time.monotonic(), 0.5))
        await stop_tasks(self._tasks)  # a heartbeat's cancellation can be lost (see stop_tasks)
        await self.ownership.close()
        try:
            await self.store.close()
        except Exception as e:  # the process is exiting anyway
            log.warning("state store: close: %s", e)

    # ------------------------------------------------------------------ bookkeeping

    def is_stateful(self, m: LoadedModel) -> bool:
        """Whether the server holds the model's state (implicit state): only those can move."""
        found = self._stateful.get(m.name)
        if found is None or found[0] is not m:  # one entry per name: a reload replaces it
            found = self._stateful[m.name] = (m, bool(m.config.sequence_batching.state))
        return found[1]

    def _stateful_models(self) -> list[LoadedModel]:
        return [m for m in self.table.loaded() if self.is_stateful(m)]

    def ttl_s(self, m: LoadedModel) -> float:
        """How long an entry lives unrefreshed: the model's idle timeout and the margin."""
        idle_us = m.config.sequence_batching.max_sequence_idle_microseconds or 1_000_000
        return idle_us / 1e6 + self.margin_s

    def tombstone_s(self, session: bool) -> float:
        """How long the store remembers an ended (or expired) sequence: sessions as the engine
        does (--session-tombstone-secs), plain sequences not at all."""
        return self.sessions.tombstone_s if session else 0.0

    def loss_window_s(self) -> float:
        """After the store lost its data: the longest any lost entry could have lived (a
        released checkpoint, then its tombstone), during which an absent entry proves nothing."""
        longest = max((self.ttl_s(m) for m in self._stateful_models()), default=self.margin_s)
        return longest + self.sessions.tombstone_s

    def _model(self, key: SequenceKey) -> LoadedModel | None:
        try:
            m = self.table.model(key.model, key.version)
        except InferenceError:
            return None
        return m if isinstance(m, LoadedModel) else None  # an ensemble holds no sequences

    async def register(self, key: SequenceKey, session: bool) -> None:
        """A sequence starts here (a START, or a session's implied one): its ownership record
        is in the store when this returns. Raises StoreError."""
        await self.ownership.register(key, session)

    def abandoned(self, key: SequenceKey) -> None:
        """A START registered here that the core refused: its entry goes, without a tombstone."""
        self.ownership.ended(key, False)

    def ended(self, key: SequenceKey, session: bool) -> None:
        self.ownership.ended(key, session)

    def holds(self, key: SequenceKey) -> bool:
        """This process registered ``key`` in the store (or is about to)."""
        return self.ownership.holds(key)

    def own(self, key: SequenceKey, token: int, session: bool) -> None:
        """``key`` is this replica's in the store now, under ``token`` (a claim it won)."""
        self.ownership.own(key, token, session)

    def disown(self, key: SequenceKey) -> None:
        self.ownership.disown(key)

    async def register_now(self, key: SequenceKey, session: bool, ttl_s: float) -> None:
        """Take ``key`` in the store at once, alone."""
        await self.ownership.register_now(key, session, ttl_s)

    def store_lost(self) -> None:
        """A request found the store without its epoch: recover (once)."""
        self.ownership.store_lost()

    @property
    def settled(self) -> bool:
        """No write to the store is waiting or under way (for tests and the drain's report)."""
        return not self.ownership.pending and not self._releasing

    @property
    def moving(self) -> bool:
        """Some sequence is leaving this replica or on its way into the store."""
        return bool(self._leaving or self._releasing)

    def is_leaving(self, key: SequenceKey) -> bool:
        """``key`` is being handed over to another replica: its steps are refused meanwhile."""
        return key in self._leaving

    def releasing(self, key: SequenceKey) -> asyncio.Future[None] | None:
        """The write of ``key``'s checkpoint into the store, while it is on its way."""
        return self._releasing.get(key)

    def enqueue(
        self, m: LoadedModel, request: InferRequest, response_parameters: dict[str, Any] | None
    ) -> asyncio.Future[InferResult]:
        """``Server.enqueue`` for sequence models while a state store is attached."""
        return self.arrivals.enqueue(m, request, response_parameters)

    def enqueue_streaming(
        self,
        m: LoadedModel,
        request: InferRequest,
        response_parameters: dict[str, Any] | None,
        on_response: ResponseCallback,
    ) -> Callable[[], None]:
        """``Server.enqueue_streaming`` for sequence models while a state store is attached."""
        return self.arrivals.enqueue_streaming(m, request, response_parameters, on_response)

    def _entry_ttl(self, key: SequenceKey) -> float:
        m = self._model(key)
        return self.ttl_s(m) if m is not None else self.margin_s

    async def _beat(self) -> None:
        """The heartbeat; every few beats, push back the expiry of the entries of sequences
        still live here and end those the engine ended by itself (idle expiry)."""
        interval = min(max(self.store.heartbeat_ttl_s / 3, 0.05), 1.0)
        refresh_every = max(1, int(self.margin_s / 3 / interval))
        n = 0
        while True:
            try:
                if not await self.store.heartbeat():
                    self.ownership.store_lost()
                    await self.ownership.recovered()
                n += 1
                if n % refresh_every == 0:
                    await self.ownership.refresh(lambda k: k in self._releasing or self.arrivals.waiting(k))
            except StoreLostError:
                self.ownership.store_lost()
            except StoreError as e:
                log.warning("state store: %s", e)
            await asyncio.sleep(interval)

    # --------------------------------------------------------------- moving out

    async def _checkpoint(self, m: LoadedModel, key: SequenceKey, deadline: float) -> SequenceCheckpoint | None:
        """Checkpoint and release the sequence between two of its steps (retrying while one is
        queued or running), up to ``deadline``; None when it is not live here or the deadline
        passed."""
        pause = 0.001
        while True:
            try:
                return self.table.checkpoint_sequence(m.name, m.version, key.sequence_id, release=True)
            except SequenceBusyError:
                if time.monotonic() + pause > deadline:
                    return None
                await asyncio.sleep(pause)
                pause = min(pause * 2, _BUSY_RETRY_S)

    def release_later(self, m: LoadedModel, key: SequenceKey, ckpt: SequenceCheckpoint) -> asyncio.Future[None]:
        """Write a checkpointed (released) sequence to the store, in the background; steps that
        arrive for it meanwhile wait for the write."""
        fut = asyncio.ensure_future(self._write_release(m, key, ckpt))
        self._releasing[key] = fut
        fut.add_done_callback(lambda _: self._releasing.pop(key, None))
        return fut

    async def _write_release(self, m: LoadedModel, key: SequenceKey, ckpt: SequenceCheckpoint) -> None:
        data = ckpt.to_bytes()
        ttl = self.ttl_s(m)
        tomb = self.tombstone_s(ckpt.session)
        for attempt in range(3):
            try:
                token = await self.ownership.token(key)
                if token is None:  # its START never reached the store: take it now
                    [token] = await self.store.register([(key, ckpt.session)], ttl)
                self.ownership.disown(key)
                if await self.store.release(key, token, data, ttl, tomb):
                    return
                entry = await self.store.get(key)
                if entry is None:
                    # Gone (the store lost it, or it expired): nobody else holds it, the state is here.
                    [token] = await self.store.register([(key, ckpt.session)], ttl, if_absent=True)
                    if token and await self.store.release(key, token, data, ttl, tomb):
                        log.warning("state store: sequence %s was missing from the store; written again", key.encode())
                        return
                    entry = await self.store.get(key)
                # registered twice by this process (a race of two writers): the entry is ours
                ours = entry is not None and entry.owner == self.replica_id and entry.status is Status.LIVE
                if ours and entry is not None and await self.store.release(key, entry.token, data, ttl, tomb):
                    return
                holder = f"replica '{entry.owner}'" if entry is not None else "nobody"
                log.error(
                    "state store: sequence %s was taken meanwhile (the store says: %s, %s); dropped",
                    key.encode(), holder, entry.status.value if entry is not None else "no entry",
                )  # fmt: skip
                return
            except StoreLostError as e:
                log.warning("state store: releasing %s (try %d): %s", key.encode(), attempt + 1, e)
                self.ownership.store_lost()
                await self.ownership.recovered()
            except StoreError as e:
                log.warning("state store: releasing %s (try %d): %s", key.encode(), attempt + 1, e)
                await asyncio.sleep(0.1 * (attempt + 1))
        # The store is out of reach: keep the sequence here rather than lose it (not while
        # draining: the process is going away, and with it the state).
        if not self.draining:
            try:
                self.table.restore_sequence(ckpt)
                self.ownership.register_later(key, ckpt.session)
                log.warning("state store unreachable: sequence %s stays on this replica", key.encode())
                return
            except InferenceError as e:
                log.error("sequence %s is lost: the store is unreachable and it cannot come back: %s", key.encode(), e)
        else:
            log.error("sequence %s is lost: the state store is unreachable during the drain", key.encode())

    async def _on_handover(self, key: SequenceKey, requester: str) -> None:
        """Another replica got a step of a sequence this one runs: let it go between two steps."""
        if self.draining or key in self._leaving or key in self._releasing:
            return  # on its way already
        m = self._model(key)
        if m is None or not self.is_stateful(m) or m.sequence_slot(key.sequence_id) is None:
            return
        self._leaving.add(key)
        try:
            ckpt = await self._checkpoint(m, key, time.monotonic() + self.handover_timeout_s)
            if ckpt is not None:
                log.info("handing sequence %s over to replica '%s'", key.encode(), requester)
                await self.release_later(m, key, ckpt)
        finally:
            self._leaving.discard(key)

    async def _handoff_all(self, deadline: float) -> None:
        """The drain: every live sequence of a model with implicit state goes to the store after
        its running step; those of models that keep their own state finish here."""
        moved = 0
        while time.monotonic() < deadline:
            for name, version, sid, _idle in self.table.live_sequences():
                key = SequenceKey(name, version, sid)
                m = self._model(key)
                if m is None or not self.is_stateful(m) or key in self._releasing:
                    continue
                ckpt = await self._checkpoint(m, key, time.monotonic())  # one try: others meanwhile
                if ckpt is not None:
                    self.release_later(m, key, ckpt)
                    moved += 1
            # sequences still running a step, or waiting in the backlog for a slot the handoffs free
            if not any(m.inflight_sequences for m in self._stateful_models()):
                break
            await asyncio.sleep(0.005)
        if self._releasing:
            await asyncio.wait(list(self._releasing.values()), timeout=max(deadline - time.monotonic(), 0.1))
        log.info("state store: %d sequence%s handed off", moved, "" if moved == 1 else "s")

    async def _spill_loop(self) -> None:
        """Idle sequences go to the store and free their slot; their next step brings them back."""
        every = min(max(self.spill_idle_s / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(every)
            if self.draining:
                return
            spilled = 0
            for name, version, sid, idle in self.table.live_sequences():
                if idle < self.spill_idle_s or spilled >= _SPILL_BATCH:
                    continue
                key = SequenceKey(name, version, sid)
                m = self._model(key)
                if (
                    m is None
                    or not self.is_stateful(m)
                    or key in self._releasing
                    or self.arrivals.waiting(key)
                    or key in self._leaving
                ):
                    continue
                ckpt = await self._checkpoint(m, key, time.monotonic())
                if ckpt is not None:
                    self.release_later(m, key, ckpt)
                    spilled += 1
            if spilled:
                log.debug("spilled %d idle sequence(s) to the state store", spilled)

    def refuse_leaving(self, m: LoadedModel, sequence_id: object) -> InferenceError:
        why = "this replica is shutting down" if self.draining else "it is moving to another replica"
        return InferenceError(
            Code.UNAVAILABLE,
            f"sequence {sequence_id} of model '{m.name}' is leaving this replica ({why}); retry",
            retry_after_s=1.0,
        )
