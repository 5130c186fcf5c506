"""HTTP inference specifics: binary / JSON outputs, output selection, request ids, compression
both ways, the aio client, and every datatype through an identity model (protocol.md B.2, B.3)."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.support.clients import Client, add_sub_inputs, binary_body, expect_error, http_request, new_int_id
from tests.support.models import IDENTITY_DTYPES
from tests.support.process import ServerProcess


@pytest.fixture
def http(server: ServerProcess) -> Any:
    cl = httpclient.InferenceServerClient(server.http_url)
    yield cl
    cl.close()


def _add_sub_inputs(binary: bool = True) -> list[httpclient.InferInput]:
    a = np.array([[1, 2, 3, 4]], dtype=np.float32)
    b = np.array([[10, 20, 30, 40]], dtype=np.float32)
    ins = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        i = httpclient.InferInput(name, [1, 4], "FP32")
        i.set_data_from_numpy(value, binary_data=binary)
        ins.append(i)
    return ins


SUM = [[11.0, 22.0, 33.0, 44.0]]
DIFF = [[-9.0, -18.0, -27.0, -36.0]]


def _outputs_by_name(result: Any) -> dict[str, dict[str, Any]]:
    return {o["name"]: o for o in result.get_response()["outputs"]}


@pytest.mark.parametrize("binary_in", [True, False])
def test_binary_and_json_outputs(http: Any, binary_in: bool) -> None:
    outs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]  # fmt: skip
    result = http.infer("add_sub", _add_sub_inputs(binary_in), outputs=outs)
    by_name = _outputs_by_name(result)
    assert by_name["OUTPUT0"]["parameters"]["binary_data_size"] == 16 and "data" not in by_name["OUTPUT0"]
    assert by_name["OUTPUT1"]["data"] == [-9.0, -18.0, -27.0, -36.0]
    assert "binary_data_size" not in by_name["OUTPUT1"].get("parameters", {})
    assert result.as_numpy("OUTPUT0").tolist() == SUM
    assert result.as_numpy("OUTPUT1").tolist() == DIFF
    # all JSON: no binary tail, so no Inference-Header-Content-Length either
    outs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("OUTPUT0", "OUTPUT1")]
    result = http.infer("add_sub", _add_sub_inputs(binary_in), outputs=outs)
    assert {n: o["data"] for n, o in _outputs_by_name(result).items()} == {"OUTPUT0": SUM[0], "OUTPUT1": DIFF[0]}


@pytest.mark.parametrize("outputs", [None, [], ["OUTPUT1"], ["OUTPUT1", "OUTPUT0"]])
def test_output_selection(http: Any, outputs: list[str] | None) -> None:
    req = None if outputs is None else [httpclient.InferRequestedOutput(n) for n in outputs]
    result = http.infer("add_sub", _add_sub_inputs(), outputs=req)
    names = [o["name"] for o in result.get_response()["outputs"]]
    if not outputs:  # None and [] both mean every output, binary by default
        assert sorted(names) == ["OUTPUT0", "OUTPUT1"]
        assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    else:
        assert sorted(names) == sorted(outputs)
    if "OUTPUT0" in names:
        assert result.as_numpy("OUTPUT0").tolist() == SUM
    assert result.as_numpy("OUTPUT1").tolist() == DIFF
    if outputs == ["OUTPUT1"]:
        assert result.as_numpy("OUTPUT0") is None


def test_request_id_echo(http: Any, server: ServerProcess) -> None:
    result = http.infer("add_sub", _add_sub_inputs(), request_id="my-request-17")
    resp = result.get_response()
    assert resp["id"] == "my-request-17"
    assert resp["model_name"] == "add_sub" and resp["model_version"] == "1"
    assert "id" not in http.infer("add_sub", _add_sub_inputs()).get_response()
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        r = g.infer("add_sub", add_sub_inputs(grpcclient), request_id="grpc-id-3").get_response()
        assert (r.id, r.model_name, r.model_version) == ("grpc-id-3", "add_sub", "1")
    finally:
        g.close()


@pytest.mark.parametrize("request_alg", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_alg", [None, "gzip", "deflate"])
def test_compression_matrix(http: Any, request_alg: str | None, response_alg: str | None) -> None:
    sid = new_int_id()
    for k, value in enumerate((1.5, 2.5)):
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        result = http.infer(
            "accumulator", [inp], sequence_id=sid, sequence_start=k == 0, sequence_end=k == 1,
            request_compression_algorithm=request_alg, response_compression_algorithm=response_alg,
        )  # fmt: skip
        assert float(result.as_numpy("OUTPUT")[0, 0]) == [1.5, 4.0][k]
    result = http.infer(
        "add_sub", _add_sub_inputs(), request_compression_algorithm=request_alg,
        response_compression_algorithm=response_alg,
    )  # fmt: skip
    assert result.as_numpy("OUTPUT0").tolist() == SUM


def test_compression_on_the_wire(server: ServerProcess) -> None:
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
            {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [10, 20, 30, 40]},
        ],
        "parameters": {"binary_data_output": True},
    }
    body, hdr = binary_body(doc, np.array([1, 2, 3, 4], dtype=np.float32).tobytes())
    for enc, pack in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        headers = {**hdr, "Content-Encoding": enc, "Accept-Encoding": enc}
        r = http_request(server, "POST", "/v2/models/add_sub/infer", pack(body), headers)
        assert r.status == 200, r.body
        assert r.headers["content-encoding"] == enc
        plain = gzip.decompress(r.body) if enc == "gzip" else zlib.decompress(r.body)
        ihcl = int(r.headers["inference-header-content-length"])  # of the uncompressed JSON
        head = json.loads(plain[:ihcl])
        assert [o["parameters"]["binary_data_size"] for o in head["outputs"]] == [16, 16]
        assert np.frombuffer(plain[ihcl : ihcl + 16], dtype=np.float32).tolist() == SUM[0]
    # the aio client's Accept-Encoding: weights and `br` are honoured, br never chosen
    for accept, want in (("gzip, deflate, br", "gzip"), ("br", None), ("deflate;q=1, gzip;q=0.5", "deflate"),
                         ("identity", None), ("gzip;q=0", None)):  # fmt: skip
        r = http_request(server, "POST", "/v2/models/add_sub/infer", body, {**hdr, "Accept-Encoding": accept})
        assert r.status == 200 and r.headers.get("content-encoding") == want, accept
    # non-infer responses are never compressed
    for method, path in (("GET", "/v2"), ("GET", "/v2/models/add_sub"), ("GET", "/v2/models/add_sub/config"),
                         ("GET", "/v2/models/stats"), ("POST", "/v2/repository/index")):  # fmt: skip
        r = http_request(server, method, path, b"" if method == "POST" else None, {"Accept-Encoding": "gzip"})
        assert r.status == 200 and "content-encoding" not in r.headers, path
        json.loads(r.body)
    # an unknown request encoding is a client fault: 415, with Triton's message
    r = http_request(server, "POST", "/v2/models/add_sub/infer", body, {**hdr, "Content-Encoding": "br"})
    assert r.status == 415 and r.error() == "Unsupported compression type"
    assert r.headers.get("accept-encoding") == "gzip, deflate"
    r = http_request(server, "POST", "/v2/models/add_sub/infer", b"not gzip", {**hdr, "Content-Encoding": "gzip"})
    assert r.status == 400 and "decompress" in r.error()


async def test_aio_client(server: ServerProcess) -> None:
    """tritonclient.http.aio always sends Accept-Encoding: gzip, deflate, br: infer replies come
    back gzip'd (decoded by the client), every other call must stay plain JSON."""
    cl = httpaio.InferenceServerClient(server.http_url)
    try:
        assert (await cl.get_server_metadata())["name"] == "seqserve"
        assert (await cl.get_model_metadata("add_sub"))["name"] == "add_sub"
        assert (await cl.get_model_config("add_sub"))["max_batch_size"] == 8
        assert (await cl.get_inference_statistics("add_sub"))["model_stats"][0]["name"] == "add_sub"
        assert {e["name"] for e in await cl.get_model_repository_index()} >= {"add_sub"}
        for alg in (None, "gzip", "deflate"):
            result = await cl.infer("add_sub", _add_sub_inputs(), request_compression_algorithm=alg,
                                    request_id=f"aio-{alg}")  # fmt: skip
            assert result.as_numpy("OUTPUT0").tolist() == SUM
            assert result.get_response()["id"] == f"aio-{alg}"
        outs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
        result = await cl.infer("add_sub", _add_sub_inputs(binary=False), outputs=outs)
        assert _outputs_by_name(result)["OUTPUT1"]["data"] == DIFF[0]
    finally:
        await cl.close()


