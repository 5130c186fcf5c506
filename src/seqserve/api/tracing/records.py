"""A sampled request's trace, and what it becomes: entries of Triton's JSON trace file
(``TraceFile``) or OpenTelemetry spans (``tracing.otel``). Also the durations that the latency
summaries observe, read off the same timestamps."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from seqserve.engine import InferenceError, InferResult
from seqserve.engine.tensors import numpy_wire_name
from seqserve.engine.tracing import (
    COMPUTE_END,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_START,
    QUEUE_START,
    REQUEST_END,
    REQUEST_START,
    RequestTrace,
    TracedRequest,
)

log = logging.getLogger("seqserve.trace")

_ids = itertools.count(1)


class Durations:
    """A request's durations in nanoseconds (None where a timestamp is missing: a request that
    failed before it ran has no compute times), as Triton's statistics split them."""

    __slots__ = ("compute_infer", "compute_input", "compute_output", "queue", "request")

    def __init__(self, stamps: dict[str, int]) -> None:
        self.request = _between(stamps, REQUEST_START, REQUEST_END)
        self.queue = _between(stamps, QUEUE_START, COMPUTE_START)
        self.compute_input = _between(stamps, COMPUTE_START, COMPUTE_INPUT_END)
        self.compute_infer = _between(stamps, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START)
        self.compute_output = _between(stamps, COMPUTE_OUTPUT_START, COMPUTE_END)


def _between(stamps: dict[str, int], a: str, b: str) -> int | None:
    if a in stamps and b in stamps:
        return max(0, stamps[b] - stamps[a])
    return None


class ObservedRequest(RequestTrace):
    """A request timed for the latency summaries only (``--metrics-config summary_latencies``)."""

    __slots__ = ("observe",)
    wants_slot = False

    def __init__(
        self, request: TracedRequest, model: str, version: str, observe: Callable[[RequestTrace], None]
    ) -> None:
        super().__init__(request, model, version)
        self.observe = observe

    def answered(self, outcome: Any) -> None:
        self.stamp(REQUEST_END)
        if not isinstance(outcome, InferenceError):
            self.observe(self)


class SampledTrace(ObservedRequest):
    """A request sampled for tracing: written out (``sink``) once answered."""

    __slots__ = ("id", "outcome", "sink", "tensors")
    wants_slot = True

    def __init__(
        self,
        request: TracedRequest,
        model: str,
        version: str,
        observe: Callable[[RequestTrace], None],
        sink: Callable[[SampledTrace], None],
        *,
        tensors: bool,
    ) -> None:
        super().__init__(request, model, version, observe)
        self.id = next(_ids)
        self.sink = sink
        self.tensors = tensors
        self.outcome: Any = None

    def answered(self, outcome: Any) -> None:
        super().answered(outcome)
        self.outcome = outcome
        try:
            self.sink(self)
        except Exception:  # a trace that cannot be written must not fail the request's reply
            log.exception("trace %d of model '%s' could not be written", self.id, self.model)

    def facts(self) -> dict[str, Any]:
        """What seqserve adds to Triton's: the sequence and the batch it ran in."""
        r = self.request
        return {
            "sequence_id": r.sequence_id,
            "sequence_start": r.sequence_start,
            "sequence_end": r.sequence_end,
            "slot": self.slot,
            "batch_size": self.batch_size,
            "instance": self.instance,
        }

    def file_entries(self) -> list[dict[str, Any]]:
        """The trace as Triton's JSON trace file has it: the model entry, one entry per
        timestamp, and (level TENSORS) one per input and output tensor."""
        r = self.request
        head: dict[str, Any] = {
            "id": self.id,
            "model_name": self.model,
            "model_version": int(self.version) if self.version.isdigit() else -1,
            "request_id": r.id,
            "parent_id": 0,
            **self.facts(),
        }
        out = [head]
        out += [{"id": self.id, "timestamps": [{"name": n, "ns": ns}]} for n, ns in self.timestamps]
        if self.tensors:
            out += [_tensor_entry(self.id, "TENSOR_QUEUE_INPUT", n, a) for n, a in r.inputs.items()]
            if isinstance(self.outcome, InferResult):
                out += [_tensor_entry(self.id, "TENSOR_BACKEND_OUTPUT", n, a) for n, a in self.outcome.outputs.items()]
        return out


def _tensor_entry(trace_id: int, activity: str, name: str, arr: np.ndarray) -> dict[str, Any]:
    values = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in np.asarray(arr).ravel())
    dtype = "BYTES" if arr.dtype.kind in "OSU" else numpy_wire_name(arr.dtype)
    return {
        "id": trace_id,
        "activity": activity,
        "tensor": {"name": name, "data": ",".join(values), "shape": ",".join(map(str, arr.shape)), "dtype": dtype},
    }


class TraceFile:
    """Triton's trace file: a JSON array of trace entries. With ``log_frequency`` N > 0, every N
    traces go to ``<file>.<k>`` (k = 0, 1, ...); with 0 they are kept and written to ``<file>``
    when tracing stops (at exit). Whatever is left at close goes out then."""

    def __init__(self, path: str, log_frequency: int) -> None:
        self.path = path
        self.log_frequency = log_frequency
        self._entries: list[dict[str, Any]] = []
        self._traces = 0
        self._index = 0
        self._lock = threading.Lock()

    def add(self, trace: SampledTrace) -> None:
        with self._lock:
            self._entries += trace.file_entries()
            self._traces += 1
            if self.log_frequency and self._traces >= self.log_frequency:
                self._write_indexed()

    def close(self) -> None:
        with self._lock:
            if not self._entries:
                return
            if self.log_frequency:
                self._write_indexed()
            else:
                _write(Path(self.path), self._entries)
                self._entries = []

    def _write_indexed(self) -> None:
        _write(Path(f"{self.path}.{self._index}"), self._entries)
        self._index += 1
        self._entries = []
        self._traces = 0


def _write(path: Path, entries: list[dict[str, Any]]) -> None:
    try:
        path.write_bytes(orjson.dumps(entries, option=orjson.OPT_SERIALIZE_NUMPY))
    except OSError as e:
        log.error("cannot write the trace file %s: %s", path, e)
