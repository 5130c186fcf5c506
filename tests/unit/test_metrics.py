"""The metrics exposition (Triton's counter names, no `_total` added; escaping; numbers), the
--metrics-config parser, and sequence ids written as text."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

import seqserve.engine.custom_metrics as cm
from seqserve.api.metrics import MetricsConfig, SeqserveCollector, exposition
from seqserve.engine import InferenceError, ModelCounters, parse_sequence_id


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """No custom metrics from the tests that ran before (the registry is the process's)."""
    monkeypatch.setattr(cm, "REGISTRY", cm.MetricRegistry())


class _Fixed:
    def __init__(self, *metrics: Metric) -> None:
        self.metrics = metrics

    def collect(self) -> Any:
        return self.metrics


def test_counters_keep_their_names_and_labels_are_escaped() -> None:
    c = Metric("nv_inference_count", "Number of inferences\nperformed \\ here", "counter")
    c.add_sample("nv_inference_count", {"version": "1", "model": 'a"b\\c\nd'}, 3)
    g = Metric("g", "a gauge", "gauge")
    g.add_sample("g", {}, 0.25)
    h = Metric("h", "a histogram", "histogram")
    h.add_sample("h_bucket", {"le": "+Inf"}, 2)
    text = exposition(_Fixed(c, g, h)).decode()  # type: ignore[arg-type]
    assert text.splitlines() == [
        "# HELP nv_inference_count Number of inferences\\nperformed \\\\ here",
        "# TYPE nv_inference_count counter",
        'nv_inference_count{model="a\\"b\\\\c\\nd",version="1"} 3',
        "# HELP g a gauge",
        "# TYPE g gauge",
        "g 0.25",
        "# HELP h a histogram",
        "# TYPE h histogram",
        'h_bucket{le="+Inf"} 2',
    ]
    (parsed, *_) = text_string_to_metric_families(text)
    assert parsed.name == "nv_inference_count" and parsed.type == "counter"
    assert parsed.samples[0].labels["model"] == 'a"b\\c\nd' and parsed.samples[0].value == 3


def _counters(**kw: Any) -> ModelCounters:
    base: dict[str, Any] = dict(
        model="m",
        version="2",
        tags={"team": "x"},
        success=5,
        failure={"REJECTED": 1, "CANCELED": 0, "BACKEND": 2, "OTHER": 3},
        inference_count=5,
        execution_count=4,
        request_duration_us=10,
        queue_duration_us=1,
        compute_input_duration_us=2,
        compute_infer_duration_us=3,
        compute_output_duration_us=4,
        pending_requests=7,
        latency_buckets=[(100.0, 4), (float("inf"), 5)],
        latency_sum_ms=12.5,
    )
    return ModelCounters(**(base | kw))


class _Server:
    def __init__(self, *counters: ModelCounters) -> None:
        self.counters = list(counters)

    def model_counters(self) -> list[ModelCounters]:
        return self.counters


def test_collector_families() -> None:
    server = _Server(_counters(), _counters(model="s", tags={}, is_sequence=True, sequence_slots=8, state_bytes=64))
    collector = SeqserveCollector(server, MetricsConfig(histogram_latencies=True))  # type: ignore[arg-type]
    text = exposition(collector).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert 'nv_inference_request_success{_team="x",model="m",version="2"} 5' in text
    reasons = {
        s.labels["reason"]: s.value for s in fams["nv_inference_request_failure"].samples if s.labels["model"] == "m"
    }
    assert reasons == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 2, "OTHER": 3}
    assert 'nv_inference_first_response_histogram_ms_bucket{_team="x",le="100",model="m",version="2"} 4' in text
    assert 'nv_inference_first_response_histogram_ms_bucket{_team="x",le="+Inf",model="m",version="2"} 5' in text
    assert 'nv_inference_first_response_histogram_ms_count{_team="x",model="m",version="2"} 5' in text
    assert 'nv_inference_first_response_histogram_ms_sum{_team="x",model="m",version="2"} 12.5' in text
    assert "nv_inference_pending_request_count" in fams
    # the sequence families carry the sequence model only
    slots = fams["seqserve_sequence_slots"].samples
    assert [(s.labels["model"], s.value) for s in slots] == [("s", 8)]
    assert fams["seqserve_sequence_started"].samples[0].name == "seqserve_sequence_started_total"
    # no model here may run inline (bound 0): no inline families
    assert not [f for f in fams if f.startswith("seqserve_inline")]
    inline = _counters(model="i", inline_max_batch_us=200.0, inline_active=True, inline_batches=9,
                       inline_slow_batches=2, inline_demotions=1)  # fmt: skip
    fams = {f.name: f for f in text_string_to_metric_families(exposition(SeqserveCollector(_Server(inline))).decode())}  # type: ignore[arg-type]
    got = {f: [(s.labels["model"], s.value) for s in fams[f].samples] for f in fams if f.startswith("seqserve_inline")}
    assert got == {
        "seqserve_inline_active": [("i", 1)],
        "seqserve_inline_batches": [("i", 9)],
        "seqserve_inline_slow_batches": [("i", 2)],
        "seqserve_inline_demotions": [("i", 1)],
    }
    # counter_latencies=false drops the duration counters; histograms are off by default
    text = exposition(SeqserveCollector(server, MetricsConfig(counter_latencies=False))).decode()  # type: ignore[arg-type]
    assert "nv_inference_queue_duration_us" not in text and "histogram" not in text
    # no model: no model families at all
    text = exposition(SeqserveCollector(_Server())).decode()  # type: ignore[arg-type]
    assert "nv_inference" not in text


