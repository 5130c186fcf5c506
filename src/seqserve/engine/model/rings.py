"""Requests from the workers' rings (issue 27) in one model version's batches.

A target on the compiled path (``RingFeeder.add_target(..., fast=True)``) has its requests
submitted by the feeder's drain thread with ring handles (``RING_HANDLE_BIT`` set): they have
no ``Pending`` here, and nothing in Python runs for them but this, once per batch: their rows
are the model's like any others; after ``execute`` their outputs (every configured output, in
config order: the worker keeps what its client asked for) go to ``RingFeeder.reply_batch`` in
one call, which copies each request's rows into the worker's blocks and pushes its reply in
C++. Their refusals, cancellations and the scheduler's failures are answered in C++ too; a
batch that fails here answers its ring rows through ``RingFeeder.fail``.

What goes the slow way (``ring_slow_reason``): anything that needs Python per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import RING_HANDLE_BIT, Batch, RingFeeder, Scheduler
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.delivery import Pending
from seqserve.engine.model.validation import CheckedRequest
from seqserve.engine.request import InferRequest
from seqserve.engine.tensors import to_numpy_dtype, wire_dtype_name

#: the model's failure report: logs a failed request, returns what its client gets
FailureNote = Callable[[Pending, InferenceError], InferenceError]


def ring_slow_reason(cfg: mc.ModelConfig, *, per_request: bool) -> str | None:
    """Why a model's ring requests need the engine's Python path, or None when the compiled
    path serves them: decoupled models, and ``per_request`` (instances that use responders, an
    execute timeout's watchdog: they answer request by request), BYTES tensors (serialized per
    request), ragged inputs, preserve_ordering (replies released in submit order). Server-wide
    reasons (tracing, a state store, replicas) are the caller's ``fast=False``."""
    if cfg.model_transaction_policy.decoupled:
        return "decoupled model"
    if per_request:
        return "its instances answer request by request (responders, an execute timeout)"
    if any(t.data_type == mc.TYPE_STRING for t in cfg.input) or any(t.data_type == mc.TYPE_STRING for t in cfg.output):
        return "BYTES tensors"
    if any(t.allow_ragged_batch for t in cfg.input):
        return "ragged inputs"
    if cfg.dynamic_batching.preserve_ordering:
        return "preserve_ordering"
    return None


def attach_rings(
    cfg: mc.ModelConfig,
    core: Scheduler,
    feeder: RingFeeder,
    target: int,
    *,
    fast: bool,
    per_request: bool,
) -> RingRows | None:
    """Register the model version as ``target``: on the compiled path when ``fast`` and nothing
    in the model needs Python per request (returns its RingRows), else the slow way (None)."""
    if not fast or ring_slow_reason(cfg, per_request=per_request) is not None:
        feeder.add_target(target, core, fast=False)
        return None
    # A cheap Python model keeps its inline mode (model/inline.py): the drain thread that submits
    # its records then runs its batches itself (RingFeeder::run_inline), as the event loop does.
    feeder.add_target(target, core, fast=True, input_dims=[list(t.dims) for t in cfg.input])
    return RingRows(cfg, feeder, target)


