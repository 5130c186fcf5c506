"""Bad requests get the right status (protocol.md 4.1/4.2: INVALID_ARG 400 / INVALID_ARGUMENT,
NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501 / UNIMPLEMENTED, too large 413, an unknown
Content-Encoding 415) and a clear
`{"error": ...}` message, while sequences running beside them on the same server keep
producing correct sums."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.clients import acc_input, add_sub_inputs, binary_body, http_request, new_int_id, raw_output
from tests.support.live import LiveSequences
from tests.support.process import ServerProcess

START_MSG = "must specify the START flag on the first request of the sequence"


@pytest.fixture(scope="module")
def background(server: ServerProcess) -> Iterator[LiveSequences]:
    """Two threads (raw HTTP keep-alive, tritonclient gRPC) stepping the demo accumulators'
    sequences beside the bad input until the module ends; every sum is checked."""
    live = LiveSequences(
        server,
        flavours=("http", "grpc"),
        pace_s=0,
        http_model="accumulator",
        grpc_model="accumulator_corrid",
        step_timeout_s=30,
    ).start()
    yield live
    failures = live.stop()
    assert not failures, failures
    assert all(n >= 10 for n in live.steps.values()), live.steps


# --------------------------------------------------------------------------- raw HTTP

SEQ = {"sequence_id": 5, "sequence_start": True, "sequence_end": True}
_bin_doc = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "parameters": {"binary_data_size": 4}}],
            "parameters": SEQ}  # fmt: skip
_bin_head = json.dumps(_bin_doc).encode()
_IHCL = "Inference-Header-Content-Length"
FOUR = np.float32(1).tobytes()

# (case id, path, body, headers, status, message fragment)
HTTP_CASES: list[tuple[str, str, bytes | dict[str, Any], dict[str, str], int, str]] = [
    ("malformed-json", "accumulator", b'{"inputs": [', {}, 400, "failed to parse the request JSON"),
    ("not-an-object", "accumulator", b"[1, 2]", {}, 400, "must be a JSON object"),
    ("no-inputs", "accumulator", {"parameters": SEQ}, {}, 400, "'inputs' array"),
    ("ihcl-not-a-number", "accumulator", _bin_head + FOUR, {_IHCL: "abc"}, 400, "Inference-Header-Content-Length"),
    ("ihcl-negative", "accumulator", _bin_head + FOUR, {_IHCL: "-5"}, 400, "Inference-Header-Content-Length"),
    ("ihcl-too-big", "accumulator", _bin_head + FOUR, {_IHCL: "9999"}, 400, "out of range"),
    ("ihcl-too-small", "accumulator", _bin_head + FOUR, {_IHCL: "10"}, 400, "failed to parse the request JSON"),
    ("ihcl-missing", "accumulator", _bin_head + FOUR, {}, 400, "failed to parse the request JSON"),
    ("binary-truncated", "accumulator", _bin_head + b"\0\0", {_IHCL: str(len(_bin_head))}, 400,
     "expecting 4 additional bytes"),
    ("binary-oversized", "accumulator", _bin_head + FOUR + b"\0" * 4, {_IHCL: str(len(_bin_head))}, 400,
     "unexpected additional input data for model 'accumulator'"),
    ("binary-size-vs-shape", "accumulator", *binary_body({"inputs": [{"name": "INPUT", "datatype": "FP32",
     "shape": [1, 1], "parameters": {"binary_data_size": 2}}], "parameters": SEQ}, b"\0\0"), 400,
     "expecting 4 bytes but got 2"),
    ("data-and-binary", "accumulator",
     {"inputs": [acc_input(parameters={"binary_data_size": 0})], "parameters": SEQ}, {}, 400, "both"),
    ("wrong-datatype", "accumulator", {"inputs": [acc_input(datatype="INT32", data=[1])], "parameters": SEQ}, {},
     400, "inference input 'INPUT' data-type is 'INT32', but model 'accumulator' expects 'FP32'"),
    ("unknown-datatype", "accumulator", {"inputs": [acc_input(datatype="FLOAT")], "parameters": SEQ}, {}, 400,
     "unknown datatype 'FLOAT'"),
    ("wrong-shape", "accumulator", {"inputs": [acc_input(shape=[1, 2], data=[1, 2])], "parameters": SEQ}, {}, 400,
     "unexpected shape for input 'INPUT' for model 'accumulator'. Expected [-1,1], got [1,2]"),
    ("shape-vs-data", "accumulator", {"inputs": [acc_input(shape=[1, 3])], "parameters": SEQ}, {}, 400,
     "Shape does not match"),
    ("bad-data", "accumulator", {"inputs": [acc_input(data=["x"])], "parameters": SEQ}, {}, 400,
     "Unable to parse 'data'"),
    ("negative-dim", "accumulator", {"inputs": [acc_input(shape=[-1, 1])], "parameters": SEQ}, {}, 400,
     "non-negative integers"),
    ("unknown-input", "accumulator", {"inputs": [acc_input(), acc_input(name="EXTRA")], "parameters": SEQ}, {},
     400, "unexpected inference input 'EXTRA'"),
    ("missing-input", "add_sub", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                              "data": [1, 2, 3, 4]}]}, {}, 400, "missing required input(s) ['INPUT1']"),
    ("batch-too-big", "add_sub",
     {"inputs": [{"name": n, "datatype": "FP32", "shape": [9, 4], "data": [0.0] * 36} for n in ("INPUT0", "INPUT1")]},
     {}, 400, "batch-size must be <= 8"),
    ("sequence-batch-2", "accumulator", {"inputs": [acc_input(shape=[2, 1], data=[1, 2])], "parameters": SEQ}, {},
     400, "must specify batch-size 1"),
    ("unknown-model", "no_such_model", {"inputs": [acc_input()]}, {}, 404,
     "Request for unknown model: 'no_such_model' is not found"),
    ("unknown-version", "accumulator/versions/7", {"inputs": [acc_input()], "parameters": SEQ}, {}, 404,
     "'accumulator' version 7 is not found"),
    ("non-numeric-version", "accumulator/versions/latest", {"inputs": [acc_input()]}, {}, 404, "Not Found"),
    ("unknown-output", "accumulator", {"inputs": [acc_input()], "outputs": [{"name": "NOPE"}], "parameters": SEQ},
     {}, 400, "unexpected inference output 'NOPE' for model 'accumulator'"),
    ("outputs-not-array", "accumulator", {"inputs": [acc_input()], "outputs": {"name": "OUTPUT"}}, {}, 400,
     "'outputs' must be an array"),
    ("parameters-not-object", "accumulator", {"inputs": [acc_input()], "parameters": [1]}, {}, 400,
     "'parameters' must be a JSON object"),
    ("sequence-id-float", "accumulator", {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_id": 1.5}}, {},
     400, "Unable to parse 'sequence_id'"),
    ("sequence-id-negative", "accumulator", {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_id": -1}}, {},
     400, "Unable to parse 'sequence_id'"),
    ("sequence-id-bool", "accumulator", {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_id": True}}, {},
     400, "Unable to parse 'sequence_id'"),
    ("sequence-id-too-big", "accumulator", {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_id": 2**64}},
     {}, 400, "Unable to parse 'sequence_id'"),
    ("sequence-start-string", "accumulator",
     {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_start": "true"}}, {}, 400,
     "Unable to parse 'sequence_start'"),
    ("sequence-end-int", "accumulator", {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_end": 1}}, {}, 400,
     "Unable to parse 'sequence_end'"),
    ("no-start-unknown-id", "accumulator",
     {"inputs": [acc_input()], "parameters": {"sequence_id": 987654321987, "sequence_start": False}}, {}, 400,
     f"inference request for sequence 987654321987 to model 'accumulator' {START_MSG}"),
    ("no-start-unknown-string-id", "accumulator",
     {"inputs": [acc_input()], "parameters": {"sequence_id": "nobody"}}, {}, 400, "sequence nobody"),
    ("string-id-to-uint64-corrid", "accumulator_corrid",
     {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_id": "abc"}}, {}, 400,
     "sequence batching control 'CORRID' data-type is 'BYTES', but model 'accumulator_corrid' expects 'UINT64'"),
    ("string-id-too-long", "accumulator", {"inputs": [acc_input()], "parameters": {**SEQ, "sequence_id": "x" * 129}},
     {}, 400, "cannot be longer than 128 characters"),
    ("priority-negative", "add_sub", {"inputs": [acc_input()], "parameters": {"priority": -1}}, {}, 400,
     "Unable to parse 'priority'"),
    ("timeout-string", "add_sub", {"inputs": [acc_input()], "parameters": {"timeout": "1s"}}, {}, 400,
     "Unable to parse 'timeout'"),
    ("bf16-json", "add_sub", {"inputs": [{"name": "INPUT0", "datatype": "BF16", "shape": [1], "data": [1.0]}]}, {},
     400, "receiving BF16 data via JSON is not supported"),
    ("shared-memory", "add_sub", {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                              "parameters": {"shared_memory_region": "r"}}]}, {}, 400,
     "'shared_memory_byte_size' must be given"),
    ("content-encoding-unknown", "add_sub", b"{}", {"Content-Encoding": "zstd"}, 415, "Unsupported compression type"),
    ("content-encoding-corrupt", "add_sub", b"{}", {"Content-Encoding": "deflate"}, 400, "failed to decompress"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "fragment"), [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES]
)
def test_http_bad_request(
    server: ServerProcess,
    background: LiveSequences,
    path: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str],
    status: int,
    fragment: str,
) -> None:
    r = http_request(server, "POST", f"/v2/models/{path}/infer", body, headers)
    assert r.status == status, (r.status, r.body)
    assert r.headers["content-type"] == "application/json"
    assert fragment in r.error(), r.error()


def test_http_errors_through_tritonclient(server: ServerProcess, background: LiveSequences) -> None:
    """What tritonclient users see: InferenceServerException with status and message."""
    cl = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
        for kwargs, status, fragment in (
            ({"model_name": "no_such_model"}, "404", "no_such_model"),
            ({"model_name": "accumulator", "model_version": "3", "sequence_id": 1, "sequence_start": True}, "404",
             "version 3"),
            ({"model_name": "accumulator", "sequence_id": new_int_id()}, "400", START_MSG),
            ({"model_name": "accumulator", "sequence_id": 5, "sequence_start": True,
              "outputs": [httpclient.InferRequestedOutput("NOPE")]}, "400", "'NOPE'"),
        ):  # fmt: skip
            with pytest.raises(InferenceServerException) as info:
                cl.infer(inputs=[inp], **kwargs)
            assert info.value.status() == status
            assert fragment in info.value.message()
        # the connection is still good for a correct request
        sid = new_int_id()
        res = cl.infer("accumulator", [inp], sequence_id=sid, sequence_start=True, sequence_end=True)
        assert res.as_numpy("OUTPUT").tolist() == [[1.0]]
    finally:
        cl.close()


def test_http_keep_alive_after_errors(server: ServerProcess, background: LiveSequences) -> None:
    """Rejected requests (with bodies) must not corrupt the next request on the connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        for path, body, headers, status, _ in [c[1:] for c in HTTP_CASES[:12]]:
            r = http_request(server, "POST", f"/v2/models/{path}/infer", body, headers, conn=conn)
            assert r.status == status
            doc = {"inputs": [acc_input(2.0)], "parameters": SEQ}
            r = http_request(server, "POST", "/v2/models/accumulator/infer", doc, conn=conn)
            assert r.status == 200 and raw_output(r) == [2.0]
    finally:
        conn.close()