def test_cpu_and_gpu_metrics_follow_their_allow_flags() -> None:
    """--allow-cpu-metrics=false drops the host's families; without a GPU (or with
    --allow-gpu-metrics=false) there are no GPU families at all."""
    quiet = exposition(SeqserveCollector(_Server(), cpu=False, gpu=False)).decode()  # type: ignore[arg-type]
    assert "nv_cpu_" not in quiet and "nv_gpu_" not in quiet
    default = exposition(SeqserveCollector(_Server())).decode()  # type: ignore[arg-type]
    assert "nv_cpu_memory_total_bytes" in default
    from seqserve.engine.device.nvml import GpuMetricsReader

    assert ("nv_gpu_memory_total_bytes" in default) == GpuMetricsReader().available


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ([], MetricsConfig()),
        (["histogram_latencies=true"], MetricsConfig(histogram_latencies=True)),
        (["counter_latencies=false", "histogram_latencies=1"], MetricsConfig(False, True)),
        (["summary_latencies=false"], MetricsConfig()),
        (["summary_latencies=true"], MetricsConfig(summary_latencies=True)),
        (
            ['summary_quantiles="0.5:0.05,0.99:0.001"'],
            MetricsConfig(summary_quantiles=((0.5, 0.05), (0.99, 0.001))),
        ),
    ],
)
def test_metrics_config(settings: list[str], expected: MetricsConfig) -> None:
    assert MetricsConfig.parse(settings) == expected


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("summary_latencies=sometimes", "is not true or false"),
        ("summary_quantiles=0.5", "is not <quantile>:<error>"),
        ("summary_quantiles=1.5:0.1", "within \\[0, 1\\]"),
        ("histogram_latencies=perhaps", "is not true or false"),
        ("x", "is not <setting>=<value>"),
        ("gpu=1", "unknown setting 'gpu'"),
    ],
)
def test_metrics_config_errors(setting: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsConfig.parse([setting])


@pytest.mark.parametrize(
    ("text", "id_type", "expected"),
    [
        ("42", "", 42),
        ("42", "string", "42"),
        ("42", "uint64", 42),
        ("abc", "", "abc"),
        ("a/b", "", "a/b"),
        ("18446744073709551615", "", 2**64 - 1),
        ("١٢", "", "١٢"),  # non-ASCII digits are a string
    ],
)
def test_parse_sequence_id(text: str, id_type: str, expected: int | str) -> None:
    got = parse_sequence_id(text, id_type)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    ("text", "id_type"),
    [("0", ""), ("", ""), ("", "string"), ("x", "uint64"), ("18446744073709551616", ""), ("1", "int")],
)
def test_parse_sequence_id_errors(text: str, id_type: str) -> None:
    with pytest.raises(InferenceError):
        parse_sequence_id(text, id_type)
