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
from collections import defaultdict
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

    __slots__ = ("_ids", "_instances", "_waits")

    def __init__(self) -> None:
        self._waits: dict[int, Wait] = {}
        self._instances: dict[ModelKey, int] = {}  # instance counts of the models seen
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._waits)

    def add(self, wait: Wait, caller_instances: int, callee_instances: int) -> int:
        """Record a call in flight; returns its id (for ``done``)."""
        self._instances[wait.caller] = caller_instances
        self._instances[wait.callee] = callee_instances
        key = next(self._ids)
        self._waits[key] = wait
        return key

    def done(self, key: int) -> None:
        self._waits.pop(key, None)

    def would_deadlock(self, wait: Wait, caller_instances: int, callee_instances: int) -> list[str]:
        """The names of the models that would be stuck waiting on each other with ``wait``
        added, the caller among them; [] when the call can go."""
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
