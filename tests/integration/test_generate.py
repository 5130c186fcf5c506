"""Triton's generate extension on a real `seqserve serve`, over each HTTP server (builtin, and
hypercorn and granian through the ASGI adapter): `generate` (one JSON response) and
`generate_stream` (server-sent events) with the demo models, sequence ids as parameters and
sessions as headers, a decoupled model streamed event by event, Triton's iterative_sequence
model answering L0_iterative_sequence's generate_stream expectations, errors as JSON (400 for
bad JSON or types, 404 for an unknown model, 413 for a body over the limit), and a client
that disconnects mid-stream cancelling its request."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.clients import new_int_id
from tests.support.iterative import write_triton_iterative
from tests.support.models import copy_demo_models, write_model
from tests.support.process import ServerProcess, serving

MAX_BODY = 65536
SSE = {"Accept": "text/event-stream"}

# An iterative model that counts down from N (INT32 [1]) one response per step, 20 ms a step.
COUNTDOWN = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        time.sleep(0.02)
        for request in requests:
            cid = request.correlation_id()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            left = self.left.get(cid, n) - 1
            self.left[cid] = left
            response = pb_utils.InferenceResponse([pb_utils.Tensor("LEFT", np.array([left], np.int32))])
            sender = request.get_response_sender()
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
            else:
                del self.left[cid]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

COUNTDOWN_CONFIG = """
name: "countdown"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
sequence_batching { iterative_sequence: true }
"""


@pytest.fixture(scope="module", params=["builtin", "hypercorn", "granian"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("generate-repo")
    copy_demo_models(repo, "add_sub", "accumulator", "streaming_sum")
    # Triton's QA model keeps its count per instance, not per sequence: one request per copy
    write_triton_iterative(repo)
    write_triton_iterative(repo, "iterative_unary")
    write_model(repo, "countdown", COUNTDOWN_CONFIG, COUNTDOWN)
    with serving(repo, "--http-server", request.param, "--http-max-body-bytes", str(MAX_BODY), log_dir=repo) as s:
        yield s


def url(srv: ServerProcess, model: str, kind: str = "generate", version: str = "") -> str:
    v = f"/versions/{version}" if version else ""
    return f"{srv.base_url}/v2/models/{model}{v}/{kind}"


def post(srv: ServerProcess, model: str, doc: Any, kind: str = "generate", **kw: Any) -> requests.Response:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return requests.post(url(srv, model, kind, kw.pop("version", "")), data=body, timeout=30, **kw)


def events(r: requests.Response) -> list[dict[str, Any]]:
    """The `data:` events of a server-sent event stream, decoded."""
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    out = []
    for block in r.text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            out.append(json.loads(block[len("data: ") :]))
    return out


# --------------------------------------------------------------------------- generate


def test_generate_maps_fields_to_inputs_and_outputs(srv: ServerProcess) -> None:
    r = post(srv, "add_sub", {"id": "42", "INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}, version="1")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "id": "42",
        "model_name": "add_sub",
        "model_version": "1",
        "OUTPUT0": [2.0, 3.0, 4.0, 5.0],
        "OUTPUT1": [0.0, 1.0, 2.0, 3.0],
    }


def test_generate_honours_sequence_parameters_and_sessions(srv: ServerProcess) -> None:
    sid = new_int_id()
    steps = [
        {"INPUT": 1, "parameters": {"sequence_id": sid, "sequence_start": True}},
        {"INPUT": 2, "sequence_id": sid},  # a parameter at the top level, as Triton takes it
        {"INPUT": 3, "parameters": {"sequence_id": sid, "sequence_end": True}},
    ]
    assert [post(srv, "accumulator", s).json()["OUTPUT"] for s in steps] == [1.0, 3.0, 6.0]
    session = {"Inference-Session-Id": f"gen-{sid}"}
    got = [post(srv, "accumulator", {"INPUT": x}, headers=session).json()["OUTPUT"] for x in (4, 5)]
    assert got == [4.0, 9.0]


def test_generate_needs_exactly_one_response(srv: ServerProcess) -> None:
    r = post(srv, "iterative_unary", {"IN": 2})
    assert r.status_code == 500 and "exactly 1 response" in r.json()["error"], r.text


# -------------------------------------------------------------------- generate_stream


def test_generate_stream_sends_a_decoupled_models_responses_as_events(srv: ServerProcess) -> None:
    doc = {"CHUNK": [1, 2, 3], "sequence_id": new_int_id(), "sequence_start": True, "sequence_end": True}
    r = post(srv, "streaming_sum", doc, kind="generate_stream", headers=SSE)
    assert r.status_code == 200, r.text
    assert [e["PARTIAL"] for e in events(r)] == [1, 3, 6]


def test_generate_stream_of_a_one_response_model(srv: ServerProcess) -> None:
    r = post(srv, "add_sub", {"INPUT0": [1, 1, 1, 1], "INPUT1": [0, 0, 0, 0]}, kind="generate_stream")
    assert [e["OUTPUT0"] for e in events(r)] == [[1.0, 1.0, 1.0, 1.0]]


def test_triton_iterative_model_over_generate_stream(srv: ServerProcess) -> None:
    # Triton's L0_iterative_sequence test_generate_stream: two events, OUTPUT 1 then 0 (the QA
    # python model names them IN and OUT)
    r = post(srv, "iterative_sequence", {"IN": 2}, kind="generate_stream", headers=SSE)
    r.raise_for_status()
    assert [e["OUT"] for e in events(r)] == [1, 0]
    assert all(e["model_name"] == "iterative_sequence" for e in events(r))


def test_generate_stream_errors_are_events(srv: ServerProcess) -> None:
    # a non-START request to an unknown sequence is refused when queued: a JSON error
    r = post(srv, "accumulator", {"INPUT": 1, "sequence_id": new_int_id()}, kind="generate_stream")
    assert r.status_code == 400 and "START" in r.json()["error"], r.text


def test_client_that_disconnects_mid_stream_cancels(srv: ServerProcess) -> None:
    body = json.dumps({"N": 1_000_000}).encode()
    head = (
        f"POST /v2/models/countdown/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", srv.http_port), timeout=30) as s:
        s.sendall(head + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got
    # the model has one slot: the next sequence runs only once the first one has ended
    r = post(srv, "countdown", {"N": 2}, kind="generate_stream")
    assert [e["LEFT"] for e in events(r)] == [1, 0]


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (b"{not json", "failed to parse the request JSON"),
        (b"[1, 2]", "must be a JSON object"),
        ({"INPUT0": ["a", "b", "c", "d"], "INPUT1": [1, 1, 1, 1]}, "expected numbers"),
        ({"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1, 1]}, "can not convert input 'INPUT0'"),
        ({"INPUT0": [[1, 2], [3, 4]], "INPUT1": [1, 1, 1, 1]}, "flat array"),
        ({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "sequence_start": "yes"}, "'sequence_start'"),
        ({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "custom": {"a": 1}}, "'custom'"),
        ({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "parameters": 5}, "Expected JSON object"),
        ({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "id": 7}, "'id'"),
        ({"INPUT0": [1, 2, 3, 4]}, "INPUT1"),
    ],
)
@pytest.mark.parametrize("kind", ["generate", "generate_stream"])
def test_bad_requests_are_400_with_a_message(srv: ServerProcess, doc: Any, fragment: str, kind: str) -> None:
    r = post(srv, "add_sub", doc, kind=kind)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert fragment in r.json()["error"], r.text


@pytest.mark.parametrize("kind", ["generate", "generate_stream"])
def test_unknown_model_is_404_and_big_bodies_413(srv: ServerProcess, kind: str) -> None:
    r = post(srv, "no_such_model", {"x": 1}, kind=kind)
    assert r.status_code == 404 and "unknown model" in r.json()["error"], r.text
    r = post(srv, "add_sub", {"INPUT0": [1.0] * MAX_BODY, "INPUT1": [1, 1, 1, 1]}, kind=kind)
    assert r.status_code == 413, r.text
    assert requests.get(f"{srv.base_url}/v2/health/live", timeout=30).status_code == 200


def test_generate_is_restricted_as_inference(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    repo = copy_demo_models(tmp_path / "repo", "add_sub")
    srv = launch(repo, "--http-restricted-api=inference:gen-key=gen-value")
    doc = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}
    for kind in ("generate", "generate_stream"):
        assert post(srv, "add_sub", doc, kind=kind).status_code == 403
        r = post(srv, "add_sub", doc, kind=kind, headers={"gen-key": "gen-value"})
        assert r.status_code == 200, r.text
