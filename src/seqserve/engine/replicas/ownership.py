"""Which sequences this replica holds in the state store, and keeping the store right about it.

- **Registration before the answer.** A START (or a session's implied one) is submitted only once
  its entry is in the store (``register``): a replica killed right after answering a START
  leaves an entry under its name, so the next step elsewhere finds the sequence lost instead of
  starting it afresh. The STARTs of one event-loop turn share one round trip.
- **Ends** are queued and sent in batches by a background task (``ended``): a session's entry
  becomes a tombstone, a plain sequence's is deleted.
- **Refresh** pushes back the expiry of the entries of sequences live here. A refresh the store
  refuses is never ignored: an entry that is gone (expired, or lost) is written back if nobody
  took the id meanwhile; one that another replica holds now means the copy here is stale, and
  it is ended here (its next step here is refused, never served from stale state).
- **Loss recovery.** When the store no longer has the epoch this replica knew (a Redis restarted
  empty), ``recover`` marks the loss window for every replica and the live sequences here are
  written back (only where the id is still absent: fencing against a START elsewhere meanwhile).

Event-loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from seqserve.engine.errors import InferenceError
from seqserve.engine.model import LoadedModel
from seqserve.engine.replicas.store import SequenceKey, StateStore, StoreError, StoreLostError
from seqserve.engine.replicas.tasks import stop_tasks

log = logging.getLogger("seqserve.handoff")

#: after a loss, how long a step the store does not know is answered "retry" rather than "lost":
#: the owners of live sequences notice the loss at their next heartbeat (at most 1 s apart) and
#: write those sequences back
LOSS_GRACE_S = 3.0


@dataclass(slots=True)
class Held:
    """One sequence this replica holds in the store."""

    token: int
    session: bool


class Ownership:
    """See the module's docstring."""

    def __init__(
        self,
        store: StateStore,
        model_of: Callable[[SequenceKey], LoadedModel | None],
        entry_ttl: Callable[[SequenceKey], float],
        tombstone_s: Callable[[bool], float],
        loss_window_s: Callable[[], float],
    ) -> None:
        self.store = store
        self.replica_id = store.replica_id
        self._model_of = model_of
        self._entry_ttl = entry_ttl
        self._tombstone_s = tombstone_s
        self._loss_window_s = loss_window_s
        self.held: dict[SequenceKey, Held] = {}
        #: background writes: registrations (a sequence kept here when the store was out of
        #: reach: key -> session) and ends (key -> leave a tombstone)
        self._to_register: dict[SequenceKey, bool] = {}
        self._to_end: dict[SequenceKey, bool] = {}
        self._registering: set[SequenceKey] = set()  # registrations on their way to the store
        #: the STARTs of this loop turn, sent together; and the future they wait for
        self._batch: dict[SequenceKey, bool] = {}
        self._batch_done: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()  # set after each write: waiters for a token re-check
        self._recovering: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: times this replica found the store without its epoch (a metric for operators)
        self.losses_seen = 0

    # ------------------------------------------------------------------ queries

    def holds(self, key: SequenceKey) -> bool:
        """This process registered ``key`` in the store (or is about to)."""
        return key in self.held or key in self._to_register or key in self._registering or key in self._batch

    @property
    def pending(self) -> bool:
        """Writes are waiting to be sent (registrations, ends)."""
        return bool(self._to_register or self._to_end or self._batch or self._registering)

    def own(self, key: SequenceKey, token: int, session: bool) -> None:
        """``key`` is this replica's in the store now, under ``token`` (a claim it won)."""
        self.held[key] = Held(token, session)

    def disown(self, key: SequenceKey) -> Held | None:
        return self.held.pop(key, None)

    # ------------------------------------------------------------------ registration

    async def register(self, key: SequenceKey, session: bool) -> None:
        """Record ``key`` as this replica's, live, before its START reaches the core. Raises
        StoreError (StoreLostError when the store lost its data: recovery starts then)."""
        self._to_end.pop(key, None)
        if self._batch_done is None:
            loop = asyncio.get_running_loop()
            self._batch_done = loop.create_future()
            self._batch_done.add_done_callback(_retrieve)
            self._spawn(self._send_batch())
        done = self._batch_done
        self._batch[key] = session
        await asyncio.shield(done)

    async def register_now(self, key: SequenceKey, session: bool, ttl_s: float) -> None:
        """Take ``key`` in the store at once, alone (a lost sequence, to be ended under this
        replica's token)."""
        [token] = await self.store.register([(key, session)], ttl_s)
        self.held[key] = Held(token, session)

    async def _send_batch(self) -> None:
        await asyncio.sleep(0)  # the STARTs of this turn join the batch
        batch, done = self._batch, self._batch_done
        self._batch, self._batch_done = {}, None
        assert done is not None
        self._registering |= set(batch)
        try:
            for ttl, items in self._by_ttl(batch).items():
                tokens = await self.store.register(items, ttl)
                for (k, session), t in zip(items, tokens, strict=True):
                    self.held[k] = Held(t, session)
            done.set_result(None)
        except StoreError as e:
            if isinstance(e, StoreLostError):
                self.store_lost()
            done.set_exception(e)
        except BaseException as e:  # cancelled at shutdown: the waiters must not hang
            done.set_exception(StoreError(f"registration interrupted: {e!r}"))
            raise
        finally:
            self._registering -= set(batch)
            self._signal_flushed()

    def _by_ttl(self, keys: dict[SequenceKey, bool]) -> dict[float, list[tuple[SequenceKey, bool]]]:
        by_ttl: dict[float, list[tuple[SequenceKey, bool]]] = {}
        for k, session in keys.items():
            by_ttl.setdefault(self._entry_ttl(k), []).append((k, session))
        return by_ttl

    def register_later(self, key: SequenceKey, session: bool) -> None:
        """Record ``key`` in the background (a sequence kept here while the store was out of
        reach), retried until it gets through."""
        self._to_end.pop(key, None)
        self._to_register[key] = session
        self._wake.set()

    def ended(self, key: SequenceKey, tombstone: bool) -> None:
        """The sequence ended here: its entry becomes a tombstone (``tombstone``) or goes."""
        self._to_end[key] = tombstone
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def _signal_flushed(self) -> None:
        self._flushed.set()
        self._flushed = asyncio.Event()

    async def flusher(self) -> None:
        backoff = 0.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
                backoff = 0.0
            except StoreError as e:
                if isinstance(e, StoreLostError):
                    self.store_lost()
                backoff = min(max(backoff * 2, 0.25), 5.0)
                log.warning("state store: %s (trying again in %g s)", e, backoff)
                await asyncio.sleep(backoff)
                self._wake.set()

    async def flush(self) -> None:
        """Send the queued registrations, then the ends, each batch in one round trip."""
        reg, self._to_register = self._to_register, {}
        self._registering |= set(reg)
        try:
            by_ttl = self._by_ttl(reg)
            for ttl, items in list(by_ttl.items()):
                try:
                    tokens = await self.store.register(items, ttl)
                except StoreError:
                    for k, session in (kv for group in by_ttl.values() for kv in group):
                        self._to_register.setdefault(k, session)  # next time, unless ended meanwhile
                    raise
                del by_ttl[ttl]
                for (k, session), t in zip(items, tokens, strict=True):
                    self.held[k] = Held(t, session)
            ended = {k: s for k, s in self._to_end.items() if k in self.held}
            for k in [k for k in self._to_end if not self.holds(k)]:
                del self._to_end[k]  # never registered (its START never reached the store)
            if ended:
                for k in ended:
                    del self._to_end[k]
                tombs = [(k, self.held.pop(k).token) for k, s in ended.items() if s]
                others = [(k, self.held.pop(k).token) for k, s in ended.items() if not s]
                if tombs:
                    await self.store.end(tombs, self._tombstone_s(True))
                if others:
                    await self.store.end(others, 0)
        finally:
            self._registering -= set(reg)
            self._signal_flushed()

    async def token(self, key: SequenceKey) -> int | None:
        """This replica's token for ``key``, once its registration is through."""
        for _ in range(3):
            if key in self.held:
                return self.held[key].token
            if not self.holds(key):
                return None
            self._wake.set()
            waiter = self._flushed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), 2.0)
        found = self.held.get(key)
        return found.token if found is not None else None

    # ------------------------------------------------------------------ refresh

    async def refresh(self, busy: Callable[[SequenceKey], bool]) -> None:
        """Push back the expiry of the entries live here; mark those the engine ended by itself
        (idle expiry) for a tombstone. ``busy``: keys on their way in or out (left alone)."""
        live: dict[SequenceKey, bool] = {}
        for k, h in list(self.held.items()):
            if self._live_here(k):  # a slot, or the backlog
                live[k] = h.session
            elif not busy(k) and k not in self._to_end:
                self._to_end[k] = True  # expired here: a tombstone, as the engine keeps one
        for ttl, items in self._by_ttl(live).items():
            held = [(k, self.held[k].token) for k, _ in items if k in self.held]
            results = await self.store.refresh(held, ttl)
            refused = [k for (k, _), ok in zip(held, results, strict=True) if not ok]
            if refused:
                await self._refused(refused, ttl)
        self._wake.set()

    def _live_here(self, key: SequenceKey) -> bool:
        m = self._model_of(key)
        return m is not None and m.sequence_slot(key.sequence_id) is not None

    async def _refused(self, keys: list[SequenceKey], ttl_s: float) -> None:
        """Entries the store would not refresh: gone (write them back if the id is still free)
        or held by another replica (the copy here is stale: end it here)."""
        for k in keys:
            h = self.held.get(k)
            if h is None:
                continue
            entry = await self.store.get(k)
            if entry is None:
                log.warning("state store: the entry of live sequence %s was gone; writing it back", k.encode())
                [token] = await self.store.register([(k, h.session)], ttl_s, if_absent=True)
                if token:
                    self.held[k] = Held(token, h.session)
                    continue
                entry = await self.store.get(k)
            if entry is not None and entry.owner == self.replica_id and entry.token == h.token:
                continue  # (released by this replica meanwhile)
            self.drop_stale(k, f"replica '{entry.owner if entry else '?'}' holds it in the state store now")

    def drop_stale(self, key: SequenceKey, why: str) -> None:
        """Another replica holds ``key`` now: the copy here must never answer again."""
        self.held.pop(key, None)
        m = self._model_of(key)
        log.error("state store: sequence %s ended here: %s", key.encode(), why)
        if m is not None:
            with contextlib.suppress(InferenceError):
                m.end_owned_sequence(key.sequence_id, 0, f"it is stale on this replica ({why})")

    # ------------------------------------------------------------------ loss recovery

    def store_lost(self) -> None:
        """The store lost its data (its epoch is not the one this replica knew): recover, once."""
        if self._recovering is None or self._recovering.done():
            self._recovering = asyncio.get_running_loop().create_task(self._recover(), name="seqserve-store-recover")

    async def recovered(self) -> None:
        """Wait for a recovery under way (if any)."""
        if self._recovering is not None and not self._recovering.done():
            await asyncio.shield(self._recovering)

    async def _recover(self) -> None:
        self.losses_seen += 1
        window = self._loss_window_s()
        log.error(
            "state store: it lost its data (restarted empty?); the sequences live here are written back, and for "
            "%g s a step of a sequence the store does not know is refused (it may be one the store lost)",
            window,
        )  # fmt: skip
        pause = 0.1
        while True:
            try:
                await self.store.recover(window, LOSS_GRACE_S)
                # the heartbeat first: an entry written back under a replica without one would
                # look like a dead replica's to the others, and be declared lost
                await self.store.heartbeat()
                await self._write_back()
                return
            except StoreError as e:
                log.warning("state store: recovering from its loss: %s (trying again in %g s)", e, pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def _write_back(self) -> None:
        live = {k: h.session for k, h in self.held.items() if self._live_here(k)}
        for k in [k for k in self.held if k not in live]:
            del self.held[k]  # its entry (a tombstone, a release on its way) is gone with the rest
        for ttl, items in self._by_ttl(live).items():
            tokens = await self.store.register(items, ttl, if_absent=True)
            for (k, session), t in zip(items, tokens, strict=True):
                if t:
                    self.held[k] = Held(t, session)
                else:
                    self.drop_stale(k, "it was started afresh on another replica after the store lost its data")
        log.warning("state store: %d live sequence(s) written back after its loss", len(live))

    # ------------------------------------------------------------------ tasks

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        await stop_tasks([*self._tasks, *([self._recovering] if self._recovering else [])])


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # every waiter may have left: no "exception was never retrieved"
