"""Latency summaries and custom metrics on /metrics: Triton's five summaries with
``--metrics-config summary_latencies=true``, a Triton Python model's ``pb_utils.MetricFamily``
counter, gauge and histogram (in process, and forwarded from an isolated process), and the
restarts of isolated processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.models import write_model
from tests.support.process import ServerProcess

CONFIG = """
name: "counted"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"]}
        self.requests = pb_utils.MetricFamily(
            name="counted_requests", description="requests seen", kind=pb_utils.MetricFamily.COUNTER
        ).Metric(labels=labels)
        self.last = pb_utils.MetricFamily(
            name="counted_last_input", description="the latest input", kind=pb_utils.MetricFamily.GAUGE
        ).Metric(labels=labels)
        self.sizes = pb_utils.MetricFamily(
            name="counted_input_value", description="inputs seen", kind=pb_utils.MetricFamily.HISTOGRAM
        ).Metric(labels=labels, buckets=[1.0, 2.0])

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            if x[0] == 99.0:  # the isolated test's way to crash its process
                os._exit(3)
            self.requests.increment(1)
            self.last.set(float(x[0]))
            self.sizes.observe(float(x[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
        return out
"""


def scrape(srv: ServerProcess) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", srv.metrics_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_summaries_and_a_python_models_custom_metrics(
    launch: Callable[..., ServerProcess], tmp_path: Path, isolation: str
) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "counted", CONFIG, MODEL)
    srv = launch(
        repo, "--metrics-config", "summary_latencies=true", "--python-isolation", isolation, exit_timeout_s=10.0
    )
    cl = httpclient.InferenceServerClient(srv.http_url)
    for v in (0.5, 1.5, 3.0):
        inp = httpclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.array([v], np.float32))
        assert float(cl.infer("counted", [inp]).as_numpy("OUT")[0]) == v
    cl.close()
    from tests.support.checks import wait_until_sync

    labels = {"model": "counted"}

    def forwarded() -> bool:
        """A process-isolated model's metrics reach the server in snapshots, after its replies:
        wait for the one taken after its third request's updates."""
        fams = scrape(srv)
        count = [s[2] for s in fams.get("counted_input_value", []) if s[0].endswith("_count")]
        return [s[1:] for s in fams.get("counted_requests", [])] == [(labels, 3.0)] and count == [3.0]

    wait_until_sync(forwarded, "the custom metrics are on /metrics")
    fams = scrape(srv)
    # (prometheus-client's parser names a counter's sample <name>_total; the text has <name>)
    assert [s[1:] for s in fams["counted_requests"]] == [(labels, 3.0)]
    assert fams["counted_last_input"] == [("counted_last_input", labels, 3.0)]
    buckets = {s[1]["le"]: s[2] for s in fams["counted_input_value"] if s[0].endswith("_bucket")}
    assert buckets == {"1": 1.0, "2": 2.0, "+Inf": 3.0}
    for family in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        samples = fams[f"nv_inference_{family}_summary_us"]
        mine = [s for s in samples if s[1].get("model") == "counted"]
        count = [s[2] for s in mine if s[0].endswith("_count")]
        assert count == [3.0], (family, mine)
        quantiles = {s[1]["quantile"] for s in mine if "quantile" in s[1]}
        assert quantiles == {"0.5", "0.9", "0.95", "0.99", "0.999"}
        assert all(s[2] >= 0 for s in mine)


def test_restarts_of_an_isolated_process_are_counted(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    from tests.support.checks import wait_until_sync

    repo = tmp_path / "repo"
    write_model(repo, "counted", CONFIG, MODEL)
    srv = launch(repo, "--python-isolation", "process", exit_timeout_s=10.0)

    def restarts() -> float:
        found = [s for s in scrape(srv)["seqserve_isolated_restarts"] if s[1]["model"] == "counted"]
        assert len(found) == 1 and found[0][1]["version"] == "1" and found[0][1]["instance"], found
        return found[0][2]

    assert restarts() == 0
    cl = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.array([99.0], np.float32))
    with pytest.raises(Exception):  # noqa: B017 (the process died under the request: any error)
        cl.infer("counted", [inp])
    cl.close()
    wait_until_sync(lambda: restarts() == 1, "the restart is counted", timeout=30)