def test_start_or_end_without_id(server: ServerProcess, background: LiveSequences) -> None:
    """By default an id-less request opens a sequence under a generated id, START or END flag
    or not (`--strict-sequence-ids` turns these into errors: test_sequences.py). Stateless
    models ignore sequence flags, as Triton does."""
    for params in ({"sequence_start": True}, {"sequence_end": True}, {"sequence_start": True, "sequence_end": True}):
        r = http_request(server, "POST", "/v2/models/accumulator/infer", {"inputs": [acc_input(4.0)],
                                                                            "parameters": params})  # fmt: skip
        assert r.status == 200 and raw_output(r) == [4.0]
        sid = r.json()["parameters"]["sequence_id"]
        assert r.headers["inference-session-id"] == sid
        end = {"inputs": [acc_input(1.0)], "parameters": {"sequence_id": sid, "sequence_end": True}}
        r = http_request(server, "POST", "/v2/models/accumulator/infer", end)
        if params.get("sequence_end"):  # that first request was also the last
            assert r.status == 400 and START_MSG in r.error()
        else:
            assert r.status == 200 and raw_output(r) == [5.0]
    a = {"datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
    doc = {"inputs": [{"name": "INPUT0", **a}, {"name": "INPUT1", **a}], "parameters": {"sequence_end": True}}
    r = http_request(server, "POST", "/v2/models/add_sub/infer", doc)
    assert r.status == 200 and "inference-session-id" not in r.headers


def test_http_body_limit(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, "--http-max-body-bytes", "512")
    big = {"inputs": [{"name": n, "datatype": "FP32", "shape": [8, 4], "data": [123456.789] * 32}
                      for n in ("INPUT0", "INPUT1")]}  # fmt: skip
    raw = json.dumps(big).encode()
    assert len(raw) > 512
    r = http_request(srv, "POST", "/v2/models/add_sub/infer", raw)
    assert r.status == 413, r.body
    assert "exceeds the server's limit of 512 bytes" in r.error()
    # chunked upload (no Content-Length): the limit applies while reading
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/add_sub/infer", body=iter([raw[:400], raw[400:]]), encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
        assert "exceeds" in json.loads(resp.read())["error"]
    finally:
        conn.close()
    # also on the load API
    r = http_request(srv, "POST", "/v2/repository/models/add_sub/load", {"parameters": {"config": "x" * 4096}})
    assert r.status == 413
    # tritonclient sees the 413; small requests still work (on gRPC too, whose message limit
    # follows --http-max-body-bytes unless --grpc-max-receive-message-bytes says otherwise)
    cl = httpclient.InferenceServerClient(srv.http_url)
    try:
        ins = add_sub_inputs(httpclient, 64)
        with pytest.raises(InferenceServerException) as info:
            cl.infer("add_sub", ins)
        assert info.value.status() == "413"
        sid = new_int_id()
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
        res = cl.infer("accumulator", [inp], sequence_id=sid, sequence_start=True, sequence_end=True)
        assert res.as_numpy("OUTPUT").tolist() == [[1.0]]
    finally:
        cl.close()
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        ins = add_sub_inputs(grpcclient, 8)
        assert g.infer("add_sub", ins).as_numpy("OUTPUT0").tolist() == [[2.0] * 4] * 8
    finally:
        g.close()


# -------------------------------------------------------------------------------- gRPC


def _grpc_req(model: str = "accumulator", **params: Any) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name=model, id="rq")
    r.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
    r.raw_input_contents.append(FOUR)
    for key, (kind, value) in params.items():
        setattr(r.parameters[key], kind, value)
    return r


