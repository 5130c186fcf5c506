"""Prometheus metrics on their own port, read with prometheus-client's parser: Triton's names,
types, help texts and labels; the sequence metrics; the optional latency histogram; the
listener's HTTP behaviour; --allow-metrics=false; flag errors."""

from __future__ import annotations

import http.client
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.clients import acc_input, http_request, new_int_id
from tests.support.models import write_model
from tests.support.paths import ROOT
from tests.support.process import ServerProcess, run_serve, under_workers

# Triton's families as core src/metrics.cc registers them: name -> (type, help)
TRITON = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": (
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    "nv_inference_request_duration_us": (
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    "nv_inference_queue_duration_us": (
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    "nv_inference_compute_input_duration_us": (
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_infer_duration_us": (
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_output_duration_us": (
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_pending_request_count": (
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
}
SEQUENCE = {
    "seqserve_sequence_slots": "gauge",
    "seqserve_sequence_active": "gauge",
    "seqserve_sequence_backlog": "gauge",
    "seqserve_sequence_started_total": "counter",
    "seqserve_sequence_ended_total": "counter",
    "seqserve_sequence_expired_total": "counter",
    "seqserve_sequence_released_total": "counter",
    "seqserve_sequence_restored_total": "counter",
    "seqserve_sequence_state_bytes": "gauge",
    "seqserve_sequence_backlog_full_total": "counter",
    "seqserve_session_tombstones_evicted_total": "counter",
}
INLINE = {
    "seqserve_inline_active": "gauge",
    "seqserve_inline_batches_total": "counter",
    "seqserve_inline_slow_batches_total": "counter",
    "seqserve_inline_demotions_total": "counter",
}
ACC = {"model": "accumulator", "version": "1"}


def scrape(srv: ServerProcess) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", srv.metrics_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        body = r.read().decode()
        assert r.status == 200, body
        assert r.getheader("content-type") == "text/plain; version=0.0.4; charset=utf-8"
        return body
    finally:
        conn.close()


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    """The value of the one sample of `family` (named `sample`, default the family's own
    samples) whose labels include `labels`."""
    found = [
        s.value
        for s in fams[family].samples
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (family, labels, fams[family].samples)
    return float(found[0])


def accumulate(srv: ServerProcess, steps: list[tuple[float, bool, bool]], sid: int) -> list[float]:
    cl = httpclient.InferenceServerClient(srv.http_url)
    try:
        out = []
        for v, start, end in steps:
            inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[v]], np.float32))
            res = cl.infer("accumulator", [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
            out.append(float(res.as_numpy("OUTPUT")[0, 0]))
        return out
    finally:
        cl.close()


def test_two_steps_of_accumulator(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None)
    sid = new_int_id()
    assert accumulate(srv, [(1.0, True, False), (2.0, False, False)], sid) == [1.0, 3.0]
    text = scrape(srv)
    # Triton's exposition: a counter keeps its name (no _total), labels model and version
    assert 'nv_inference_request_success{model="accumulator",version="1"} 2\n' in text
    fams = families(text)
    assert value(fams, "nv_inference_request_success", **ACC) == 2
    assert value(fams, "nv_inference_count", **ACC) == 2
    assert value(fams, "nv_inference_exec_count", **ACC) == 2
    assert value(fams, "nv_inference_pending_request_count", **ACC) == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert value(fams, "nv_inference_request_failure", **ACC, reason=reason) == 0
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert value(fams, f"nv_inference_{name}_duration_us", **ACC) >= 0
    assert value(fams, "nv_inference_request_duration_us", **ACC) > 0
    # every model is listed, with zeros until it serves
    assert value(fams, "nv_inference_request_success", model="add_sub", version="1") == 0
    # the sequence metrics, for sequence models only
    assert value(fams, "seqserve_sequence_slots", **ACC) == 16  # 2 instances x max_batch_size 8
    assert value(fams, "seqserve_sequence_active", **ACC) == 1
    assert value(fams, "seqserve_sequence_backlog", **ACC) == 0
    assert value(fams, "seqserve_sequence_started", "seqserve_sequence_started_total", **ACC) == 1
    assert value(fams, "seqserve_sequence_ended", "seqserve_sequence_ended_total", **ACC) == 0
    assert value(fams, "seqserve_sequence_state_bytes", **ACC) == 4  # one FP32 sum
    assert not [s for s in fams["seqserve_sequence_slots"].samples if s.labels["model"] == "add_sub"]
    assert "nv_inference_first_response_histogram_ms" not in fams  # off by default, as in Triton
    # inline execution, for the models that may run on the event loop (not ONNX's lstm)
    if not under_workers():  # with workers the engine's compiled ring path runs it: never inline
        assert value(fams, "seqserve_inline_active", **ACC) in (0, 1)
        assert value(fams, "seqserve_inline_batches", "seqserve_inline_batches_total", **ACC) >= 0
    assert not [s for s in fams["seqserve_inline_active"].samples if s.labels["model"] == "lstm"]

    # END: the slot is free, the sequence counted as ended; read again at once (no caching)
    assert accumulate(srv, [(3.0, False, True)], sid) == [6.0]
    fams = families(scrape(srv))
    assert value(fams, "nv_inference_request_success", **ACC) == 3
    assert value(fams, "seqserve_sequence_active", **ACC) == 0
    assert value(fams, "seqserve_sequence_ended", "seqserve_sequence_ended_total", **ACC) == 1
    # a refused request is a failure (reason OTHER)
    r = http_request(srv, "POST", "/v2/models/accumulator/infer", {"inputs": [acc_input()],
                                                                      "parameters": {"sequence_id": sid}})  # fmt: skip
    assert r.status == 400
    fams = families(scrape(srv))
    assert value(fams, "nv_inference_request_failure", **ACC, reason="OTHER") == 1


def test_types_and_help_texts_are_tritons(server: ServerProcess) -> None:
    text = scrape(server)
    fams = families(text)
    for name, (typ, doc) in TRITON.items():
        assert fams[name].type == typ, name
        assert fams[name].documentation == doc, name
        assert f"# TYPE {name} {typ}\n" in text
    # with workers the models run on the engine's compiled ring path, never inline: a family
    # with no model that may run inline has no samples, and is not exposed
    for name, typ in {**SEQUENCE, **({} if under_workers() else INLINE)}.items():
        assert f"# TYPE {name} {typ}\n" in text
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert fams[name].type == "gauge"
    assert 0 <= value(fams, "nv_cpu_utilization") <= 1
    assert value(fams, "nv_cpu_memory_used_bytes") <= value(fams, "nv_cpu_memory_total_bytes")


def test_latency_histogram_and_config(launch: Callable[..., ServerProcess], tmp_path: Any) -> None:
    repo = tmp_path / "repo"
    write_model(
        repo,
        "timed",
        """
        name: "timed"
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        metric_tags { key: "team" value: "ops" }
        model_metrics {
          metric_control [
            {
              metric_identifier { family: "nv_inference_first_response_histogram_ms" }
              histogram_options { buckets: [ 0.001, 1000 ] }
            }
          ]
        }
        """,
        """
        class Model:
            def execute(self, batch):
                return {"OUT": batch.inputs["IN"].copy()}
        """,
    )
    srv = launch(repo, "--metrics-config", "histogram_latencies=true", "--metrics-config", "counter_latencies=false")
    doc = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    for _ in range(3):
        r = http_request(srv, "POST", "/v2/models/timed/infer", doc)
        assert r.status == 200, r.body
    text = scrape(srv)
    fams = families(text)
    labels = {"model": "timed", "version": "1", "_team": "ops"}  # metric_tags become _<key> labels
    h = "nv_inference_first_response_histogram_ms"
    assert fams[h].type == "histogram"
    assert fams[h].documentation == "Duration from request to first response in milliseconds"
    assert value(fams, h, h + "_bucket", **labels, le="0.001") == 0  # nothing is that fast
    assert value(fams, h, h + "_bucket", **labels, le="1000") == 3
    assert value(fams, h, h + "_bucket", **labels, le="+Inf") == 3
    assert value(fams, h, h + "_count", **labels) == 3
    assert value(fams, h, h + "_sum", **labels) > 0
    assert "nv_inference_request_duration_us" not in fams  # counter_latencies=false
    assert value(fams, "nv_inference_request_success", **labels) == 3


def test_listener(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    try:
        for _ in range(2):  # keep-alive: two scrapes on one connection
            conn.request("GET", "/metrics?name=x")
            r = conn.getresponse()
            assert r.status == 200 and b"nv_inference_count" in r.read()
        conn.request("HEAD", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"" and int(r.getheader("content-length") or 0) > 0
        conn.request("GET", "/v2/health/ready")
        r = conn.getresponse()
        assert r.status == 404 and r.read()
        conn.request("POST", "/metrics", body=b"x")
        r = conn.getresponse()
        assert r.status == 405 and r.getheader("allow") == "GET, HEAD"
        r.read()
    finally:
        conn.close()
    # garbage and an oversized head are dropped without harm
    import socket

    for junk in (b"NONSENSE\r\n\r\n", b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=10) as s:
            s.sendall(junk)
            s.recv(4096)
    assert "nv_inference_count" in scrape(server)


def test_metrics_off(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, "--allow-metrics=false")
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", srv.metrics_port, timeout=2).request("GET", "/metrics")
    assert "metrics listening" not in srv.log()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--metrics-config", "summary_quantiles=half"), "is not <quantile>:<error>"),
        (("--metrics-config", "nope=1"), "unknown setting 'nope'"),
        (("--metrics-config", "histogram_latencies"), "is not <setting>=<value>"),
        (("--allow-metrics", "maybe"), "is not a boolean"),
        (("--metrics-port", "0"), "is not a TCP port"),
        (("--metrics-interval-ms", "0"), "is not a positive integer"),
        (("--session-tombstone-max", "-1"), "is not an integer >= 0"),
    ],
)
def test_flag_errors(flags: tuple[str, ...], message: str) -> None:
    proc = run_serve("--http-port", "off", *flags)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_metrics_port_in_use(tmp_path: Any) -> None:
    import socket

    from tests.support.ports import free_ports

    (repo := tmp_path / "empty").mkdir()
    http_port, grpc_port = free_ports(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = ["--model-repository", str(repo), "--host", "127.0.0.1", "--http-port", str(http_port)]
        args += ["--grpc-port", str(grpc_port), "--metrics-port", str(taken.getsockname()[1])]
        proc = subprocess.run(
            [sys.executable, "-m", "seqserve", "serve", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    assert proc.returncode == 1, proc.stderr
    assert "cannot listen for metrics on 127.0.0.1:" in proc.stderr
