"""Triton's flags that change what a running server does: --id in the server metadata,
--http/grpc-header-forward-pattern (headers become request parameters a model reads), and
--reuse-http-port (two servers on one port)."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.clients import http_request
from tests.support.models import write_model
from tests.support.process import ServerProcess

PARAMETERS_CONFIG = """
name: "parameters"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
PARAMETERS_MODEL = '''
"""OUT = the request's parameters, as JSON."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([r.parameters().encode()], dtype=object))])
            for r in requests
        ]
'''


@pytest.mark.timeout(180)
def test_id_and_header_forwarding(tmp_path: Path, launch: Callable[..., ServerProcess]) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "parameters", PARAMETERS_CONFIG, PARAMETERS_MODEL)
    srv = launch(
        repo,
        "--id=edge-7",
        "--http-header-forward-pattern",
        "PREFIX_.*",
        "--grpc-header-forward-pattern",
        "(?-i)prefix_.*",
    )
    assert http_request(srv, "GET", "/v2").json()["name"] == "edge-7"
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}], "parameters": {"mine": "kept"}}
    resp = http_request(
        srv, "POST", "/v2/models/parameters/infer", body, headers={"Prefix_User": "alice", "Other": "no"}
    )
    assert resp.status == 200, resp.body
    seen = json.loads(resp.json()["outputs"][0]["data"][0])
    assert seen == {"mine": "kept", "prefix_user": "alice"}  # case-insensitive; other headers stay out

    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert client.get_server_metadata().name == "edge-7"
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        result = client.infer("parameters", [x], headers={"prefix_tenant": "t1", "other": "no"})
        seen = json.loads(result.as_numpy("OUT")[0])
        assert seen == {"prefix_tenant": "t1"}
    finally:
        client.close()

    # a stream's metadata reaches each of its requests; a request's own parameter wins
    replies: queue.Queue[Any] = queue.Queue()
    stream_client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        stream_client.start_stream(
            callback=lambda result, error: replies.put(error or result), headers={"prefix_tenant": "t2", "x": "no"}
        )
        stream_client.async_stream_infer("parameters", [x], parameters={"prefix_tenant": "mine"})
        stream_client.async_stream_infer("parameters", [x])
        got = [json.loads(replies.get(timeout=60).as_numpy("OUT")[0]) for _ in range(2)]
        assert got == [{"prefix_tenant": "mine"}, {"prefix_tenant": "t2"}]
    finally:
        stream_client.stop_stream()
        stream_client.close()


@pytest.mark.timeout(180)
def test_reuse_http_port(tmp_path: Path, launch: Callable[..., ServerProcess]) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "parameters", PARAMETERS_CONFIG, PARAMETERS_MODEL)
    first = launch(repo, "--reuse-http-port=true")
    second = launch(
        repo,
        "--http-port",
        str(first.http_port),
        "--reuse-http-port=true",
        probe=lambda s: '"seqserve' in s.log() and ' ready"' in s.log(),
    )
    assert second.alive()
    assert http_request(first, "GET", "/v2/health/ready").status == 200