def test_keep_alive_reuse(http: Any) -> None:
    """The sync client keeps one connection: many requests, good and bad, in a row."""
    for k in range(30):
        if k % 7 == 3:
            with pytest.raises(InferenceServerException, match="no_such_model"):
                http.infer("no_such_model", _add_sub_inputs())
            continue
        assert http.infer("add_sub", _add_sub_inputs()).as_numpy("OUTPUT1").tolist() == DIFF


# ---------------------------------------------------------------------------- datatypes


def _sample(dtype: str, n: int = 3) -> np.ndarray:
    if dtype == "BOOL":
        return np.array([True, False, True][:n], dtype=bool)
    if dtype == "BYTES":
        return np.array([b"ab", b"", b"\xff\x00xyz"][:n], dtype=object)  # empty and non-UTF-8
    np_dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dtype)
    if np_dtype is not None:
        return np.array([1.5, -2.25, 1e4][:n], dtype=np_dtype)
    info = np.iinfo(np.dtype(dtype.lower()))
    return np.array([info.min, 1, info.max][:n], dtype=np.dtype(dtype.lower()))


def _identity_inputs(cl: Client, n: int = 3, binary: bool = True) -> tuple[list[Any], dict[str, np.ndarray]]:
    values = {t: _sample(t, n) for t in IDENTITY_DTYPES}
    if not binary:  # JSON BYTES must be UTF-8 text
        values["BYTES"] = np.array([b"ab", b"", "h\u00e9".encode()][:n], dtype=object)
    return [cl.input(f"IN_{t}", v, t, binary=binary) for t, v in values.items()], values


