"""The batch runner for batches whose every row came from the workers' rings (issue 27).

Under ``serve --workers N`` a busy model's batches usually hold ring rows only: requests that
the feeder's drain thread submitted in C++, with no ``Pending`` in Python. Such a batch needs
none of the per-request Python of ``LoadedModel._run_batch`` (traces, responders, the reply
split, the request log's lines, device state tables), so it runs here with the least Python a
batch can have: its ``ExecuteBatch``, the model's ``execute``, its output states, and one call
that answers every row (``RingFeeder.reply_batch``). Python per batch is the engine's cost per
step when the batches are small (bench/docs/workers.md: "The engine's CPU per step"), so
every attribute lookup here is one that a batch pays for.

``LoadedModel`` uses it only where nothing else applies: a compiled-path target, no iterative
scheduling, no device state tables, and no request of the batch pending in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from seqserve.engine._core import Batch
from seqserve.engine.batch import ExecuteBatch, StateViews
from seqserve.engine.model.rings import RingRows
from seqserve.engine.model.spec import CoreSpec

Execute = Callable[[ExecuteBatch], Mapping[str, Any]]
#: the model's failure path for a batch (batch, its Pending requests: none here, the error):
#: answers its requests, returns False
BatchFailed = Callable[[Batch, list[Any], Exception], bool]


class RingExecuteBatch(ExecuteBatch):
    """The ``ExecuteBatch`` of a ring-only batch: the fields a model may not read (controls,
    flags, ids, per-request lists) are made from the core batch on first access, so that a
    model reading its inputs and states pays for those only. Like the arrays, they are only
    valid during ``execute`` (the core batch says so when read later)."""

    __slots__ = ("_core_batch",)

    def __init__(self, cb: Batch, instance: int, states: Mapping[str, np.ndarray], batched: bool) -> None:
        self._core_batch = cb
        self.size = cb.size
        self.instance = instance
        self.inputs = cb.inputs()
        self.states = states
        self.batched = batched
        self.responder = None  # ring requests never carry one

    def __getattr__(self, name: str) -> Any:
        # only called for a field not set yet (an unset slot)
        cb = self._core_batch
        value: Any
        if name in ("start", "end", "ready", "corrid", "request_rows"):
            value = getattr(cb, name)
        elif name == "controls":
            value = cb.controls()
        elif name in ("ragged", "_next_states"):
            value = {}
        elif name in ("request_outputs", "request_ids", "request_parameters"):
            # Ring requests carry no request id, parameters or output list (those go the slow
            # way): every output goes back, and the worker keeps what was asked for.
            n = len(self.request_rows)
            if name == "request_parameters":
                value = [{} for _ in range(n)]
            else:
                value = [None if name == "request_outputs" else ""] * n
        else:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        setattr(self, name, value)
        return value


class RingOnlyRunner:
    """Runs one model version's batches of ring rows only (see the module's docstring)."""

    def __init__(
        self,
        rows: RingRows,
        executes: Sequence[Execute],
        spec: CoreSpec,
        failed: BatchFailed,
    ) -> None:
        """``executes``: each instance's ``execute``; ``failed``: the model's failure path."""
        self._rows = rows
        self._executes = tuple(executes)
        self._state_names = spec.state_names
        self._state_outputs = list(spec.state_outputs)
        self._batched = rows.batched
        self._failed = failed

    def run(self, cb: Batch) -> bool:
        rows = self._rows
        instance = cb.instance
        rows.begin(cb)
        try:
            states = StateViews(self._state_names, cb) if self._state_names else {}
            batch = RingExecuteBatch(cb, instance, states, self._batched)
            produced = self._executes[instance](batch)
        except Exception as e:  # the model's failure fails this batch only
            if not rows.done(instance):  # too late: close() answered its rows
                cb.finish(False)
                return False
            return self._failed(cb, [], e)
        if not rows.done(instance):
            cb.finish(False)
            return False
        try:
            # one core call stores the states, records the batch and replies; False: an output
            # needs converting or is wrong, for the checked path below
            if rows.feeder.complete_batch(cb, produced, self._state_outputs, rows.output_dtypes, self._batched):
                return True
            cb.mark_executed()
            for index, name in self._state_outputs:
                value = produced.get(name)
                if value is not None:
                    cb.set_state(index, np.asarray(value))
            outputs = rows.outputs(produced, cb.size)
        except Exception as e:
            return self._failed(cb, [], e)
        cb.finish(True)  # statistics first: a client that has its reply sees them counted
        rows.feeder.reply_batch(cb, outputs, batched=self._batched)
        return True
