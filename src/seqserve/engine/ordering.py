"""Head-of-line ordered release: answers go out in the order their requests came, each as
soon as it and every answer before it are known.

Used by a model's delivery for ``preserve_ordering`` and by the gRPC stream, which writes
its replies in request order as Triton does. A slot is any object with an ``outcome``
attribute that is None until its answer is known; the owner sets it, then calls
``release_ready`` (once per batch of answers is enough).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar


class Slot(Protocol):
    outcome: Any  # None while the answer is not known


S = TypeVar("S", bound=Slot)


class OrderedRelease(Generic[S]):
    """Slots released in the order they were added, to ``release``, once their outcome is set."""

    __slots__ = ("_release", "_waiting")

    def __init__(self, release: Callable[[S], None]) -> None:
        self._release = release
        self._waiting: collections.deque[S] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def head(self) -> S | None:
        """The first slot still waiting, if any."""
        return self._waiting[0] if self._waiting else None

    def held_back(self) -> int:
        """How many waiting slots have their outcome: the head holds them back. O(waiting)."""
        return sum(slot.outcome is not None for slot in self._waiting)

    def add(self, slot: S) -> None:
        """Take the next place in line (``slot.outcome`` still None)."""
        self._waiting.append(slot)

    def withdraw(self, slot: S) -> None:
        """Take ``slot`` out of the line: its answer goes out apart, at once. O(1) for the slot
        added last (the usual case: refused as it was added), else O(waiting)."""
        waiting = self._waiting
        if waiting and waiting[-1] is slot:
            waiting.pop()
        else:
            waiting.remove(slot)
        self.release_ready()  # it may have been the head

    def release_ready(self) -> None:
        """Release the slots at the head of the line whose outcome is set."""
        waiting = self._waiting
        while waiting and waiting[0].outcome is not None:
            self._release(waiting.popleft())
