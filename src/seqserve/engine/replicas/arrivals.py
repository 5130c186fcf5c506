"""The request side of the state store: a START, and a step for a sequence this replica does not
hold, consult the store before they reach the core (see ``seqserve.engine.replicas.coordinator``).

**The rule, enforced here and only here**: a step without START for a sequence this replica does
not hold is served only from a checkpoint it restored from the store. Otherwise it is refused:
with the "lost" error (410 Gone for a session) when the sequence existed, with Triton's START
error when it never did, with UNAVAILABLE + retry-after while the store cannot say. The one
exception is a session's implied START, and only when the store proves the session new: no
entry, no tombstone, and the store has not lost its data within the loss window.

A START (explicit, or a session's implied one) reaches the core only once its ownership record
is in the store: a replica that answered it and died at once leaves an entry that says so.

- released in the store: claim it (the fencing token makes the claim exclusive), restore its
  checkpoint into a free slot, then submit the step;
- live under another replica that is alive: ask that owner to hand it over (it checkpoints and
  releases it between two steps) and claim it as soon as it is released; if that takes longer
  than ``handover_timeout_s``: UNAVAILABLE with a retry-after (HTTP 503 + Retry-After);
- live under a replica whose heartbeat expired: its state died with it; the step is refused
  (a session's with 410 Gone), never started afresh;
- ended (a tombstone): a session's step gets 410 Gone, as on the replica that ended it;
- unknown to the store: Triton's START error, or a session's implied START (registered first);
  but while the store's loss window lasts, a session step is refused (UNAVAILABLE during the
  grace, when live sequences are being written back by their owners; then 410).

Steps of one sequence that arrive while one of them waits for the store queue behind it, so they
reach the core in their arrival order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model import LoadedModel
from seqserve.engine.replicas.checkpoint import CheckpointError, SequenceCheckpoint
from seqserve.engine.replicas.store import Claim, SequenceKey, StateStore, Status, StoreError, StoreLostError
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.server.models import ModelTable
from seqserve.engine.sessions import SessionGoneError

T = TypeVar("T")

#: how often a step waiting for a handover looks at the store (at most; it starts faster)
_HANDOVER_POLL_S = 0.05
#: what a refused step is told to wait before it tries again (HTTP Retry-After)
RETRY_AFTER_S = 1.0


class _Gate:
    """The steps of one sequence waiting for the store, in arrival order."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class Coordinator(Protocol):
    """What the arrivals use of the replica coordinator that owns them
    (``seqserve.engine.replicas.coordinator.ReplicaCoordinator``)."""

    store: StateStore
    replica_id: str
    draining: bool
    handover_timeout_s: float

    @property
    def moving(self) -> bool: ...
    def is_leaving(self, key: SequenceKey) -> bool: ...
    def releasing(self, key: SequenceKey) -> asyncio.Future[None] | None: ...
    def holds(self, key: SequenceKey) -> bool: ...
    def own(self, key: SequenceKey, token: int, session: bool) -> None: ...
    def disown(self, key: SequenceKey) -> None: ...
    async def register(self, key: SequenceKey, session: bool) -> None: ...
    async def register_now(self, key: SequenceKey, session: bool, ttl_s: float) -> None: ...
    def store_lost(self) -> None: ...
    def is_stateful(self, m: LoadedModel) -> bool: ...
    def ttl_s(self, m: LoadedModel) -> float: ...
    def tombstone_s(self, session: bool) -> float: ...
    def abandoned(self, key: SequenceKey) -> None: ...
    def ended(self, key: SequenceKey, session: bool) -> None: ...
    def refuse_leaving(self, m: LoadedModel, sequence_id: object) -> InferenceError: ...


