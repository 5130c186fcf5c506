"""``execute_timeout_ms`` for instances that run in the server process (thread isolation).

A thread cannot be stopped from outside, so an overrunning ``execute`` keeps its instance
busy until it returns. What the watchdog can do safely is answer the batch's clients: at the
deadline it fails the batch's requests (``Delivery.batch_failed``, which closes them, so
nothing the model sends or returns later reaches a client), and when ``execute`` finally
returns the batch is treated as failed, so the core keeps every sequence's previous state
(but for what the model wrote in place into a ``use_same_buffer_for_input_output`` state).
The core itself is never touched from the watchdog thread.

Process-isolated instances do better: the server kills and restarts the child
(``seqserve.engine.isolation``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from seqserve.engine.errors import Code, InferenceError

log = logging.getLogger("seqserve.model")


class _Ticket:
    __slots__ = ("deadline", "done", "fired", "instance", "recs")

    def __init__(self, deadline: float, recs: list[Any], instance: int) -> None:
        self.deadline = deadline
        self.recs = recs
        self.instance = instance
        self.done = False
        self.fired = False


class ExecuteWatchdog:
    """One per model with a timeout and in-process instances; one thread, started lazily."""

    def __init__(
        self,
        model: str,
        instance_names: list[str],
        timeout_s: float,
        fail: Callable[[list[Any], InferenceError], None],
    ) -> None:
        self._model = model
        self._instances = instance_names
        self._timeout_s = timeout_s
        self._fail = fail
        self._cond = threading.Condition(threading.Lock())
        # Every ticket has the same timeout, so deadlines come in arming order.
        self._armed: collections.deque[_Ticket] = collections.deque()
        self._thread: threading.Thread | None = None
        self._closed = False

    def error(self, instance: int) -> InferenceError:
        name = self._instances[instance] if 0 <= instance < len(self._instances) else str(instance)
        return InferenceError(
            Code.UNAVAILABLE,
            f"model '{self._model}' instance '{name}' did not finish execute within "
            f"{round(self._timeout_s * 1000)} ms (thread isolation: the instance cannot be stopped and stays "
            "busy until execute returns)",
        )

    def call(self, execute: Callable[[Any], Mapping[str, Any]], batch: Any, recs: list[Any]) -> Mapping[str, Any]:
        """``execute(batch)``, failing ``recs`` at the deadline; raises the timeout error when
        the deadline passed, whatever execute did."""
        ticket = _Ticket(time.monotonic() + self._timeout_s, recs, batch.instance)
        with self._cond:
            idle = not self._armed
            self._armed.append(ticket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=f"{self._model}-watchdog", daemon=True)
                self._thread.start()
            elif idle:
                self._cond.notify()
        try:
            return execute(batch)
        finally:
            with self._cond:
                ticket.done = True
                fired = ticket.fired
            if fired:
                raise self.error(ticket.instance)  # the timeout is the batch's outcome

    def _watch(self) -> None:
        cond = self._cond
        while True:
            with cond:
                armed = self._armed
                while True:
                    if self._closed:
                        return
                    while armed and armed[0].done:
                        armed.popleft()
                    if not armed:
                        cond.wait()
                        continue
                    delay = armed[0].deadline - time.monotonic()
                    if delay > 0:
                        cond.wait(delay)
                        continue
                    ticket = armed.popleft()
                    ticket.fired = True
                    break
            err = self.error(ticket.instance)
            log.error("%s; its requests failed", err.message)
            try:
                self._fail(ticket.recs, err)
            except Exception:
                log.exception("model '%s': failing the requests of a timed-out batch failed", self._model)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
