"""Late responses of a process-isolated instance: the responders of the batches whose model
answers (some of) its requests through them, after ``execute`` returned or several times
(decoupled models), relayed from the child's event channel to the engine's ``Responder``s.

Threads: the core's executor thread opens a batch's entry before sending it and settles it
once ``execute`` is over; the child's event thread relays responses; the reaper fails what a
dead child still owed. One lock guards the table.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation import protocol as p
from seqserve.engine.isolation import results
from seqserve.engine.isolation.child_process import ChildProcess
from seqserve.engine.responses import Responder

CLOSED_SENDER = "Unable to send response. Response sender has been closed."


class BatchResponders:
    """The responders of one batch, made on first use."""

    __slots__ = ("child", "done", "factory", "finished", "open", "responders")

    def __init__(self, child: ChildProcess, factory: Callable[[int], Responder]) -> None:
        self.child = child
        self.factory = factory
        self.responders: dict[int, Responder] = {}
        self.finished: set[int] = set()  # requests that got their final response
        self.open: set[int] = set()  # requests still owed a final response, once done
        self.done = False  # execute has returned (or failed)

    def responder(self, index: int) -> Responder:
        r = self.responders.get(index)
        if r is None:
            r = self.responders[index] = self.factory(index)
        return r


class LateResponses:
    """One instance's batches that may still be answered, by batch token."""

    def __init__(self) -> None:
        self._open: dict[int, BatchResponders] = {}
        self._lock = threading.Lock()

    def open(self, token: int, child: ChildProcess, factory: Callable[[int], Responder]) -> BatchResponders:
        """A batch about to be sent to ``child`` whose requests may be answered late."""
        entry = BatchResponders(child, factory)
        with self._lock:
            self._open[token] = entry
        return entry

    def settle(self, token: int, entry: BatchResponders | None, owed: set[int] | None) -> None:
        """Execute is over: keep the batch's responders while the model owes responses (made
        now, so that the engine counts those requests as open until they are answered)."""
        if entry is None:
            return
        with self._lock:
            entry.done = True
            entry.open = (owed or set()) - entry.finished
            for index in entry.open:
                entry.responder(index)
            if not entry.open:
                self._open.pop(token, None)

    def relay(self, child: ChildProcess, kind: int, token: int, index: int, final: bool, outcome: Any) -> bytes:
        """A SEND or CANCELLED query from ``child``'s model: the answer to send back."""
        with self._lock:
            entry = self._open.get(token)
            if entry is not None and entry.child is not child:
                entry = None
            responder = None
            if entry is not None:
                try:
                    responder = entry.responder(index)
                except IndexError:
                    responder = None
        if kind == p.CANCELLED:
            return results.encode_bool(responder is None or responder.is_cancelled())
        if responder is None:
            return p.code_message(p.ERR, Code.INTERNAL, CLOSED_SENDER)
        try:
            responder.send(outcome, final=final)
        except InferenceError as e:
            return p.code_message(p.ERR, e.code, e.message)
        finally:
            if final:
                self._finished(token, entry, index)
        return results.encode_ok()

    def _finished(self, token: int, entry: BatchResponders | None, index: int) -> None:
        if entry is None:
            return
        with self._lock:
            entry.finished.add(index)
            if entry.done:
                entry.open.discard(index)
                if not entry.open:
                    self._open.pop(token, None)

    def fail(self, child: ChildProcess, err: InferenceError) -> None:
        """``child`` died: the requests it still owed a final response get the error."""
        with self._lock:
            owed = [(t, e) for t, e in self._open.items() if e.child is child and e.done]
            for t, _e in owed:
                del self._open[t]
        for _t, entry in owed:
            for index in sorted(entry.open):
                with contextlib.suppress(InferenceError):  # already answered
                    entry.responder(index).send(InferenceError(err.code, err.message), final=True)

    def clear(self) -> None:
        with self._lock:
            self._open.clear()