def _mutate(fn: Callable[[service_pb2.ModelInferRequest], Any], **params: Any) -> service_pb2.ModelInferRequest:
    r = _grpc_req(**params)
    fn(r)
    return r


_ID = {"sequence_id": ("int64_param", 5), "sequence_start": ("bool_param", True), "sequence_end": ("bool_param", True)}
Code = grpc.StatusCode

# (case id, request, status code, message fragment)
GRPC_CASES: list[tuple[str, service_pb2.ModelInferRequest, grpc.StatusCode, str]] = [
    ("unknown-model", _grpc_req("no_such_model"), Code.NOT_FOUND, "'no_such_model' is not found"),
    ("unknown-version", _mutate(lambda r: setattr(r, "model_version", "4"), **_ID), Code.NOT_FOUND, "version 4"),
    ("bad-version", _mutate(lambda r: setattr(r, "model_version", "x"), **_ID), Code.INVALID_ARGUMENT,
     "failed to parse version 'x'"),
    ("wrong-datatype", _mutate(lambda r: setattr(r.inputs[0], "datatype", "INT32"), **_ID), Code.INVALID_ARGUMENT,
     "data-type is 'INT32'"),
    ("unknown-datatype", _mutate(lambda r: setattr(r.inputs[0], "datatype", "FLOAT"), **_ID), Code.INVALID_ARGUMENT,
     "unknown datatype"),
    ("bf16", _mutate(lambda r: setattr(r.inputs[0], "datatype", "BF16"), **_ID), Code.UNIMPLEMENTED, "BF16"),
    ("wrong-shape", _mutate(lambda r: r.inputs[0].shape.append(1), **_ID), Code.INVALID_ARGUMENT,
     "unexpected shape for input 'INPUT' for model 'accumulator'. Expected [-1,1], got [1,1,1]"),
    ("raw-too-short", _mutate(lambda r: r.raw_input_contents.__setitem__(0, b"\0\0"), **_ID), Code.INVALID_ARGUMENT,
     "expecting 4 bytes but got 2"),
    ("raw-extra", _mutate(lambda r: r.raw_input_contents.append(FOUR), **_ID), Code.INVALID_ARGUMENT,
     "unexpected additional input data"),
    ("raw-and-contents", _mutate(lambda r: r.inputs[0].contents.fp32_contents.append(1.0), **_ID),
     Code.INVALID_ARGUMENT, "contents field must not be specified"),
    ("missing-input", _mutate(lambda r: (r.ClearField("inputs"), r.ClearField("raw_input_contents")), **_ID),
     Code.INVALID_ARGUMENT, "missing required input(s) ['INPUT']"),
    ("unknown-output", _mutate(lambda r: r.outputs.add(name="NOPE"), **_ID), Code.INVALID_ARGUMENT,
     "unexpected inference output 'NOPE'"),
    ("shared-memory", _mutate(lambda r: setattr(r.inputs[0].parameters["shared_memory_region"], "string_param", "r"),
                              **_ID), Code.INVALID_ARGUMENT, "'shared_memory_byte_size' must be given"),
    ("sequence-id-double", _grpc_req(sequence_id=("double_param", 1.5)), Code.INVALID_ARGUMENT,
     "expected int64_param or string_param"),
    ("sequence-id-bool", _grpc_req(sequence_id=("bool_param", True)), Code.INVALID_ARGUMENT,
     "expected int64_param or string_param"),
    ("sequence-start-string", _grpc_req(sequence_id=("int64_param", 5), sequence_start=("string_param", "true")),
     Code.INVALID_ARGUMENT, "invalid value type for 'sequence_start' parameter, expected bool_param."),
    ("sequence-end-int", _grpc_req(sequence_id=("int64_param", 5), sequence_end=("int64_param", 1)),
     Code.INVALID_ARGUMENT, "invalid value type for 'sequence_end' parameter, expected bool_param."),
    ("priority-double", _grpc_req(priority=("double_param", 1.0)), Code.INVALID_ARGUMENT, "'priority'"),
    ("timeout-string", _grpc_req(timeout=("string_param", "1")), Code.INVALID_ARGUMENT, "'timeout'"),
    ("no-start", _grpc_req(sequence_id=("int64_param", 123454321)), Code.INVALID_ARGUMENT,
     f"sequence 123454321 to model 'accumulator' {START_MSG}"),
    ("string-id-to-uint64-corrid", _grpc_req("accumulator_corrid", sequence_id=("string_param", "s"),
                                             sequence_start=("bool_param", True)), Code.INVALID_ARGUMENT,
     "data-type is 'BYTES', but model 'accumulator_corrid' expects 'UINT64'"),
    ("string-id-too-long", _grpc_req(sequence_id=("string_param", "y" * 200), sequence_start=("bool_param", True)),
     Code.INVALID_ARGUMENT, "cannot be longer than 128 characters"),
    ("sequence-batch-2", _mutate(lambda r: (r.inputs[0].shape.__setitem__(0, 2),
                                            r.raw_input_contents.__setitem__(0, FOUR * 2)), **_ID),
     Code.INVALID_ARGUMENT, "must specify batch-size 1"),
]  # fmt: skip


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as ch:
        yield service_pb2_grpc.GRPCInferenceServiceStub(ch)


