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

import math
import random
import time
from collections.abc import Iterable, Sequence
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


class SlidingWindow:
    """Observations of ``series`` quantities over the last ``MAX_AGE_S`` seconds (in
    ``AGE_BUCKETS`` rotating buckets, rotated once per observation for all of them), with a
    running count and sum of each since the start. Event loop only."""

    __slots__ = ("_buckets", "_last", "_rng", "_seen", "_started", "counts", "totals")

    def __init__(self, series: int) -> None:
        self.counts = [0] * series
        self.totals = [0.0] * series
        self._buckets: list[list[list[float]]] = [[[] for _ in range(series)] for _ in range(AGE_BUCKETS)]
        self._seen = [[0] * series for _ in range(AGE_BUCKETS)]  # offered to each bucket (the reservoir's)
        self._started = time.monotonic()
        self._last = 0  # the age slot of the latest rotation
        self._rng = random.Random(0)

    def observe(self, values: Sequence[float | None]) -> None:
        """One value per series (None: none for that series this time)."""
        i = self._rotate()
        buckets, seen = self._buckets[i], self._seen[i]
        for k, value in enumerate(values):
            if value is None:
                continue
            self.counts[k] += 1
            self.totals[k] += value
            bucket = buckets[k]
            seen[k] += 1
            if len(bucket) < MAX_BUCKET_SAMPLES:
                bucket.append(value)
            else:
                j = self._rng.randrange(seen[k])
                if j < MAX_BUCKET_SAMPLES:
                    bucket[j] = value

    def quantiles(self, series: int, qs: Iterable[float]) -> list[tuple[float, float]]:
        """(quantile, value) of one series for each of ``qs`` over the window; NaN when empty."""
        self._rotate()
        values = sorted(v for b in self._buckets for v in b[series])
        return [(q, values[min(len(values) - 1, int(q * len(values)))] if values else math.nan) for q in qs]

    def _rotate(self) -> int:
        """The current bucket's index, clearing the buckets that aged out since the last call."""
        now_slot = int((time.monotonic() - self._started) * AGE_BUCKETS / MAX_AGE_S)
        if now_slot != self._last:
            for k in range(self._last + 1, min(now_slot, self._last + AGE_BUCKETS) + 1):
                self._buckets[k % AGE_BUCKETS] = [[] for _ in self.counts]
                self._seen[k % AGE_BUCKETS] = [0] * len(self.counts)
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
        self._models: dict[tuple[str, str], SlidingWindow] = {}

    def observe(self, trace: RequestTrace) -> None:
        """A request was answered (event loop): its durations, in microseconds."""
        key = (trace.model, trace.version)
        window = self._models.get(key)
        if window is None:
            window = self._models[key] = SlidingWindow(len(SUMMARIES))
        d = Durations(dict(trace.timestamps))
        window.observe([None if (ns := getattr(d, attr)) is None else ns / 1000.0 for _, _, attr in SUMMARIES])

    def read(self, model: str, version: str) -> dict[str, SummarySamples] | None:
        window = self._models.get((model, version))
        if window is None:
            return None
        return {
            attr: SummarySamples(window.counts[k], window.totals[k], window.quantiles(k, self.quantiles))
            for k, (_, _, attr) in enumerate(SUMMARIES)
        }
