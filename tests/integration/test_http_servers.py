"""The HTTP API behaves the same on every server seqserve can run it on."""

from __future__ import annotations

import email.utils
import gzip
from collections.abc import Callable

import granian  # noqa: F401  (in the test extra: missing, it is an error, not a skip)
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.clients import acc_input, binary_body, http_request, new_int_id, raw_output
from tests.support.process import ServerProcess

pytestmark = pytest.mark.parametrize("http_server", ["builtin", "hypercorn", "granian"])


def _start(launch: Callable[..., ServerProcess], http_server: str) -> ServerProcess:
    srv = launch(None, "--http-server", http_server)
    assert f"HTTP ({http_server})" in srv.log()
    return srv


def test_tritonclient_sequence_and_errors(launch: Callable[..., ServerProcess], http_server: str) -> None:
    srv = _start(launch, http_server)
    client = httpclient.InferenceServerClient(srv.http_url)
    sid = new_int_id()
    sums = []
    for step, x in enumerate([1.0, 2.0, 3.0]):
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[x]], np.float32))
        r = client.infer("accumulator", [inp], sequence_id=sid, sequence_start=step == 0, sequence_end=step == 2)
        sums.append(float(r.as_numpy("OUTPUT")[0, 0]))
    assert sums == [1.0, 3.0, 6.0]
    assert client.get_model_metadata("accumulator")["inputs"][0]["shape"] == [-1, 1]
    with pytest.raises(Exception, match="must specify the START flag"):
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[1.0]], np.float32))
        client.infer("accumulator", [inp], sequence_id=sid)


def test_raw_http_paths(launch: Callable[..., ServerProcess], http_server: str) -> None:
    srv = _start(launch, http_server)
    # binary in, binary out, gzip both ways
    x = np.array([[2.5]], np.float32)
    doc = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}],
        "parameters": {"sequence_id": new_int_id(), "sequence_start": True, "binary_data_output": True},
    }
    body, headers = binary_body(doc, x.tobytes())
    headers |= {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}
    r = http_request(srv, "POST", "/v2/models/accumulator/infer", gzip.compress(body), headers)
    assert r.status == 200, r.body
    assert r.headers["content-encoding"] == "gzip"
    plain = gzip.decompress(r.body)
    n = int(r.headers["inference-header-content-length"])
    assert np.frombuffer(plain[n:], np.float32).tolist() == [2.5]
    # JSON, server-generated session id, then the session header continues it
    r = http_request(srv, "POST", "/v2/models/accumulator/infer", {"inputs": [acc_input(4.0)]})
    assert r.status == 200 and raw_output(r) == [4.0]
    session = r.headers["inference-session-id"]
    r = http_request(
        srv, "POST", "/v2/models/accumulator/infer", {"inputs": [acc_input(1.0)]}, {"Inference-Session-Id": session}
    )
    assert raw_output(r) == [5.0]
    # errors keep Triton's shape and status
    r = http_request(srv, "POST", "/v2/models/nope/infer", {"inputs": [acc_input()]})
    assert r.status == 404 and "nope" in r.error()
    r = http_request(srv, "GET", "/v2/models/accumulator/infer")
    assert r.status == 405 and r.error() == "Method Not Allowed"
    r = http_request(srv, "GET", "/v2/health/ready")
    assert r.status == 200 and r.body == b""


def test_replies_carry_a_date(launch: Callable[..., ServerProcess], http_server: str) -> None:
    """RFC 9110 §6.6.1: an origin server with a clock sends Date on its 2xx and 4xx replies."""
    srv = _start(launch, http_server)
    for path in ("/v2/health/ready", "/v2/models/nope"):
        r = http_request(srv, "GET", path)
        assert r.status in (200, 404)
        assert email.utils.parsedate_to_datetime(r.headers["date"]).tzinfo is not None
