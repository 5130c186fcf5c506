"""Iterative sequences (``sequence_batching { iterative_sequence: true }``): one request stands
for a whole sequence, and the model runs it step after step by releasing it with
``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (its outcome is then ``RESCHEDULE``).

As in Triton:

- a request without a sequence id gets one of its own from a per-model counter starting at 1
  (it may meet a client's numeric id, as in Triton) and the START flag only;
- a rescheduled request is queued again with neither START nor END as its sequence's next
  step: at the front of its sequence's slot queue, ahead of the sequence's later steps (the
  core's ``requeue_front``; Triton queues it behind them), its implicit state carried, batched
  with the other sequences' steps; it keeps its inputs and its client (the same stream or
  response sender);
- a request released for good (not rescheduled, not an END) ends its sequence: the slot frees
  for the next sequence (the backlog's oldest first);
- a step that comes back later than ``max_sequence_idle_microseconds`` after it was queued
  (the first: after it started running) finds its sequence ended by the idle rule, and fails
  with the START error. The core's idle clock starts only when a START is answered; this check
  gives a running iterative step Triton's clock, which runs from the step's queueing.

Thread contract: ``queueing`` and ``submitted`` run on the event loop, ``after_batch`` on the
executor thread that ran the batch (the GIL held, no core lock); the step table, and a
request's handle and token once it is queued, are guarded by a lock. A request's step is noted
before the core has it: its executor may run it, and queue it again, before submit returns.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import RequestHeader, Scheduler
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.delivery import Delivery, Pending
from seqserve.engine.model.validation import CheckedRequest
from seqserve.engine.responses import RESCHEDULE

#: Triton's idle timeout when the config sets none
DEFAULT_IDLE_US = 1_000_000


@dataclass(slots=True, frozen=True)
class Step:
    """One queued step of an iterative sequence."""

    owner: int  # the handle of its sequence's START (0: a continued sequence, ended by id alone)
    queued_ns: int  # when it was queued again (0: its first step, timed from its batch's start)
    ends_itself: bool  # it carried END: its sequence ends without being ended here


def is_iterative(cfg: mc.ModelConfig) -> bool:
    return cfg.HasField("sequence_batching") and cfg.sequence_batching.iterative_sequence


def check_iterative(cfg: mc.ModelConfig, *, process: bool) -> None:
    """An iterative model runs in the server process: a rescheduled request goes back to the
    core from the thread that ran it."""
    if is_iterative(cfg) and process:
        raise InferenceError(
            Code.INVALID_ARG,
            f"model '{cfg.name}': an iterative sequence model (sequence_batching.iterative_sequence) runs in the "
            "server process: set parameter 'isolation' to 'thread'",
        )


def iterations_of(
    cfg: mc.ModelConfig,
    core: Scheduler,
    pending: dict[int, Pending],
    delivery: Delivery,
    new_handle: Callable[[], int],
) -> Iterations | None:
    """The rescheduling of an iterative model (None for the others)."""
    if not is_iterative(cfg):
        return None
    return Iterations(cfg, core=core, pending=pending, delivery=delivery, new_handle=new_handle)


class Iterations:
    """The rescheduling of one iterative model version's requests."""

    def __init__(
        self,
        cfg: mc.ModelConfig,
        *,
        core: Scheduler,
        pending: dict[int, Pending],
        delivery: Delivery,
        new_handle: Callable[[], int],
    ) -> None:
        self._name = cfg.name
        self._idle_ns = (cfg.sequence_batching.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000
        self._core = core
        self._pending = pending
        self._delivery = delivery
        self._new_handle = new_handle
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._steps: dict[int, Step] = {}  # request handle -> its step, while queued or running
        self.rescheduled = 0  # steps queued again

    # ------------------------------------------------------------------ event loop

    def queueing(self, checked: CheckedRequest, header: RequestHeader) -> RequestHeader:
        """A client's request goes to the core next (``forget`` it if the core refuses it): its
        step is noted, and the header it is queued with returned. A request without a sequence
        id starts a sequence of its own (START only)."""
        if checked.corrid not in (0, ""):
            step = Step(header.handle if header.start else 0, 0, header.end)
            with self._lock:
                self._steps[header.handle] = step
            return header
        with self._lock:
            checked.corrid = next(self._ids)
            self._steps[header.handle] = Step(header.handle, 0, False)
        return _with_flags(header, checked.corrid, start=True, end=False)

    def submitted(self, rec: Pending, handle: int, token: int) -> None:
        """The core accepted request ``handle`` with ``token``: the request's cancel token,
        unless its step has already run and been queued again (under a token of its own)."""
        with self._lock:
            if rec.handle == handle:
                rec.token = token

    def forget(self, handles: list[int]) -> None:
        """The core dropped these queued requests (they never ran)."""
        with self._lock:
            for h in handles:
                self._steps.pop(h, None)

    # ------------------------------------------------------------- executor thread

    def after_batch(self, recs: list[Pending | None], outcomes: list[object] | None, started_ns: int) -> None:
        """A batch has run (``outcomes`` None: it failed): its rescheduled requests are queued
        again, the sequences of the others end."""
        now = time.monotonic_ns()
        for i, rec in enumerate(recs):
            if rec is None:
                continue
            with self._lock:
                step = self._steps.pop(rec.handle, None)
            if step is None:
                continue
            corrid = rec.checked.corrid
            again = outcomes is not None and outcomes[i] is RESCHEDULE
            if not again or rec.closed or rec.is_cancelled():
                if not step.ends_itself:
                    self._core.end_owned_sequence(corrid, step.owner, "")
                if again and not rec.closed:  # its client is gone: close it
                    self._fail(rec, InferenceError(Code.CANCELLED, "the request was cancelled"))
                continue
            if now - (step.queued_ns or started_ns) > self._idle_ns:
                # idle past the limit while it ran: the sequence is over, and its next step
                # is refused by the core with the START error, as in Triton
                self._core.end_owned_sequence(corrid, step.owner, "")
            self._resubmit(rec, step)

    def _resubmit(self, rec: Pending, step: Step) -> None:
        handle = self._new_handle()
        header = _with_flags(rec.checked.core_header(handle), rec.checked.corrid, start=False, end=False)
        self._pending[handle] = rec
        with self._lock:
            self._steps[handle] = Step(step.owner, time.monotonic_ns(), False)
        token = self._core.requeue_front(header, rec.checked.buffers)
        if not isinstance(token, int):
            self._pending.pop(handle, None)
            self.forget([handle])
            self._fail(rec, InferenceError(token.code, token.message))
            return
        self.rescheduled += 1
        with self._lock:
            rec.handle = handle
            rec.token = token
        if rec.is_cancelled():  # its client left while it was being queued again
            self._core.cancel(token, handle)

    def _fail(self, rec: Pending, err: InferenceError) -> None:
        with contextlib.suppress(InferenceError):  # raised when it was already answered for good
            self._delivery.responder([rec], 0).send(err, final=True)


def _with_flags(header: RequestHeader, corrid: int | str, *, start: bool, end: bool) -> RequestHeader:
    return RequestHeader(
        handle=header.handle,
        sequence_id=corrid,
        start=start,
        end=end,
        session=False,
        timeout_us=header.timeout_us,
        rows=header.rows,
        priority=header.priority,
        client=header.client,
    )
