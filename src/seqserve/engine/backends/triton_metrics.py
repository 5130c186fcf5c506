"""``pb_utils.MetricFamily`` and ``pb_utils.Metric``: Triton Python models' custom metrics, over
the process's metric registry (``seqserve.engine.custom_metrics``), so that they appear on
``/metrics``. A misuse (a negative counter increment, ``set`` on a counter, ``observe`` on
anything but a histogram, a name registered again with another kind) raises
``TritonModelException``, as Triton's python backend does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import seqserve.engine.custom_metrics as cm


class MetricModelError(Exception):
    """A custom metric misused (the shim re-raises it as TritonModelException)."""


class TritonMetric:
    """One series of a family, for the labels it was created with."""

    def __init__(self, metric: cm.Metric, error: type[Exception]) -> None:
        self._metric = metric
        self._error = error

    def increment(self, value: float) -> None:
        try:
            self._metric.increment(value)
        except ValueError as e:
            raise self._error(str(e)) from None

    def set(self, value: float) -> None:
        try:
            self._metric.set(value)
        except ValueError as e:
            raise self._error(str(e)) from None

    def observe(self, value: float) -> None:
        try:
            self._metric.observe(value)
        except ValueError as e:
            raise self._error(str(e)) from None

    def value(self) -> float:
        try:
            return self._metric.value()
        except ValueError as e:
            raise self._error(str(e)) from None


class MetricFamily:
    """``MetricFamily(name, description, kind)``; ``kind`` is ``MetricFamily.COUNTER``,
    ``GAUGE`` or ``HISTOGRAM``; ``Metric(labels, buckets)`` gives a series."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    #: the exception misuse raises (the shim sets TritonModelException)
    error: type[Exception] = MetricModelError

    def __init__(self, name: str, description: str, kind: int) -> None:
        kinds = {self.COUNTER: cm.COUNTER, self.GAUGE: cm.GAUGE, self.HISTOGRAM: cm.HISTOGRAM}
        if kind not in kinds:
            raise self.error(f"metric family '{name}': unknown kind {kind!r} (COUNTER, GAUGE or HISTOGRAM)")
        try:
            self._family = cm.REGISTRY.family(name, description, kinds[kind])
        except ValueError as e:
            raise self.error(str(e)) from None

    def Metric(self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None) -> TritonMetric:
        try:
            return TritonMetric(self._family.metric(labels, buckets), self.error)
        except ValueError as e:
            raise self.error(str(e)) from None
