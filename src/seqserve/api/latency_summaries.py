"""Triton's latency summaries (``--metrics-config summary_latencies=true``): per model version,
quantiles of the request, queue, compute input, compute infer and compute output durations over
a sliding window (60 s in 5 age buckets, prometheus-cpp's defaults, which Triton uses), plus
their ``_count`` and ``_sum``.

Requests are timed through the trace hook (``seqserve.engine.tracing``): while summaries are on
every request carries a ``RequestTrace``, and its durations are observed here when it is
answered (failed requests are not observed, as in Triton). The quantiles are exact over the
window's samples; a bucket keeps at most ``MAX_BUCKET_SAMPLES`` of them (a uniform reservoir past
that), so memory stays bounded at any request rate."""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass

from seqserve.api.tracing.records import Durations
from seqserve.engine.tracing import RequestTrace

#: Triton's default quantiles and their allowed errors (quantile: error)
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.0001),
)
MAX_AGE_S = 60.0
AGE_BUCKETS = 5
MAX_BUCKET_SAMPLES = 10_000

#: (family, help, Durations attribute), as Triton names them
SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        "request",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Summary of compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Summary of compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Summary of compute output duration in microseconds (does not include cached requests)",
        "compute_output",
    ),
)


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """``summary_quantiles`` as Triton takes it: ``<quantile>:<error>,...``; ValueError if not."""
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        q, sep, err = part.strip().partition(":")
        try:
            quantile, error = float(q), float(err)
        except ValueError:
            raise ValueError(f"summary_quantiles: '{part.strip()}' is not <quantile>:<error>") from None
        if not sep or not 0.0 <= quantile <= 1.0 or not 0.0 <= error <= 1.0:
            raise ValueError(f"summary_quantiles: '{part.strip()}' needs a quantile and an error within [0, 1]")
        out.append((quantile, error))
    if not out:
        raise ValueError("summary_quantiles: no quantile given")
    return tuple(out)


class SlidingSummary:
    """Observations over the last ``MAX_AGE_S`` seconds (in ``AGE_BUCKETS`` rotating buckets),
    with a running count and sum since the start. Event loop only."""

    __slots__ = ("_buckets", "_last", "_rng", "_seen", "_started", "count", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self._buckets: list[list[float]] = [[] for _ in range(AGE_BUCKETS)]
        self._seen = [0] * AGE_BUCKETS  # observations offered to each bucket (for the reservoir)
        self._started = time.monotonic()
        self._last = 0  # the age slot of the latest rotation
        self._rng = random.Random(0)

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        i = self._rotate()
        bucket = self._buckets[i]
        self._seen[i] += 1
        if len(bucket) < MAX_BUCKET_SAMPLES:
            bucket.append(value)
        else:
            j = self._rng.randrange(self._seen[i])
            if j < MAX_BUCKET_SAMPLES:
                bucket[j] = value

    def quantiles(self, qs: Iterable[float]) -> list[tuple[float, float]]:
        """(quantile, value) for each of ``qs`` over the window; NaN when it is empty."""
        self._rotate()
        values = sorted(v for b in self._buckets for v in b)
        out = []
        for q in qs:
            out.append((q, values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")))
        return out

    def _rotate(self) -> int:
        """The current bucket's index, clearing the buckets that aged out since the last call."""
        width = MAX_AGE_S / AGE_BUCKETS
        now_slot = int((time.monotonic() - self._started) / width)
        for k in range(self._last + 1, min(now_slot, self._last + AGE_BUCKETS) + 1):
            self._buckets[k % AGE_BUCKETS] = []
            self._seen[k % AGE_BUCKETS] = 0
        self._last = now_slot
        return now_slot % AGE_BUCKETS


@dataclass(frozen=True, slots=True)
class SummarySamples:
    """One model version's summary of one family, as the collector reads it."""

    count: int
    total_us: float
    quantiles: list[tuple[float, float]]


class LatencySummaries:
    """The five summaries of every model version that answered a request."""

    def __init__(self, quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES) -> None:
        self.quantiles = tuple(q for q, _ in quantiles)
        self._models: dict[tuple[str, str], dict[str, SlidingSummary]] = {}

    def observe(self, trace: RequestTrace) -> None:
        """A request was answered (event loop): its durations, in microseconds."""
        key = (trace.model, trace.version)
        summaries = self._models.get(key)
        if summaries is None:
            summaries = self._models[key] = {attr: SlidingSummary() for _, _, attr in SUMMARIES}
        d = Durations(dict(trace.timestamps))
        for attr, summary in summaries.items():
            ns = getattr(d, attr)
            if ns is not None:
                summary.observe(ns / 1000.0)

    def read(self, model: str, version: str) -> dict[str, SummarySamples] | None:
        summaries = self._models.get((model, version))
        if summaries is None:
            return None
        return {attr: SummarySamples(s.count, s.total, s.quantiles(self.quantiles)) for attr, s in summaries.items()}
