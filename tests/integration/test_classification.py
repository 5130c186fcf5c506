"""Triton's classification extension over HTTP and gRPC, with tritonclient: a requested output
with a class count comes back as its top classes ("value:index[:label]", BYTES), and a count on
an output that cannot be ranked is refused before the request runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.clients import http_request
from tests.support.models import write_model
from tests.support.process import ServerProcess, serving

SCORES_CONFIG = """
name: "scores"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "SCORES" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" },
  { name: "INTS" data_type: TYPE_INT32 dims: [ 4 ] },
  { name: "HALF" data_type: TYPE_FP16 dims: [ 4 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
"""
SCORES_MODEL = """
import numpy as np


class Model:
    def execute(self, batch):
        x = batch.inputs["X"]
        text = np.array([[b"t"]] * len(x), dtype=object)
        return {"SCORES": x, "INTS": x.astype(np.int32), "HALF": x.astype(np.float16), "TEXT": text}
"""
#: three labels for four classes: class 3 has none
LABELS = "cat\ndog\nbird\n"
X = np.array([[0.1, 0.7, 0.2, 0.9], [4.0, 3.0, 3.0, 1.0]], dtype=np.float32)

CLIENTS: dict[str, Any] = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def scores_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("classification-repo")
    model_dir = write_model(repo, "scores", SCORES_CONFIG, SCORES_MODEL)
    (model_dir / "labels.txt").write_text(LABELS)
    with serving(repo, log_dir=repo) as srv:
        yield srv


def _client(protocol: str, srv: ServerProcess) -> Any:
    return CLIENTS[protocol].InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)


def _infer_scores(protocol: str, srv: ServerProcess, *outputs: Any) -> Any:
    mod = CLIENTS[protocol]
    x = mod.InferInput("X", list(X.shape), "FP32")
    x.set_data_from_numpy(X)
    return _client(protocol, srv).infer("scores", [x], outputs=list(outputs))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_class_count_on_the_demo_accumulator(server: ServerProcess, protocol: str) -> None:
    mod = CLIENTS[protocol]
    x = mod.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
    out = mod.InferRequestedOutput("OUTPUT", class_count=1)
    result = _client(protocol, server).infer(
        "accumulator", [x], outputs=[out], sequence_id=9_100 + len(protocol), sequence_start=True, sequence_end=True
    )
    got = result.as_numpy("OUTPUT")
    assert got.dtype == object and got.tolist() == [[b"3.000000:0"]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_top_classes_with_labels_per_batch_entry(scores_server: ServerProcess, protocol: str) -> None:
    mod = CLIENTS[protocol]
    result = _infer_scores(
        protocol,
        scores_server,
        mod.InferRequestedOutput("SCORES", class_count=2),
        mod.InferRequestedOutput("INTS", class_count=10),  # more than the 4 classes: all 4, as Triton
        mod.InferRequestedOutput("HALF"),  # no class count: the values
    )
    assert result.as_numpy("SCORES").tolist() == [
        [b"0.900000:3", b"0.700000:1:dog"],
        [b"4.000000:0:cat", b"3.000000:1:dog"],  # a tie: the lower index first
    ]
    ints = result.as_numpy("INTS")
    assert ints.shape == (2, 4)
    assert ints[1].tolist() == [b"4:0", b"3:1", b"3:2", b"1:3"]  # integers as they are, no labels
    assert result.as_numpy("HALF").dtype == np.float16


def test_classification_as_json_data(scores_server: ServerProcess) -> None:
    out = httpclient.InferRequestedOutput("SCORES", binary_data=False, class_count=1)
    result = _infer_scores("http", scores_server, out)
    (entry,) = result.get_response()["outputs"]
    assert entry["datatype"] == "BYTES" and entry["shape"] == [2, 1]
    assert entry["data"] == ["0.900000:3", "4.000000:0:cat"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("output", "datatype"), [("HALF", "FP16"), ("TEXT", "BYTES")])
def test_unrankable_output_is_refused(scores_server: ServerProcess, protocol: str, output: str, datatype: str) -> None:
    mod = CLIENTS[protocol]
    with pytest.raises(InferenceServerException) as ei:
        _infer_scores(protocol, scores_server, mod.InferRequestedOutput(output, class_count=1))
    assert f"unsupported type '{datatype}'" in ei.value.message()
    assert ei.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert _client(protocol, scores_server).is_model_ready("scores")


@pytest.mark.parametrize("value", [-1, "2", 1.5, True])
def test_bad_class_count_is_400(scores_server: ServerProcess, value: Any) -> None:
    body = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "SCORES", "parameters": {"classification": value}}],
    }
    r = http_request(scores_server, "POST", "/v2/models/scores/infer", body)
    assert r.status == 400 and "Unable to parse 'classification'" in r.error()


def test_classification_on_a_stream(server: ServerProcess) -> None:
    results: list[Any] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.append(error or result))
    try:
        x = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[1, 5, 2, 3]], np.float32))
        y = grpcclient.InferInput("INPUT1", [1, 4], "FP32")
        y.set_data_from_numpy(np.ones((1, 4), np.float32))
        ranked = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
        client.async_stream_infer("add_sub", [x, y], outputs=[ranked, grpcclient.InferRequestedOutput("OUTPUT1")])
    finally:
        client.stop_stream()
    (result,) = results
    assert result.as_numpy("OUTPUT0").tolist() == [[b"6.000000:1", b"4.000000:3"]]
    assert result.as_numpy("OUTPUT1").tolist() == [[0, 4, 1, 2]]
