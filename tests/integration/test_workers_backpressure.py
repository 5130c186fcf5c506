"""A full request ring under ``serve --workers N`` is back-pressure: the worker stops reading its
connections until what it read is on the ring, and nothing is lost.

The model holds every batch while a file exists, so the requests it has not answered keep their
slab blocks (a worker has eight of the size class a 128 KiB input takes): the ninth request a
worker reads finds no block and waits, and the worker pauses its connections (it logs it and
counts it in /metrics). Once the file is gone every request is answered with its own sum."""

from __future__ import annotations

import http.client
import json
import re
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.checks import wait_until_sync
from tests.support.clients import binary_body, new_int_id
from tests.support.process import ServerProcess, start_server

#: one row of 128 KiB: larger than the 64 KiB blocks, so each takes a 1 MiB block (8 per worker)
ELEMENTS = 32768
HTTP_REQUESTS = 28
GRPC_REQUESTS = 8
FULL_LINE = "is full; reading paused on"

CONFIG = """
name: "held_sum"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 300000000
  direct { }
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL = """
import time
from pathlib import Path

HOLD = Path({hold!r})


class Model:
    def execute(self, batch):
        while HOLD.exists():
            time.sleep(0.01)
        return {{"OUTPUT": batch.inputs["INPUT"].sum(axis=1, keepdims=True)}}
"""


def _repo(tmp_path: Path, hold: Path) -> Path:
    model = tmp_path / "models" / "held_sum"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(MODEL.format(hold=str(hold)))
    return tmp_path / "models"


def _http_sum(srv: ServerProcess, value: float, elements: int = ELEMENTS) -> float:
    """A one-step sequence over its own connection, its input in binary."""
    doc = {
        "parameters": {"sequence_id": new_int_id(), "sequence_start": True, "sequence_end": True},
        "inputs": [
            {
                "name": "INPUT",
                "datatype": "FP32",
                "shape": [1, elements],
                "parameters": {"binary_data_size": elements * 4},
            }
        ],
    }
    body, headers = binary_body(doc, np.full(elements, value, np.float32).tobytes())
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=300)
    try:
        conn.request("POST", "/v2/models/held_sum/infer", body, headers)
        r = conn.getresponse()
        reply = json.loads(r.read())
        assert r.status == 200, reply
        return float(reply["outputs"][0]["data"][0])
    finally:
        conn.close()


def _paused_total(srv: ServerProcess) -> float:
    """seqserve_worker_reading_paused_total from /metrics (the workers' counts, summed)."""
    with urllib.request.urlopen(srv.metrics_url, timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("seqserve_worker_reading_paused_total "):
                return float(line.split()[1])
    return 0.0


def _grpc_sum(srv: ServerProcess, value: float) -> float:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        x = grpcclient.InferInput("INPUT", [1, ELEMENTS], "FP32")
        x.set_data_from_numpy(np.full((1, ELEMENTS), value, np.float32))
        result = client.infer("held_sum", [x], sequence_id=new_int_id(), sequence_start=True, sequence_end=True)
        return float(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.close()


@pytest.mark.timeout(600)
def test_a_full_ring_pauses_reading_and_loses_nothing(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    srv = start_server(_repo(tmp_path, hold), "--workers", "2", log_dir=tmp_path, exit_timeout_s=30.0)
    answers: dict[int, float | BaseException] = {}

    def ask(i: int) -> None:
        try:
            answers[i] = (_http_sum if i < HTTP_REQUESTS else _grpc_sum)(srv, float(i + 1))
        except BaseException as e:  # reported below with the others
            answers[i] = e

    clients = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(HTTP_REQUESTS + GRPC_REQUESTS)]
    try:
        for t in clients:
            t.start()
        # 36 requests over 2 workers: one of them reads at least 18, and holds 8 at most
        wait_until_sync(lambda: FULL_LINE in srv.log(), "a worker pauses reading", timeout=240)
        assert not answers, answers  # the model holds every batch
    finally:
        hold.unlink()
    for t in clients:
        t.join(300)
    expected = {i: float(ELEMENTS * (i + 1)) for i in range(HTTP_REQUESTS + GRPC_REQUESTS)}
    assert answers == expected
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    conn.request("GET", "/v2/health/ready")
    assert conn.getresponse().status == 200
    conn.close()
    wait_until_sync(lambda: _paused_total(srv) >= 1, "/metrics counts the pause", timeout=60)
    # an input larger than any slab block goes the slow way (whole, over the control channel)
    assert _http_sum(srv, 2.0, 1 << 19) == float(1 << 20)
    srv.terminate()
    assert srv.wait() == 0, srv.log()
    line = next(x for x in srv.log().splitlines() if "the workers' rings carried" in x)
    assert int(re.findall(r"carried (\d+) requests", line)[0]) >= len(expected), line  # the compiled path
