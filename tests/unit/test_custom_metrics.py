"""Custom metrics: the registry's rules, pb_utils' MetricFamily over it, the exposition of
custom families and latency summaries, and the checks on snapshots forwarded by isolated
processes."""

from __future__ import annotations

from typing import Any

import pytest

from seqserve.api.latency_summaries import LatencySummaries, SlidingWindow, parse_quantiles
from seqserve.api.metric_families import custom_families, summary_families
from seqserve.engine import custom_metrics as cm
from seqserve.engine.backends import triton_utils as pb_utils
from seqserve.engine.tracing import RequestTrace


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of this test's own (the process's is shared by every test in it)."""
    monkeypatch.setattr(cm, "REGISTRY", cm.MetricRegistry())


def test_counter_gauge_histogram_and_their_rules() -> None:
    c = cm.counter("ut_requests", "requests", {"model": "a"})
    c.increment()
    c.increment(2)
    assert c.value() == 3
    with pytest.raises(ValueError, match="negative"):
        c.increment(-1)
    with pytest.raises(ValueError, match="only a gauge"):
        c.set(1)
    assert cm.counter("ut_requests", "requests", {"model": "a"}).value() == 3  # the same series
    g = cm.gauge("ut_depth", "depth")
    g.set(5)
    g.increment(-2)
    assert g.value() == 3
    h = cm.histogram("ut_sizes", "sizes", [1, 4])
    for v in (0.5, 1, 3, 9):
        h.observe(v)
    with pytest.raises(ValueError, match="no single value"):
        h.value()
    with pytest.raises(ValueError, match="exists as a counter"):
        cm.gauge("ut_requests", "requests")
    with pytest.raises(ValueError, match="not a valid metric name"):
        cm.counter("bad name", "x")
    with pytest.raises(ValueError, match="label name"):
        cm.counter("ut_ok", "x", {"bad-label": "v"})
    with pytest.raises(ValueError, match="increasing"):
        cm.histogram("ut_h2", "x", [2, 1])
    fams = {m.name: m for m in custom_families()}
    sizes = {(s.name, s.labels.get("le")): s.value for s in fams["ut_sizes"].samples}
    assert sizes[("ut_sizes_bucket", "1")] == 2 and sizes[("ut_sizes_bucket", "4")] == 3
    assert sizes[("ut_sizes_bucket", "+Inf")] == 4 and sizes[("ut_sizes_count", None)] == 4
    assert [s.value for s in fams["ut_requests"].samples if s.labels == {"model": "a"}] == [3]


def test_pb_utils_metric_family() -> None:
    family = pb_utils.MetricFamily(name="ut_pb_total", description="d", kind=pb_utils.MetricFamily.COUNTER)
    m = family.Metric(labels={"model": "x"})
    m.increment(2)
    assert m.value() == 2
    with pytest.raises(pb_utils.TritonModelException, match="negative"):
        m.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="only a histogram"):
        m.observe(1)
    with pytest.raises(pb_utils.TritonModelException, match="unknown kind"):
        pb_utils.MetricFamily(name="ut_pb2", description="d", kind=7)
    hist = pb_utils.MetricFamily(name="ut_pb_h", description="d", kind=pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="needs buckets"):
        hist.Metric(labels={})
    hist.Metric(labels={}, buckets=[1.0]).observe(0.5)


def test_forwarded_snapshots_merge_and_are_checked() -> None:
    registry = cm.MetricRegistry()
    family = registry.family("ut_fw", "forwarded", cm.COUNTER)
    family.metric({"i": "0"}).increment(2)
    snapshot = cm.check_snapshot(registry.snapshot(local=True))
    cm.REGISTRY.merge_remote("a", snapshot)
    cm.REGISTRY.merge_remote("b", snapshot)
    fams = {m.name: m for m in custom_families()}
    assert [s.value for s in fams["ut_fw"].samples] == [4]  # the same series from two processes adds up
    cm.REGISTRY.merge_remote("a", None)
    cm.REGISTRY.merge_remote("b", None)
    assert "ut_fw" not in {m.name for m in custom_families()}
    bad: list[Any] = [
        {"name": "x y", "description": "", "kind": "counter", "series": []},
        {"name": "x", "description": "", "kind": "summary", "series": []},
        {"name": "x", "description": "", "kind": "counter", "series": [{"labels": {}, "value": "1"}]},
        {"name": "x", "description": "", "kind": "counter", "series": [{"labels": {"a": 1}, "value": 1}]},
        {"name": "x", "description": "", "kind": "histogram",
         "series": [{"labels": {}, "buckets": [1], "counts": [1], "sum": 1, "count": 1}]},
    ]  # fmt: skip
    for family_doc in bad:
        with pytest.raises(ValueError):
            cm.check_snapshot([family_doc])


def test_summary_quantiles_over_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("seqserve.api.latency_summaries.time.monotonic", lambda: now[0])
    s = SlidingWindow(2)
    for v in range(1, 101):
        s.observe([float(v), None if v % 2 else 1.0])
    assert dict(s.quantiles(0, [0.5, 0.99])) == {0.5: 51.0, 0.99: 100.0}
    assert s.counts == [100, 50] and dict(s.quantiles(1, [0.5])) == {0.5: 1.0}
    now[0] += 30  # half the window later: still there
    assert s.quantiles(0, [0.5]) == [(0.5, 51.0)]
    now[0] += 31  # the window has moved past every observation; count and sum stay
    q = dict(s.quantiles(0, [0.5]))
    assert q[0.5] != q[0.5] and s.counts[0] == 100 and s.totals[0] == 5050  # NaN: nothing in the window


def test_summary_families_from_traces() -> None:
    summaries = LatencySummaries(parse_quantiles("0.5:0.05,0.9:0.01"))
    trace = RequestTrace(type("R", (), {})(), "m", "1")  # type: ignore[arg-type]
    trace.timestamps = [("REQUEST_START", 0), ("QUEUE_START", 1000), ("COMPUTE_START", 3000),
                        ("COMPUTE_INPUT_END", 4000), ("COMPUTE_OUTPUT_START", 8000), ("COMPUTE_END", 9000),
                        ("REQUEST_END", 10_000)]  # fmt: skip
    summaries.observe(trace)
    fams = {m.name: m for m in summary_families(summaries, [("m", "1", {"model": "m", "version": "1"})])}
    got = {(s.name, s.labels.get("quantile")): s.value for s in fams["nv_inference_queue_summary_us"].samples}
    assert got == {
        ("nv_inference_queue_summary_us", "0.5"): 2.0,
        ("nv_inference_queue_summary_us", "0.9"): 2.0,
        ("nv_inference_queue_summary_us_sum", None): 2.0,
        ("nv_inference_queue_summary_us_count", None): 1,
    }
    assert [s.value for s in fams["nv_inference_compute_infer_summary_us"].samples][-1] == 1
    assert [s.value for s in fams["nv_inference_request_summary_us"].samples][-2] == 10.0
