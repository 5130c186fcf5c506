"""A state store whose every operation is timed and whose failures are counted, in the process's
metric registry (``seqserve.engine.custom_metrics``), so that ``/metrics`` shows the store's
round-trip time and errors by operation: ``seqserve_state_store_request_duration_seconds``
(histogram) and ``seqserve_state_store_errors_total`` (counter), labelled ``op``."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from seqserve.engine.custom_metrics import counter, histogram
from seqserve.engine.replicas.store.base import Claim, Entry, HandoverHandler, SequenceKey, StateStore

T = TypeVar("T")

#: seconds: from a local directory's sub-millisecond to a slow network's second
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DURATION = ("seqserve_state_store_request_duration_seconds", "Round-trip time of state store operations, in seconds")
ERRORS = ("seqserve_state_store_errors_total", "State store operations that failed (raised)")


class MeasuredStore(StateStore):
    """``inner``, with each operation's time and failure recorded by operation name."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        super().__init__(inner.replica_id, heartbeat_ttl_s=inner.heartbeat_ttl_s)

    # The epoch is the inner store's: it learns it at open and recover.
    @property  # type: ignore[override]
    def epoch(self) -> str:
        return self.inner.epoch

    @epoch.setter
    def epoch(self, value: str) -> None:
        self.inner.epoch = value

    @property  # type: ignore[override]
    def created_epoch(self) -> bool:
        return self.inner.created_epoch

    @created_epoch.setter
    def created_epoch(self, value: bool) -> None:
        self.inner.created_epoch = value

    async def _timed(self, op: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await call
        except Exception:
            counter(*ERRORS, {"op": op}).increment()
            raise
        finally:
            histogram(*DURATION, DURATION_BUCKETS, {"op": op}).observe(time.perf_counter() - started)

    async def open(self, on_handover: HandoverHandler | None = None) -> None:
        await self._timed("open", self.inner.open(on_handover))

    async def close(self) -> None:
        await self._timed("close", self.inner.close())

    async def heartbeat(self) -> bool:
        return await self._timed("heartbeat", self.inner.heartbeat())

    async def recover(self, window_s: float, grace_s: float) -> None:
        await self._timed("recover", self.inner.recover(window_s, grace_s))

    async def is_alive(self, replica_id: str) -> bool:
        return await self._timed("is_alive", self.inner.is_alive(replica_id))

    async def get(self, key: SequenceKey) -> Entry | None:
        return await self._timed("get", self.inner.get(key))

    async def register(
        self, keys: list[tuple[SequenceKey, bool]], ttl_s: float, *, if_absent: bool = False
    ) -> list[int]:
        return await self._timed("register", self.inner.register(keys, ttl_s, if_absent=if_absent))

    async def claim(self, key: SequenceKey, ttl_s: float) -> Claim:
        return await self._timed("claim", self.inner.claim(key, ttl_s))

    async def release(
        self, key: SequenceKey, token: int, data: bytes, ttl_s: float, tombstone_ttl_s: float = 0.0
    ) -> bool:
        return await self._timed("release", self.inner.release(key, token, data, ttl_s, tombstone_ttl_s))

    async def end(self, items: list[tuple[SequenceKey, int]], tombstone_ttl_s: float) -> list[bool]:
        return await self._timed("end", self.inner.end(items, tombstone_ttl_s))

    async def refresh(self, items: list[tuple[SequenceKey, int]], ttl_s: float) -> list[bool]:
        return await self._timed("refresh", self.inner.refresh(items, ttl_s))

    async def request_handover(self, owner: str, key: SequenceKey) -> None:
        await self._timed("request_handover", self.inner.request_handover(owner, key))