@pytest.mark.parametrize("flavour", ["http", "http_aio", "grpc", "grpc_aio"])
@pytest.mark.parametrize("n", [3, 0])
async def test_all_datatypes_binary(identity_server: ServerProcess, flavour: str, n: int) -> None:
    cl = Client(flavour, identity_server)
    try:
        inputs, values = _identity_inputs(cl, n)
        result = await cl("infer", "identity", inputs)
        for t, v in values.items():
            got = result.as_numpy(f"OUT_{t}")
            assert got.shape == (n,), t
            assert got.tolist() == v.tolist(), t
            if t != "BYTES":
                assert got.dtype == v.dtype, t
        meta = result.get_response()
        dtypes = {o["name"]: o["datatype"] for o in meta["outputs"]} if cl.is_http else {
            o.name: o.datatype for o in meta.outputs}  # fmt: skip
        assert dtypes == {f"OUT_{t}": t for t in IDENTITY_DTYPES}
    finally:
        await cl.close()


def test_all_datatypes_json(identity_server: ServerProcess) -> None:
    cl = Client("http", identity_server)
    try:
        inputs, values = _identity_inputs(cl, binary=False)
        outs = [cl.output(f"OUT_{t}", binary=False) for t in IDENTITY_DTYPES]
        result = cl.raw.infer("identity", inputs, outputs=outs)
        by_name = _outputs_by_name(result)
        for t, v in values.items():
            out = by_name[f"OUT_{t}"]
            assert "data" in out and out["datatype"] == t, t
            if t == "BYTES":
                assert out["data"] == ["ab", "", "h\u00e9"]
            else:
                assert result.as_numpy(f"OUT_{t}").tolist() == v.tolist(), t
        # UINT64 above 2**63 survives JSON both ways
        assert by_name["OUT_UINT64"]["data"][2] == 2**64 - 1
    finally:
        cl.raw.close()


def test_bytes_json_output_not_utf8(identity_server: ServerProcess) -> None:
    cl = Client("http", identity_server)
    try:
        inputs, _ = _identity_inputs(cl)  # BYTES holds b"\xff\x00xyz"
        outs = [httpclient.InferRequestedOutput("OUT_BYTES", binary_data=False)]
        with pytest.raises(Exception, match="not valid UTF-8") as info:
            cl.raw.infer("identity", inputs, outputs=outs)
        assert info.value.status() == "400"  # type: ignore[attr-defined]
    finally:
        cl.raw.close()


async def test_bf16_is_unsupported(identity_server: ServerProcess) -> None:
    for flavour in ("http", "grpc"):
        cl = Client(flavour, identity_server)
        try:
            inputs, _ = _identity_inputs(cl)
            bf16 = cl.input("IN_BF16", np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16), "BF16")
            await expect_error(cl("infer", "identity", [*inputs, bf16]), cl.code("UNSUPPORTED"), "BF16")
        finally:
            await cl.close()


@pytest.mark.parametrize("flavour", ["http", "grpc"])
async def test_large_tensor(identity_server: ServerProcess, flavour: str) -> None:
    """Above grpcio's 4 MiB default message limit (and large for HTTP too)."""
    cl = Client(flavour, identity_server)
    try:
        inputs, _ = _identity_inputs(cl)
        big = np.arange(3 * 1024 * 1024, dtype=np.float32)  # 12 MiB
        inputs = [i for i in inputs if i.name() != "IN_FP32"] + [cl.input("IN_FP32", big)]
        result = await cl("infer", "identity", inputs, outputs=[cl.output("OUT_FP32")])
        assert np.array_equal(result.as_numpy("OUT_FP32"), big)
    finally:
        await cl.close()
