"""The engine's side of request tracing: a traced request carries a ``RequestTrace`` that the
engine stamps at the points only it sees (queued, compute start, inputs ready, outputs
produced, compute end) and tells when the request is answered. Which requests are traced, and
what becomes of a trace, is the tracer's business (``seqserve.api.tracing``): the engine asks
``Server.tracer`` (None: tracing off, and nothing is stamped or checked beyond that None).

Timestamps are ``time.monotonic_ns()`` (a steady clock, as Triton's trace files have them) under
Triton's names.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Protocol

import numpy as np

REQUEST_START = "REQUEST_START"
QUEUE_START = "QUEUE_START"
COMPUTE_START = "COMPUTE_START"
COMPUTE_INPUT_END = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START = "COMPUTE_OUTPUT_START"
COMPUTE_END = "COMPUTE_END"
REQUEST_END = "REQUEST_END"


class TracedRequest(Protocol):
    """What a trace reads of its request (an ``InferRequest``; named here without importing it,
    since a request refers to its trace)."""

    id: str
    inputs: dict[str, np.ndarray]
    sequence_id: int | str
    sequence_start: bool
    sequence_end: bool
    trace_parent: str


class RequestTrace:
    """What is known of one traced request: its timestamps by name and the batch it ran in.
    ``answered`` is called once, on the event loop, with the request's final outcome (an
    InferResult, an InferenceError or None); a tracer subclasses this to write the trace."""

    __slots__ = ("batch_size", "instance", "model", "request", "slot", "timestamps", "version")
    #: look up the sequence's slot (a lock of the core's per lookup); a trace that only times the
    #: request (the latency summaries) does without
    wants_slot: ClassVar[bool] = True

    def __init__(self, request: TracedRequest, model: str, version: str) -> None:
        self.request = request
        self.model = model
        self.version = version
        self.timestamps: list[tuple[str, int]] = [(REQUEST_START, time.monotonic_ns())]
        self.batch_size = 0
        self.instance = -1
        self.slot = -1  # the sequence's global slot (-1: not a sequence model, or not known)

    def stamp(self, name: str) -> None:
        self.timestamps.append((name, time.monotonic_ns()))

    def ran(self, *, batch_size: int, instance: int, slot: int) -> None:
        """Compute starts: the batch it is part of."""
        self.timestamps.append((COMPUTE_START, time.monotonic_ns()))
        self.batch_size = batch_size
        self.instance = instance
        if slot >= 0:  # else the slot seen when it was queued stays
            self.slot = slot

    def answered(self, outcome: Any) -> None:
        """The request is answered for good (event loop)."""


class RequestTracer(Protocol):
    """Decides which requests are traced (``Server.tracer``)."""

    def sample(self, request: TracedRequest, model: str, version: str) -> RequestTrace | None:
        """A trace for ``request`` to ``model`` (``version``: the version it runs on), or None."""
        ...