class RingRows:
    """The ring requests of one model version's batches."""

    def __init__(self, cfg: mc.ModelConfig, feeder: RingFeeder, target: int) -> None:
        self.feeder = feeder
        self.target = target
        self._name = cfg.name
        self._is_sequence = cfg.HasField("sequence_batching")
        self.batched = cfg.max_batch_size > 0
        self._outputs = [(t.name, np.dtype(to_numpy_dtype(t.data_type)), t.data_type) for t in cfg.output]
        #: (name, dtype) per configured output, as RingFeeder.complete_batch checks them
        self.output_dtypes = [(name, dtype) for name, dtype, _ in self._outputs]
        # instance -> the batch it runs, whose ring rows close() answers when its execute hangs past
        # the exit timeout (read then: the batch stays valid while execute has not returned)
        self._running: dict[int, Batch] = {}

    def detach(self) -> None:
        """The model closes: its target's records go to take_slow from now on (the engine answers
        them: the model is gone); replies of requests in flight still come here."""
        self.feeder.remove_target(self.target)

    def refused(self) -> int:
        """Its requests the compiled path refused: failed requests, as submit's refusals are."""
        return self.feeder.refused(self.target)

    def rejected(self) -> int:
        """Of those, the refusals with UNAVAILABLE: REJECTED, as submit's are (a full queue)."""
        return self.feeder.rejected(self.target)

    def batch(self, cb: Batch) -> RingBatch | None:
        """The batch's ring rows, or None when it has none (found in C++: no per-row Python)."""
        handles = RingFeeder.ring_handles(cb)
        if not handles:
            return None
        self._running[cb.instance] = cb
        return RingBatch(self, cb)

    def begin(self, cb: Batch) -> None:
        """A batch of ring rows only starts on its instance (RingOnlyRunner)."""
        self._running[cb.instance] = cb

    def done(self, instance: int) -> bool:
        """The instance's batch has run: its ring rows are answered by the batch. False when
        they were answered already (fail_running: its execute outlived the exit timeout)."""
        return self._running.pop(instance, None) is not None

    def fail_running(self, instance: int, err: InferenceError) -> None:
        """The instance's execute did not return in time: its batch's ring requests get ``err``."""
        cb = self._running.pop(instance, None)  # still valid: its execute has not returned
        handles = RingFeeder.ring_handles(cb) if cb is not None else []
        if handles:
            self.feeder.fail(handles, int(err.code), err.message)

    def fail(self, cb: Batch, err: InferenceError, report: FailureNote | None = None) -> None:
        """The batch failed: its ring requests get the error; ``report`` (the model's failure
        report) logs each as one process does and gives the words its client gets (a request id
        made here: the worker's request carries none)."""
        handles = cb.handles
        self.done(cb.instance)
        if not any(h & RING_HANDLE_BIT for h in handles):
            return
        if report is None:
            self.feeder.fail([h for h in handles if h & RING_HANDLE_BIT], int(err.code), err.message)
            return
        corrids = cb.corrid if self._is_sequence else None
        row = 0
        for h, n in zip(handles, cb.request_rows, strict=True):
            if h & RING_HANDLE_BIT:
                corrid = int(corrids[row]) if corrids is not None and row < len(corrids) else 0
                request = InferRequest(model=self._name, inputs={}, sequence_id=corrid)
                rec = Pending(CheckedRequest(request, (), n, (), corrid), None, None, None, False)
                told = report(rec, err)
                self.feeder.fail([h], int(told.code), told.message)
            row += n

    def outputs(self, produced: Mapping[str, Any], size: int) -> list[np.ndarray | None]:
        """Every configured output as reply_rows reads it; INTERNAL for one the model got wrong."""
        out: list[np.ndarray | None] = []
        for name, dtype, data_type in self._outputs:
            value = produced.get(name)
            if value is None:  # not produced: the worker answers a client that asked for it
                out.append(None)
                continue
            arr = np.ascontiguousarray(value)
            if arr.dtype != dtype:
                raise InferenceError(
                    Code.INTERNAL,
                    f"model '{self._name}' produced output '{name}' as {arr.dtype}, but its config says "
                    f"{wire_dtype_name(data_type)}",
                )
            if self.batched and (arr.ndim == 0 or arr.shape[0] != size):
                raise InferenceError(
                    Code.INTERNAL,
                    f"model '{self._name}' produced output '{name}' with shape {list(arr.shape)}; "
                    f"expected batch dimension {size}",
                )
            out.append(arr)
        return out


class RingBatch:
    """One batch's ring rows: the core's batch (where each lies is read from it in C++), and
    once the model ran, their outputs."""

    def __init__(self, rows: RingRows, cb: Batch) -> None:
        self._rows = rows
        self._cb = cb
        self._outputs: list[np.ndarray | None] = []

    def take(self, produced: Mapping[str, Any], size: int) -> None:
        """After execute (raises InferenceError when the outputs are unusable)."""
        self._outputs = self._rows.outputs(produced, size)

    def send(self) -> None:
        """After the batch's statistics are recorded (the batch still valid): every ring row's
        reply, in one call."""
        rows = self._rows
        rows.done(self._cb.instance)
        rows.feeder.reply_batch(self._cb, self._outputs, batched=rows.batched)