class Arrivals:
    """The steps of this replica's coordinator that wait for the store. Event-loop only."""

    def __init__(self, coordinator: Coordinator, table: ModelTable) -> None:
        self._coordinator = coordinator
        self._table = table
        #: sequences whose steps wait for the store, each step behind the one before
        self._gates: dict[SequenceKey, _Gate] = {}
        self._tasks: set[asyncio.Future[Any]] = set()  # strong references while they run

    def waiting(self, key: SequenceKey) -> bool:
        """A step of ``key`` waits for the store: the sequence may not move meanwhile."""
        return key in self._gates

    def enqueue(
        self, m: LoadedModel, request: InferRequest, response_parameters: dict[str, Any] | None
    ) -> asyncio.Future[InferResult]:
        """``Server.enqueue`` for sequence models while a state store is attached."""

        if not self._needs_store(m, request):
            fut = m.submit(request, response_parameters=response_parameters)
            self._after(m, request)
            return fut
        withdrawn = False

        def submit() -> asyncio.Future[InferResult]:
            if withdrawn:
                raise _Withdrawn
            return m.submit(request, response_parameters=response_parameters)

        async def arrive() -> InferResult:
            # A client that leaves does not interrupt the store work (a claim half done would
            # strand the state): the lookup finishes, restores the sequence, and does not submit
            # the step (a request cancelled in the core would take its whole sequence with it).
            nonlocal withdrawn
            lookup = asyncio.ensure_future(self._arrive(m, request, submit))
            self._tasks.add(lookup)
            lookup.add_done_callback(self._tasks.discard)
            try:
                fut = await asyncio.shield(lookup)
            except asyncio.CancelledError:
                withdrawn = True
                lookup.add_done_callback(_retrieve)
                raise
            return await fut

        return asyncio.ensure_future(arrive())

    def enqueue_streaming(
        self,
        m: LoadedModel,
        request: InferRequest,
        response_parameters: dict[str, Any] | None,
        on_response: ResponseCallback,
    ) -> Callable[[], None]:
        """``Server.enqueue_streaming`` for sequence models while a state store is attached:
        a refusal found in the store comes through ``on_response`` (final)."""

        if not self._needs_store(m, request):
            cancel_now = m.submit_streaming(request, on_response, response_parameters=response_parameters)
            self._after(m, request)
            return cancel_now
        inner: list[Callable[[], None]] = []
        cancelled = False

        def submit() -> Callable[[], None]:
            if cancelled:  # withdrawn while the store was consulted: never reaches the core
                raise _Withdrawn
            return m.submit_streaming(request, on_response, response_parameters=response_parameters)

        async def arrive() -> None:
            try:
                found = await self._arrive(m, request, submit)
            except _Withdrawn:
                on_response(InferenceError(Code.CANCELLED, "the request was cancelled"), True)
                return
            except InferenceError as e:
                on_response(e, True)
                return
            except Exception as e:  # a bug must not leave the request unanswered
                on_response(InferenceError(Code.INTERNAL, f"state store: {type(e).__name__}: {e}"), True)
                return
            if cancelled:
                found()
            else:
                inner.append(found)

        task = asyncio.ensure_future(arrive())
        self._tasks.add(task)  # a strong reference while it runs
        task.add_done_callback(self._tasks.discard)

        def cancel() -> None:
            # As for unary requests, the store work goes on; the step is not submitted.
            nonlocal cancelled
            cancelled = True
            if inner:
                inner[0]()

        return cancel

    # -------------------------------------------------------------------- fast path

    def _needs_store(self, m: LoadedModel, request: InferRequest) -> bool:
        """False for the common case (go straight to the core); True when the store must be
        consulted first; raises for a step this replica must refuse (its sequence is leaving)."""
        c = self._coordinator
        if not c.is_stateful(m):
            return False  # models that keep their own state: their sequences never move
        if not request.sequence_id:
            return False  # no id: the core's error
        if request.sequence_start:
            # registered first; a one-step plain sequence owns nothing, a one-step session
            # leaves a tombstone in the store (so that no replica starts it afresh)
            return request.session or not request.sequence_end
        if c.draining:
            raise c.refuse_leaving(m, request.sequence_id)
        if self._gates or c.moving:
            key = SequenceKey(m.name, m.version, request.sequence_id)
            if c.is_leaving(key):
                raise c.refuse_leaving(m, request.sequence_id)
            if key in self._gates or c.releasing(key) is not None:
                return True
        return m.sequence_slot(request.sequence_id) is None

    def _after(self, m: LoadedModel, request: InferRequest) -> None:
        """A step reached the core: record an END in the store (in the background; STARTs were
        registered before they were submitted)."""
        c = self._coordinator
        if request.sequence_end and (request.session or not request.sequence_start) and c.is_stateful(m):
            c.ended(SequenceKey(m.name, m.version, request.sequence_id), request.session)

    # -------------------------------------------------------------------- slow path

    async def _arrive(self, m: LoadedModel, request: InferRequest, submit: Callable[[], T]) -> T:
        key = SequenceKey(m.name, m.version, request.sequence_id)
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate()
        gate.users += 1
        try:
            async with gate.lock:
                return await self._arrive_locked(m, key, request, submit)
        finally:
            gate.users -= 1
            if not gate.users:
                del self._gates[key]

    async def _arrive_locked(
        self, m: LoadedModel, key: SequenceKey, request: InferRequest, submit: Callable[[], T]
    ) -> T:
        c = self._coordinator
        sid = request.sequence_id
        if c.draining:
            if request.sequence_start:
                why = "the server is shutting down: no new sequence starts here"
                raise InferenceError(Code.UNAVAILABLE, why, retry_after_s=RETRY_AFTER_S)
            raise c.refuse_leaving(m, sid)
        if request.sequence_start:
            return await self._start(m, key, request, request.session, submit)
        if m.sequence_slot(sid) is not None:  # it came (back) while this step waited its turn
            return self._submit(m, request, submit)
        releasing = c.releasing(key)
        if releasing is not None:  # this replica's own release is on its way to the store
            await asyncio.shield(releasing)
        ttl = c.ttl_s(m)
        deadline = time.monotonic() + c.handover_timeout_s
        asked = ""
        pause = 0.002
        while True:
            try:
                claim = await c.store.claim(key, ttl)
                if claim.won:
                    return await self._restore(m, key, request, claim, submit)
                entry = claim.entry
                if entry is None:
                    return await self._unknown(m, key, request, claim, submit)
                if entry.status.tombstone:
                    if request.session:
                        how = "was ended" if entry.status is Status.ENDED else "expired while idle in the state store"
                        raise SessionGoneError(f"session '{sid}' {how}; start a new session with a new id")
                    return self._submit(m, request, submit)  # the core's START error
                if entry.owner == c.replica_id:
                    if c.holds(key):
                        # This process's, yet not live here: the engine ended it (idle expiry,
                        # the sequence API). Never an implied START over it.
                        c.ended(key, entry.session)
                        if request.session:
                            why = "ended on this replica; start a new session with a new id"
                            raise SessionGoneError(f"session '{sid}' {why}")
                        return self._submit(m, request, submit)  # the core's START error
                    # An earlier process under this replica id (a restart that kept its name,
                    # a StatefulSet pod's): its state died with that process.
                    await c.register_now(key, entry.session, ttl)
                    c.ended(key, entry.session)
                    raise _lost(m, sid, request.session, f"replica '{c.replica_id}' restarted without handing it off")
                if entry.owner != asked:  # live under another replica: ask it to let go
                    await c.store.request_handover(entry.owner, key)
                    asked = entry.owner
            except StoreError as e:
                raise self._store_error(m, sid, e) from None
            if time.monotonic() + pause > deadline:
                raise InferenceError(
                    Code.UNAVAILABLE,
                    f"sequence {sid} of model '{m.name}' is held by replica '{asked}', which did not hand it over "
                    f"within {c.handover_timeout_s:g} s; retry",
                    retry_after_s=RETRY_AFTER_S,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _HANDOVER_POLL_S)

    def _submit(self, m: LoadedModel, request: InferRequest, submit: Callable[[], T]) -> T:
        out = submit()
        self._after(m, request)
        return out

    def _store_error(self, m: LoadedModel, sid: SequenceId, e: StoreError) -> InferenceError:
        if isinstance(e, StoreLostError):
            self._coordinator.store_lost()
        return InferenceError(Code.UNAVAILABLE, f"sequence {sid} of model '{m.name}': {e}", retry_after_s=RETRY_AFTER_S)

    async def _unknown(
        self, m: LoadedModel, key: SequenceKey, request: InferRequest, claim: Claim, submit: Callable[[], T]
    ) -> T:
        """Not in the store. A plain step: the core's START error. A session step: its implied
        START, only when the store has not lost its data lately (the session may be one it lost)."""
        sid = request.sequence_id
        if not request.session:
            return self._submit(m, request, submit)
        if claim.in_loss_grace:
            raise InferenceError(
                Code.UNAVAILABLE,
                f"session '{sid}': the state store lost its data moments ago and its replicas are writing their "
                "sessions back; retry",
                retry_after_s=RETRY_AFTER_S,
            )
        if claim.in_loss_window:
            raise SessionGoneError(
                f"session '{sid}' is unknown to the state store, which lost its data (it restarted empty): it may "
                "have been lost; start a new session with a new id and the START flag (sequence_start)"
            )
        return await self._start(m, key, request, True, submit)  # (with END: its tombstone follows)

    async def _start(
        self, m: LoadedModel, key: SequenceKey, request: InferRequest, session: bool, submit: Callable[[], T]
    ) -> T:
        """A START (or a session's implied one): its ownership record first, then the core."""
        c = self._coordinator
        try:
            await c.register(key, session)
        except StoreError as e:
            raise self._store_error(m, request.sequence_id, e) from None
        try:
            return self._submit(m, request, submit)
        except BaseException:
            c.abandoned(key)  # refused by the core: the id is free again
            raise

    async def _restore(
        self, m: LoadedModel, key: SequenceKey, request: InferRequest, claim: Claim, submit: Callable[[], T]
    ) -> T:
        c = self._coordinator
        sid = request.sequence_id
        c.own(key, claim.token, request.session)
        if claim.data is None:  # a dead replica's live sequence: no checkpoint, its state is gone
            session = request.session
            c.ended(key, session)
            raise _lost(m, sid, session, f"replica '{claim.previous_owner}' stopped without handing it off")
        try:
            ckpt: SequenceCheckpoint = SequenceCheckpoint.from_bytes(claim.data)
            if (ckpt.model, ckpt.version, ckpt.sequence_id) != (m.name, m.version, sid):
                raise CheckpointError("the checkpoint is another sequence's")
        except CheckpointError as e:
            c.ended(key, request.session)
            raise _lost(m, sid, request.session, f"its checkpoint is unusable ({e})") from None
        try:
            await self._restore_when_free(ckpt)
        except InferenceError as e:
            # No free slot here in time (or another refusal): put it back for whoever can take it.
            c.disown(key)
            try:
                await c.store.release(key, claim.token, claim.data, c.ttl_s(m), c.tombstone_s(ckpt.session))
            except StoreError as put_back:
                raise _lost(m, sid, request.session, f"it could not be put back: {put_back}") from None
            raise InferenceError(
                Code.UNAVAILABLE,
                f"sequence {sid} of model '{m.name}' cannot continue on this replica now: {e}",
                retry_after_s=e.retry_after_s or RETRY_AFTER_S,
            ) from None
        return self._submit(m, request, submit)

    async def _restore_when_free(self, ckpt: SequenceCheckpoint) -> None:
        """Restore into a free slot; while none is free (UNAVAILABLE), wait for one up to the
        handover timeout: finished sequences and the idle spill free slots."""
        c = self._coordinator
        deadline = time.monotonic() + c.handover_timeout_s
        pause = 0.005
        while True:
            try:
                self._table.restore_sequence(ckpt)
                return
            except InferenceError as e:
                if e.code is not Code.UNAVAILABLE or time.monotonic() + pause > deadline or c.draining:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, _HANDOVER_POLL_S)


class _Withdrawn(Exception):
    """The step's client left while the store was consulted: it is not submitted."""


def _retrieve(lookup: asyncio.Future[Any]) -> None:
    if not lookup.cancelled():
        lookup.exception()  # nobody awaits it any more: no "exception was never retrieved"


def _lost(m: LoadedModel, sid: SequenceId, session: bool, why: str) -> InferenceError:
    if session:
        return SessionGoneError(f"session '{sid}' was lost: {why}; start a new session with a new id")
    return InferenceError(
        Code.INVALID_ARG, f"sequence {sid} of model '{m.name}' was lost: {why}; start it again with the START flag"
    )
