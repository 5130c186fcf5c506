"""Which model instances wait on calls (BLS), and whether a new call would close a circle of
waits that nothing can break: every instance of every model in it waiting on a call that needs
an instance of a model in it (A calls B, B calls A, and A's instances are all waiting).

An instance is known by the thread that waits (its executor thread, or its own event loop's for
an ``async def execute``). A model is stuck when all of its instances wait and each of them
waits on (at least) one stuck model; the stuck models are the largest set with that property. A
call whose caller would then be stuck is refused instead of hanging. Event loop only.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

#: a model version
ModelKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Wait:
    caller: ModelKey
    thread: int  # the waiting thread: one instance of the caller
    callee: ModelKey


class WaitGraph:
    """The calls in flight from model instances, and the circle check."""

    __slots__ = ("_ids", "_instances", "_threads", "_waits")

    def __init__(self) -> None:
        self._waits: dict[int, Wait] = {}
        self._instances: dict[ModelKey, int] = {}  # instance counts of the models seen
        # per model, its waiting threads and their calls in flight: the cheap first check
        self._threads: dict[ModelKey, Counter[int]] = defaultdict(Counter)
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._waits)

    def add(self, wait: Wait, caller_instances: int, callee_instances: int) -> int:
        """Record a call in flight; returns its id (for ``done``)."""
        self._instances[wait.caller] = caller_instances
        self._instances[wait.callee] = callee_instances
        key = next(self._ids)
        self._waits[key] = wait
        self._threads[wait.caller][wait.thread] += 1
        return key

    def done(self, key: int) -> None:
        wait = self._waits.pop(key, None)
        if wait is None:
            return
        threads = self._threads[wait.caller]
        threads[wait.thread] -= 1
        if threads[wait.thread] <= 0:
            del threads[wait.thread]
            if not threads:
                del self._threads[wait.caller]

    def would_deadlock(self, wait: Wait, caller_instances: int, callee_instances: int) -> list[str]:
        """The names of the models that would be stuck waiting on each other with ``wait``
        added, the caller among them; [] when the call can go."""
        callee_threads = self._threads.get(wait.callee)
        if callee_threads is None or len(callee_threads) < callee_instances:
            return []  # an instance of the callee is not waiting: it can answer
        instances = {**self._instances, wait.caller: caller_instances, wait.callee: callee_instances}
        waits = [*self._waits.values(), wait]
        threads: dict[ModelKey, dict[int, set[ModelKey]]] = defaultdict(lambda: defaultdict(set))
        for w in waits:
            threads[w.caller][w.thread].add(w.callee)
        stuck = {m for m, by_thread in threads.items() if len(by_thread) >= instances.get(m, 1)}
        changed = True
        while changed:  # drop a model that has an instance waiting only on models that can answer
            changed = False
            for m in list(stuck):
                if any(not (callees & stuck) for callees in threads[m].values()):
                    stuck.discard(m)
                    changed = True
        if wait.caller not in stuck:
            return []
        return sorted({name for name, _ in stuck})
