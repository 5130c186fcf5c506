"""Metrics that models define (and that the engine keeps about its own moving parts): counters,
gauges and histograms in named families, shown on ``/metrics`` beside Triton's. Triton Python
models reach them through ``pb_utils.MetricFamily``; batch-level models through ``counter``,
``gauge`` and ``histogram`` here. See docs/metrics.md, "Custom metrics".

The registry is the process's (as Triton's is the server's): a family lives until the process
ends, and a model that is loaded again gets its families and series back. A model in an
isolated process has a registry of its own there, which it forwards (``snapshot``) and the
server shows under its families (``merge_remote``). Every operation takes the family's lock:
models update from executor threads while a scrape reads on the event loop.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_FAMILIES = 1000
MAX_SERIES = 10_000  # per family
MAX_BUCKETS = 64

LabelKey = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Series:
    """One labelled series' value; a histogram's bucket counts (cumulative at read), sum, count."""

    value: float = 0.0
    buckets: tuple[float, ...] = ()
    counts: list[int] | None = None
    total: float = 0.0
    count: int = 0


class Metric:
    """One series of a family (Triton's ``pb_utils.Metric``)."""

    __slots__ = ("_family", "_series")

    def __init__(self, family: MetricFamily, series: Series) -> None:
        self._family = family
        self._series = series

    def increment(self, value: float = 1.0) -> None:
        kind = self._family.kind
        if kind == HISTOGRAM:
            raise ValueError(f"metric family '{self._family.name}' is a histogram: use observe()")
        if kind == COUNTER and value < 0:
            raise ValueError(f"counter '{self._family.name}' cannot be incremented by a negative value ({value})")
        with self._family.lock:
            self._series.value += value
            self._family.updates += 1

    def set(self, value: float) -> None:
        if self._family.kind != GAUGE:
            raise ValueError(f"metric family '{self._family.name}' is a {self._family.kind}: only a gauge can be set")
        with self._family.lock:
            self._series.value = float(value)
            self._family.updates += 1

    def observe(self, value: float) -> None:
        s = self._series
        if self._family.kind != HISTOGRAM or s.counts is None:
            raise ValueError(
                f"metric family '{self._family.name}' is a {self._family.kind}: only a histogram can observe"
            )
        with self._family.lock:
            s.counts[bisect.bisect_left(s.buckets, value)] += 1
            s.total += value
            s.count += 1
            self._family.updates += 1

    def value(self) -> float:
        if self._family.kind == HISTOGRAM:
            raise ValueError(f"metric family '{self._family.name}' is a histogram: it has no single value")
        with self._family.lock:
            return self._series.value


class MetricFamily:
    """A named family of one kind; ``metric(labels)`` is its series for those labels."""

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.lock = threading.Lock()
        self.series: dict[LabelKey, Series] = {}
        self.updates = 0  # changes so far (new series included): what a forwarder watches

    def metric(self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None) -> Metric:
        key = _label_key(labels)
        if self.kind == HISTOGRAM:
            if buckets is None:
                raise ValueError(f"histogram '{self.name}' needs buckets")
            bounds = tuple(float(b) for b in buckets)
            if len(bounds) > MAX_BUCKETS or list(bounds) != sorted(set(bounds)):
                raise ValueError(f"histogram '{self.name}': buckets must be increasing (at most {MAX_BUCKETS})")
        elif buckets is not None:
            raise ValueError(f"metric family '{self.name}' is a {self.kind}: buckets are for histograms")
        with self.lock:
            s = self.series.get(key)
            if s is None:
                if len(self.series) >= MAX_SERIES:
                    raise ValueError(f"metric family '{self.name}' has {MAX_SERIES} series already")
                s = Series()
                if self.kind == HISTOGRAM:
                    s.buckets = bounds
                    s.counts = [0] * (len(bounds) + 1)
                self.series[key] = s
                self.updates += 1
            elif self.kind == HISTOGRAM and s.buckets != bounds:
                raise ValueError(f"histogram '{self.name}' {dict(key)}: exists with other buckets {list(s.buckets)}")
        return Metric(self, s)


def _label_key(labels: Mapping[str, str] | None) -> LabelKey:
    if not labels:
        return ()
    for k in labels:
        if not isinstance(k, str) or not _LABEL.match(k) or k.startswith("__"):
            raise ValueError(f"'{k}' is not a valid metric label name")
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


class MetricRegistry:
    """The families of this process, plus those forwarded from isolated model processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, MetricFamily] = {}
        self._remote: dict[str, list[dict[str, Any]]] = {}  # by source: their snapshots

    def family(self, name: str, description: str, kind: str) -> MetricFamily:
        """The family ``name``: created, or the existing one if kind and description match."""
        if kind not in KINDS:
            raise ValueError(f"metric kind '{kind}' is not one of {', '.join(KINDS)}")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"'{name}' is not a valid metric name")
        with self._lock:
            f = self._families.get(name)
            if f is None:
                if len(self._families) >= MAX_FAMILIES:
                    raise ValueError(f"{MAX_FAMILIES} metric families exist already")
                f = self._families[name] = MetricFamily(name, description, kind)
            elif f.kind != kind or f.description != description:
                raise ValueError(
                    f"metric family '{name}' exists as a {f.kind} ('{f.description}'); "
                    f"it cannot be registered again as a {kind} ('{description}')"
                )
            return f

    def changes(self) -> int:
        """A number that grows with every change to this process's own families."""
        with self._lock:
            families = list(self._families.values())
        return len(families) + sum(f.updates for f in families)

    def snapshot(self, *, local: bool = False) -> list[dict[str, Any]]:
        """Every family and series now, as plain data (what a scrape shows; what an isolated
        process forwards, ``local``: its own only): name, description, kind, series [(labels,
        value or histogram)]."""
        with self._lock:
            families = list(self._families.values())
            remote = [] if local else [f for fams in self._remote.values() for f in fams]
        out = []
        for f in families:
            with f.lock:
                series = [_series_doc(k, s) for k, s in f.series.items()]
            out.append({"name": f.name, "description": f.description, "kind": f.kind, "series": series})
        return out + remote

    def merge_remote(self, source: str, families: list[dict[str, Any]] | None) -> None:
        """What an isolated process forwarded (checked by the caller); None: it is gone."""
        with self._lock:
            if families is None:
                self._remote.pop(source, None)
            else:
                self._remote[source] = families


def _series_doc(key: LabelKey, s: Series) -> dict[str, Any]:
    doc: dict[str, Any] = {"labels": dict(key)}
    if s.counts is None:
        doc["value"] = s.value
    else:
        doc.update(buckets=list(s.buckets), counts=list(s.counts), sum=s.total, count=s.count)
    return doc


def check_snapshot(data: Any) -> list[dict[str, Any]]:
    """A forwarded snapshot, checked field by field (it comes from a model's process);
    ValueError when anything is off."""
    if not isinstance(data, list) or len(data) > MAX_FAMILIES:
        raise ValueError("a metrics snapshot is a list of families")
    out = []
    for f in data:
        if not isinstance(f, dict) or f.get("kind") not in KINDS:
            raise ValueError("a metric family needs a known kind")
        name, desc, series = f.get("name"), f.get("description"), f.get("series")
        if not isinstance(name, str) or not _NAME.match(name) or not isinstance(desc, str):
            raise ValueError("a metric family needs a valid name and a description")
        if not isinstance(series, list) or len(series) > MAX_SERIES:
            raise ValueError(f"metric family '{name}': bad series")
        for s in series:
            _check_series(name, f["kind"], s)
        out.append({"name": name, "description": desc, "kind": f["kind"], "series": series})
    return out


def _check_series(name: str, kind: str, s: Any) -> None:
    if not isinstance(s, dict) or not isinstance(s.get("labels"), dict):
        raise ValueError(f"metric family '{name}': a series needs labels")
    _label_key(s["labels"])
    if not all(isinstance(v, str) for v in s["labels"].values()):
        raise ValueError(f"metric family '{name}': label values are strings")
    if kind != HISTOGRAM:
        if not _number(s.get("value")):
            raise ValueError(f"metric family '{name}': a series needs a value")
        return
    buckets, counts = s.get("buckets"), s.get("counts")
    if not isinstance(buckets, list) or not isinstance(counts, list) or len(buckets) > MAX_BUCKETS:
        raise ValueError(f"histogram '{name}': bad buckets")
    if len(counts) != len(buckets) + 1 or not all(_number(b) for b in buckets):
        raise ValueError(f"histogram '{name}': bad bucket counts")
    if not all(isinstance(c, int) and c >= 0 for c in counts) or not _number(s.get("sum")):
        raise ValueError(f"histogram '{name}': bad counts or sum")
    if not isinstance(s.get("count"), int):
        raise ValueError(f"histogram '{name}': bad count")


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)


#: the process's registry
REGISTRY = MetricRegistry()


def counter(name: str, description: str, labels: Mapping[str, str] | None = None) -> Metric:
    """A counter series (the batch-level API): ``counter("x_total", "...", {"k": "v"}).increment()``."""
    return REGISTRY.family(name, description, COUNTER).metric(labels)


def gauge(name: str, description: str, labels: Mapping[str, str] | None = None) -> Metric:
    """A gauge series: ``set``, ``increment`` (by any amount), ``value``."""
    return REGISTRY.family(name, description, GAUGE).metric(labels)


def histogram(name: str, description: str, buckets: Sequence[float], labels: Mapping[str, str] | None = None) -> Metric:
    """A histogram series with these upper bounds (+Inf is implied): ``observe``."""
    return REGISTRY.family(name, description, HISTOGRAM).metric(labels, buckets)
