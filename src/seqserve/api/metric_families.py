"""Metric families read at scrape time beside the core's counters: Triton's latency summaries
and the custom metrics of models (and the engine's own, in the same registry), including those
forwarded by models in isolated processes."""

from __future__ import annotations

from typing import Any

from prometheus_client.metrics_core import Metric

import seqserve.engine.custom_metrics as cm
from seqserve.api.latency_summaries import SUMMARIES, LatencySummaries


def summary_families(summaries: LatencySummaries, models: list[tuple[str, str, dict[str, str]]]) -> list[Metric]:
    """The five summaries of each (model, version, labels) that has observations."""
    families = [Metric(name, doc, "summary") for name, doc, _ in SUMMARIES]
    for model, version, labels in models:
        read = summaries.read(model, version)
        if read is None:
            continue
        for m, (_, _, attr) in zip(families, SUMMARIES, strict=True):
            s = read[attr]
            for q, value in s.quantiles:
                m.add_sample(m.name, {**labels, "quantile": _quantile(q)}, value)
            m.add_sample(m.name + "_sum", labels, s.total_us)
            m.add_sample(m.name + "_count", labels, s.count)
    return families


def _quantile(q: float) -> str:
    return repr(q) if q != int(q) else str(int(q))


def custom_families() -> list[Metric]:
    """Every custom family of the registry, forwarded ones merged in by name (a counter's or
    histogram's series with the same labels from several processes add up; a gauge's last
    value wins). A forwarded family whose kind differs from the first of its name is left out."""
    merged: dict[str, dict[str, Any]] = {}
    for f in cm.REGISTRY.snapshot():
        into = merged.get(f["name"])
        if into is None:
            merged[f["name"]] = into = {"kind": f["kind"], "description": f["description"], "series": {}}
        elif into["kind"] != f["kind"]:
            continue
        for s in f["series"]:
            key = tuple(sorted(s["labels"].items()))
            old = into["series"].get(key)
            into["series"][key] = s if old is None or f["kind"] == "gauge" else _added(old, s)
    out = []
    for name, f in merged.items():
        m = Metric(name, f["description"], f["kind"])
        for key, s in f["series"].items():
            labels = dict(key)
            if f["kind"] != "histogram":
                m.add_sample(name, labels, s["value"])
                continue
            running = 0
            for bound, n in zip([*s["buckets"], float("inf")], s["counts"], strict=True):
                running += n
                m.add_sample(name + "_bucket", {**labels, "le": _bound(bound)}, running)
            m.add_sample(name + "_sum", labels, s["sum"])
            m.add_sample(name + "_count", labels, s["count"])
        out.append(m)
    return out


def _added(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    if "value" in a and "value" in b:
        return {**a, "value": a["value"] + b["value"]}
    if a.get("buckets") != b.get("buckets"):
        return a
    counts = [x + y for x, y in zip(a["counts"], b["counts"], strict=True)]
    return {**a, "counts": counts, "sum": a["sum"] + b["sum"], "count": a["count"] + b["count"]}


def _bound(b: float) -> str:
    if b == float("inf"):
        return "+Inf"
    return str(int(b)) if b == int(b) else repr(b)
