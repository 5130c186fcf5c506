"""The api codecs on their own: KServe JSON / binary (HTTP) and protobuf (gRPC) into one engine
InferRequest and back, the parameters both read the same way, the stream session's reply order,
and the engine's ordered release."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.grpc import codec as grpc_codec
from seqserve.api.grpc.stream import StreamSession
from seqserve.api.http import kserve_json
from seqserve.api.kserve import NUMPY_DTYPES, raw_bytes
from seqserve.engine import Code, InferenceError, InferRequest, InferResult, OrderedRelease, tensors
from tests.support import grpc_oracle

# ----------------------------------------------------------------------------- HTTP


def _http_body(doc: dict[str, Any], *chunks: bytes) -> tuple[bytes, int | None]:
    head = json.dumps(doc).encode()  # the stdlib: ids past 64 bits too
    return head + b"".join(chunks), (len(head) if chunks else None)


def test_http_decode_builds_the_engine_request() -> None:
    x = np.arange(3, dtype=np.float32)
    body, ihcl = _http_body(
        {
            "id": "r1",
            "inputs": [
                {"name": "A", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}},
                {"name": "B", "datatype": "BYTES", "shape": [2], "data": ["ab", "xyz"]},
            ],
            "outputs": [{"name": "O1", "parameters": {"binary_data": False}}, {"name": "O2"}],
            "parameters": {
                "sequence_id": "s-1",
                "sequence_start": True,
                "sequence_end": False,
                "priority": 2,
                "timeout": 1000,
                "binary_data_output": True,
                "headers": {"x": "y"},
                "custom": 1.5,
            },
        },
        x.tobytes(),
    )
    req, options = kserve_json.decode_request(body, ihcl, "m", "1")
    assert isinstance(req, InferRequest)
    assert (req.model, req.version, req.id) == ("m", "1", "r1")
    assert (req.sequence_id, req.sequence_start, req.sequence_end) == ("s-1", True, False)
    assert (req.priority, req.timeout_us) == (2, 1000)
    assert req.parameters == {"custom": 1.5}  # transport keys stay out of the engine
    assert req.outputs == ("O1", "O2")
    np.testing.assert_array_equal(req.inputs["A"], x)
    assert list(req.inputs["B"]) == [b"ab", b"xyz"]
    assert options == kserve_json.HttpReplyOptions(True, {"O1": False, "O2": None})


def test_http_requests_without_outputs_share_their_options() -> None:
    doc = {"inputs": [], "parameters": {"binary_data_output": True}}
    _, a = kserve_json.decode_request(*_http_body(doc), "m", "")
    _, b = kserve_json.decode_request(*_http_body({**doc, "outputs": []}), "m", "")
    assert a is b and a.binary_default and a.binary is None
    _, c = kserve_json.decode_request(*_http_body({"inputs": []}), "m", "")
    assert not c.binary_default


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sequence_id", -1),
        ("sequence_id", 2**64),
        ("sequence_id", True),
        ("sequence_id", 1.0),
        ("sequence_start", 1),
        ("sequence_end", "true"),
        ("priority", -1),
        ("priority", True),
        ("timeout", 1.5),
        ("binary_data_output", 1),
    ],
)
def test_http_parameter_errors(key: str, value: Any) -> None:
    with pytest.raises(InferenceError) as e:
        kserve_json.decode_request(*_http_body({"inputs": [], "parameters": {key: value}}), "m", "")
    assert (e.value.code, e.value.message) == (Code.INVALID_ARG, f"Unable to parse '{key}'")


def test_http_encode_mixes_binary_and_json() -> None:
    result = InferResult(
        "m",
        "1",
        "r1",
        {"O1": np.array([1.0, 2.0], dtype=np.float32), "O2": np.array([b"ab"], dtype=object)},
        {"sequence_id": 7},
    )
    body, json_len = kserve_json.encode_response(result, kserve_json.HttpReplyOptions(True, {"O1": False}))
    assert json_len is not None
    doc = orjson.loads(body[:json_len])
    assert doc["id"] == "r1" and doc["parameters"] == {"sequence_id": 7}
    o1, o2 = doc["outputs"]
    assert o1 == {"name": "O1", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    assert o2["datatype"] == "BYTES" and o2["parameters"] == {"binary_data_size": 6}
    assert body[json_len:] == b"\x02\x00\x00\x00ab"
    body, json_len = kserve_json.encode_response(result, kserve_json.HttpReplyOptions(False))
    assert json_len is None and orjson.loads(body)["outputs"][1]["data"] == ["ab"]


# ----------------------------------------------------------------------------- gRPC


def _grpc_request(**params: tuple[str, Any]) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="1", id="r1")
    for key, (kind, value) in params.items():
        setattr(msg.parameters[key], kind, value)
    return msg


def test_grpc_decode_builds_the_engine_request() -> None:
    msg = _grpc_request(
        sequence_id=("int64_param", -1),
        sequence_start=("bool_param", True),
        sequence_end=("bool_param", True),
        priority=("uint64_param", 3),
        timeout=("int64_param", 50),
        custom=("double_param", 0.5),
    )
    msg.inputs.add(name="A", datatype="INT32", shape=[2])
    msg.raw_input_contents.append(np.array([4, 5], dtype=np.int32).tobytes())
    msg.outputs.add(name="O")
    msg.outputs.add(name="O")
    req, options = grpc_codec.decode_request(msg)
    assert (req.model, req.version, req.id) == ("m", "1", "r1")
    assert req.sequence_id == 2**64 - 1  # the int64 carries a uint64's bits
    assert (req.sequence_start, req.sequence_end, req.priority, req.timeout_us) == (True, True, 3, 50)
    assert req.parameters == {"custom": 0.5}
    assert req.outputs == ("O",)
    np.testing.assert_array_equal(req.inputs["A"], [4, 5])
    assert options.empty_final is False


def test_grpc_empty_final_is_an_option_not_a_parameter() -> None:
    req, options = grpc_codec.decode_request(_grpc_request(triton_enable_empty_final_response=("bool_param", True)))
    assert options.empty_final is True and req.parameters == {}
    _, plain = grpc_codec.decode_request(_grpc_request())
    assert plain.empty_final is False


@pytest.mark.parametrize(
    ("key", "kind", "value", "expected"),
    [
        ("sequence_id", "bool_param", True, "int64_param or string_param"),
        ("sequence_id", "double_param", 1.0, "int64_param or string_param"),
        ("sequence_start", "int64_param", 1, "bool_param"),
        ("sequence_end", "string_param", "true", "bool_param"),
        ("priority", "int64_param", -1, "uint64_param"),
        ("priority", "string_param", "1", "uint64_param"),
        ("timeout", "bool_param", False, "int64_param"),
    ],
)
def test_grpc_parameter_errors(key: str, kind: str, value: Any, expected: str) -> None:
    with pytest.raises(InferenceError) as e:
        grpc_codec.decode_request(_grpc_request(**{key: (kind, value)}))
    assert e.value.code == Code.INVALID_ARG
    assert e.value.message == f"invalid value type for '{key}' parameter, expected {expected}."


def test_grpc_encode_puts_every_output_in_raw_contents() -> None:
    outputs = {"O1": np.array([[1, 2]], dtype=np.int64), "O2": np.array([b"x", b""], dtype=object)}
    resp = grpc_oracle.encode_response(InferResult("m", "1", "r1", outputs, {"sequence_id": 2**64 - 1}))
    described = [(o.name, o.datatype, list(o.shape)) for o in resp.outputs]
    assert described == [("O1", "INT64", [1, 2]), ("O2", "BYTES", [2])]
    assert list(resp.raw_output_contents) == [raw_bytes(outputs["O1"]), raw_bytes(outputs["O2"])]
    assert resp.parameters["sequence_id"].int64_param == -1


def test_datatype_tables_come_from_the_engine() -> None:
    assert set(NUMPY_DTYPES) == set(tensors.BY_WIRE) - {"BF16"}
    assert NUMPY_DTYPES["BYTES"] == np.dtype(object)
    assert set(grpc_codec._CONTENTS_FIELD) <= set(tensors.BY_WIRE)


# --------------------------------------------------------------------------- ordering


def test_ordered_release_waits_for_the_head() -> None:
    released: list[str] = []
    order: OrderedRelease[Any] = OrderedRelease(lambda s: released.append(s.outcome))
    slots = [SimpleNamespace(outcome=None) for _ in range(3)]
    for s in slots:
        order.add(s)
    slots[2].outcome = "c"
    slots[1].outcome = "b"
    order.release_ready()
    assert released == [] and len(order) == 3
    slots[0].outcome = "a"
    order.release_ready()
    assert released == ["a", "b", "c"] and len(order) == 0


# ----------------------------------------------------------------------------- stream


class _FakeServer:
    """What StreamSession needs of a Server: model lookup and enqueue_streaming."""

    def __init__(self) -> None:
        self.submitted: dict[str, Callable[[Any, bool], None]] = {}
        self.cancelled: list[str] = []

    def model(self, name: str, version: str) -> Any:
        if name == "missing":
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return SimpleNamespace(decoupled=name == "decoupled")

    def enqueue_streaming(
        self, request: InferRequest, on_response: Callable[[Any, bool], None], *, model: Any = None
    ) -> Callable[[], None]:
        self.submitted[request.id] = on_response
        return lambda: self.cancelled.append(request.id)


def _result(rid: str) -> InferResult:
    return InferResult("m", "1", rid, {})


async def _drain(session: StreamSession, n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        batch = await asyncio.wait_for(session.next_replies(), 1)
        assert batch is not None
        out += batch
    return out


async def test_stream_replies_in_request_order_except_decoupled() -> None:
    server = _FakeServer()
    session = StreamSession(server, grpc_errors=False)  # type: ignore[arg-type]
    session.submit(pb.ModelInferRequest(model_name="m", id="1"))
    session.submit(pb.ModelInferRequest(model_name="decoupled", id="2"))
    session.submit(pb.ModelInferRequest(model_name="missing", id="3"))
    session.submit(pb.ModelInferRequest(model_name="m", id="4"))
    server.submitted["4"](_result("4"), True)
    server.submitted["2"](_result("2"), False)  # decoupled: written as it comes
    server.submitted["1"](_result("1"), True)
    replies = [pb.ModelStreamInferResponse.FromString(r) for r in await _drain(session, 4)]
    assert [r.infer_response.id for r in replies] == ["2", "1", "3", "4"]
    assert replies[2].error_message == "Request for unknown model: 'missing' is not found"
    assert [r.infer_response.parameters["triton_final_response"].bool_param for r in (replies[0], replies[1])] == [
        False,
        True,
    ]
    session.close()  # the decoupled request is still open
    assert server.cancelled == ["2"]


def _reader(items: list[object]) -> Callable[[], Awaitable[object]]:
    async def read() -> object:
        return items.pop(0)

    return read


async def test_stream_read_ends_the_replies_once_every_request_is_answered() -> None:
    """Requests read by calling a read function (serialized, as the servers hand them, or as
    messages) until it returns None: the replies end only after the input has ended and every
    request read has its last reply, and a bare final flag writes nothing."""
    serialized = [pb.ModelInferRequest(model_name="m", id=rid).SerializeToString() for rid in ("1", "2")]
    messages = [pb.ModelInferRequest(model_name="m", id="3")]

    for requests in (serialized, messages):
        read = _reader([*requests, None])

        server = _FakeServer()
        session = StreamSession(server, grpc_errors=False)  # type: ignore[arg-type]
        await session.read_calls(read)
        batches = session.next_replies()
        waiting = asyncio.ensure_future(batches)
        await asyncio.sleep(0)
        assert not waiting.done()  # the input ended, but requests are unanswered
        ids = sorted(server.submitted)
        for rid in ids[:-1]:
            server.submitted[rid](_result(rid), True)
        server.submitted[ids[-1]](None, True)  # a final flag alone: no reply to write
        got = await asyncio.wait_for(waiting, 1)
        assert [pb.ModelStreamInferResponse.FromString(r).infer_response.id for r in got or ()] == ids[:-1]
        assert await asyncio.wait_for(session.next_replies(), 1) is None


async def test_stream_grpc_errors_yields_the_error() -> None:
    server = _FakeServer()
    session = StreamSession(server, grpc_errors=True)  # type: ignore[arg-type]
    session.submit(pb.ModelInferRequest(model_name="missing", id="1"))
    (reply,) = await _drain(session, 1)
    assert isinstance(reply, InferenceError) and reply.code == Code.NOT_FOUND


@pytest.mark.parametrize("size", [0, 1, 150, 511, 512, 513, 5000, 40_000, 300_000])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compress_round_trips_at_any_size(size: int, encoding: str) -> None:
    """Replies are compressed with a window sized to them: any inflater reads them, and they
    are about as small as with zlib's defaults."""
    rng = np.random.default_rng(size)
    body = (b'{"model_name":"m","outputs":[]}' + rng.integers(0, 16, size, dtype=np.uint8).tobytes())[:size]
    packed = kserve_json.compress(body, encoding)
    if encoding == "gzip":
        assert gzip.decompress(packed) == body
        reference = gzip.compress(body, compresslevel=6)
    else:
        assert zlib.decompress(packed) == body
        assert zlib.decompressobj().decompress(packed) == body
        reference = zlib.compress(body)
    assert len(packed) <= len(reference) * 1.02 + 8