@pytest.mark.parametrize(("request_", "code", "fragment"), [c[1:] for c in GRPC_CASES], ids=[c[0] for c in GRPC_CASES])
def test_grpc_bad_request(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
    background: LiveSequences,
    request_: service_pb2.ModelInferRequest,
    code: grpc.StatusCode,
    fragment: str,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request_, timeout=20)
    assert info.value.code() == code, info.value.details()
    assert fragment in (info.value.details() or ""), info.value.details()


def test_grpc_bad_requests_on_stream(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, background: LiveSequences
) -> None:
    """The same bad requests on one stream: one error reply each, the stream stays open, and a
    sequence on that stream goes on between them."""
    sid = new_int_id()
    reqs = []
    for n, (name, req, _, _) in enumerate(GRPC_CASES):
        bad = service_pb2.ModelInferRequest()
        bad.CopyFrom(req)
        bad.id = f"bad-{name}"
        reqs.append(bad)
        good = _grpc_req(sequence_id=("int64_param", sid), sequence_start=("bool_param", n == 0),
                         sequence_end=("bool_param", n == len(GRPC_CASES) - 1))  # fmt: skip
        good.id = f"good-{n}"
        reqs.append(good)
    replies = list(stub.ModelStreamInfer(iter(reqs), timeout=30))
    assert len(replies) == len(reqs)
    by_id = {r.infer_response.id: r for r in replies}
    for name, _, _, fragment in GRPC_CASES:
        assert fragment in by_id[f"bad-{name}"].error_message, name
    for n in range(len(GRPC_CASES)):
        good = by_id[f"good-{n}"]
        assert good.error_message == ""
        assert np.frombuffer(good.infer_response.raw_output_contents[0], dtype=np.float32).tolist() == [n + 1.0]


def test_grpc_other_calls_errors(server: ServerProcess, background: LiveSequences) -> None:
    cl = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for call, code in (
            (lambda: cl.get_model_metadata("no_such_model"), "StatusCode.NOT_FOUND"),
            (lambda: cl.get_model_metadata("accumulator", "2"), "StatusCode.NOT_FOUND"),
            (lambda: cl.get_model_config("no_such_model"), "StatusCode.NOT_FOUND"),
            (lambda: cl.get_inference_statistics("no_such_model"), "StatusCode.INVALID_ARGUMENT"),
            (lambda: cl.get_inference_statistics("accumulator", "2"), "StatusCode.INVALID_ARGUMENT"),
            # model control is off by default (test_model_control.py; explicit mode: test_repository.py)
            (lambda: cl.unload_model("no_such_model"), "StatusCode.UNAVAILABLE"),
            (lambda: cl.load_model("no_such_model"), "StatusCode.UNAVAILABLE"),
            (lambda: cl.load_model("bad/name"), "StatusCode.UNAVAILABLE"),
        ):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == code, info.value.message()
            assert info.value.message()
        assert cl.is_model_ready("no_such_model") is False
    finally:
        cl.close()
