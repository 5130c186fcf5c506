"""Bounded decoding on its own (issue 11 item 3): the inflater stops at the limit, shapes and
element counts are checked before anything is allocated, JSON data is checked for type and
range, parameters for range; internal errors get a request id and a rate-limited traceback."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import struct
import tracemalloc
import zlib
from typing import Any

import numpy as np
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api import errors
from seqserve.api.grpc import codec as grpc_codec
from seqserve.api.grpc.codec import Undecodable, safe_deserializer
from seqserve.api.http import kserve_json
from seqserve.api.kserve import MAX_RANK, check_shape, set_parameter, tensor_from_raw
from seqserve.api.limits import (
    GrpcLimits,
    HttpLimits,
    Inflater,
    TooLarge,
    content_encoding,
    declared_size,
    inflate,
)
from seqserve.api.transport.grpc_context import CallAborted, Status
from seqserve.api.transport.grpc_messages import ENCODINGS, inflate_message
from seqserve.engine import Code, InferenceError, InferRequest

MiB = 1 << 20


def _bomb(size: int, wbits: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return c.compress(b" " * size) + c.flush()


# ------------------------------------------------------------------------- inflate


def inflate_sync(body: bytes, encoding: str, limit: int) -> bytes:
    return asyncio.run(inflate(body, encoding, limit))


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 31), ("deflate", 15)])
def test_inflate_round_trip(encoding: str, wbits: int) -> None:
    body = b'{"inputs": []}' * 1000
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    assert inflate_sync(c.compress(body) + c.flush(), encoding, 1 << 20) == body


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 31), ("deflate", 15)])
def test_inflate_stops_just_past_the_limit(encoding: str, wbits: int) -> None:
    """A body that inflates to 64 MiB with a 1 MiB limit: refused after about 1 MiB of output,
    without the 64 MiB ever being allocated."""
    bomb = _bomb(64 * MiB, wbits)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge) as e:
            Inflater(bomb, MiB).run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "decompressed request body exceeds the server's limit of 1048576 bytes" in str(e.value)
    assert peak < 4 * MiB, peak


def test_inflate_steps_are_bounded() -> None:
    inf = Inflater(_bomb(8 * MiB, 31), 16 * MiB)
    assert inf.run(256 << 10) is False  # one bounded step: not done yet
    assert inf.run() is True
    assert len(inf.result()) == 8 * MiB


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "truncated"),
        (gzip.compress(b"{}", mtime=0)[:10], "truncated"),
        (b"this is not gzip", "incorrect header check"),
        (gzip.compress(b"{}", mtime=0) + b"junk", "trailing data"),
        (gzip.compress(b"{}", mtime=0)[:-8] + b"\0\0\0\0" + gzip.compress(b"{}", mtime=0)[-4:], "incorrect data check"),
    ],
)
def test_inflate_refuses_corrupt_bodies(body: bytes, why: str) -> None:
    with pytest.raises(InferenceError) as e:
        inflate_sync(body, "gzip", MiB)
    assert e.value.code == Code.INVALID_ARG
    assert "failed to decompress the request body (gzip)" in e.value.message and why in e.value.message


async def test_gzip_trailer_declaring_too_much_is_refused_before_inflating() -> None:
    honest = _bomb(8 * MiB, 31)
    assert declared_size(honest) == 8 * MiB
    assert declared_size(_bomb(10, 15)) is None  # zlib streams say nothing
    cut = gzip.compress(b"x" * 1000)[:-9] + b"\xff\xff\xff\x7f"  # no trailer: its last bytes say 2 GiB
    assert declared_size(cut) is None  # more than 33 bytes of deflate could hold
    with pytest.raises(TooLarge) as e:
        await inflate(honest, "gzip", MiB)
    assert "of 8388608 bytes" in str(e.value)
    liar = honest[:-4] + struct.pack("<I", 100)
    with pytest.raises(TooLarge):  # a lying trailer is inflated, only up to the limit
        await inflate(liar, "gzip", MiB)


@pytest.mark.parametrize(("encoding", "wbits"), [(b"gzip", 31), (b"deflate", 15)])
async def test_grpc_messages_inflate_with_the_same_inflater(encoding: bytes, wbits: int) -> None:
    """A gRPC message inflates within the message limit (RESOURCE_EXHAUSTED past it, INTERNAL
    when corrupt), on the loop and then off it, as an HTTP body does."""
    message = b"m" * (1 * MiB)
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = c.compress(message) + c.flush()
    assert await inflate_message(packed, ENCODINGS[encoding], 2 * MiB) == message
    with pytest.raises(CallAborted) as e:
        await inflate_message(packed, ENCODINGS[encoding], MiB - 1)
    assert (e.value.status, e.value.details) == (
        Status.RESOURCE_EXHAUSTED,
        f"Received message larger than max (over {MiB - 1} decompressed)",
    )
    with pytest.raises(CallAborted) as e:
        await inflate_message(packed[: len(packed) // 2], ENCODINGS[encoding], 2 * MiB)
    assert (e.value.status, e.value.details) == (Status.INTERNAL, "the message did not decompress: it is truncated")
    with pytest.raises(CallAborted) as e:
        await inflate_message(b"not compressed", ENCODINGS[encoding], 2 * MiB)
    assert e.value.status == Status.INTERNAL and e.value.details.startswith("the message did not decompress: ")


@pytest.mark.parametrize(
    ("header", "want"), [("gzip", "gzip"), (" Deflate ", "deflate"), ("identity", None), ("", None)]
)
def test_content_encoding(header: str, want: str | None) -> None:
    assert content_encoding(header) == want


@pytest.mark.parametrize("header", ["br", "x-gzip", "gzip, br", "compress"])
def test_unknown_content_encoding_keeps_tritons_message(header: str) -> None:
    with pytest.raises(InferenceError) as e:
        content_encoding(header)
    assert e.value.message == "Unsupported compression type"


# -------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("shape", "fragment"),
    [
        ([1] * (MAX_RANK + 1), "65 dimensions; at most 64"),
        ([1, -1], "non-negative integers"),
        ([True, 1], "non-negative integers"),
        ([1.0], "non-negative integers"),
        ("[1]", "non-negative integers"),
        ([2**32, 2**32], "more elements than an int64"),
        ([0, 2**62, 4], "more elements than an int64"),  # empty, but not countable
    ],
)
def test_check_shape_refusals(shape: Any, fragment: str) -> None:
    with pytest.raises(InferenceError) as e:
        check_shape("X", shape)
    assert e.value.code == Code.INVALID_ARG and fragment in e.value.message


def test_check_shape_counts() -> None:
    assert check_shape("X", [1] * MAX_RANK) == 1
    assert check_shape("X", [0, 2**40]) == 0
    assert check_shape("X", [3, 4]) == 12


def test_bytes_amplification_refused_before_allocating() -> None:
    """shape [1, 250000000] with 8 bytes of data: refused from the sizes alone."""
    tracemalloc.start()
    try:
        with pytest.raises(InferenceError) as e:
            tensor_from_raw("IN", "BYTES", [1, 250_000_000], struct.pack("<I", 4) + b"abcd")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "8 bytes cannot hold the 250000000 elements" in e.value.message
    assert peak < MiB


def test_fixed_size_count_checked_against_bytes() -> None:
    with pytest.raises(InferenceError) as e:
        tensor_from_raw("IN", "FP32", [1, 10**12], b"\0\0\0\0")
    assert "expecting 4000000000000 bytes but got 4" in e.value.message


# ---------------------------------------------------------------------------- JSON


def _decode(inputs: list[dict[str, Any]], **doc: Any) -> InferRequest:
    req, _ = kserve_json.decode_request(json.dumps({"inputs": inputs, **doc}).encode(), None, "m", "")
    return req


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("INT8", [300]),
        ("UINT8", [-1]),
        ("UINT64", [2**64]),
        ("INT64", [2**63]),
        ("INT32", [1.5]),
        ("INT32", [True]),
        ("FP32", [True]),
        ("FP32", [None]),
        ("UINT8", ["7"]),
        ("BOOL", [1]),
        ("BYTES", [12]),
        ("FP16", [1e6]),
        ("FP32", [1e39]),
    ],
)
def test_json_data_type_and_range(datatype: str, data: list[Any]) -> None:
    with pytest.raises(InferenceError) as e:
        _decode([{"name": "X", "datatype": datatype, "shape": [1], "data": data}])
    assert e.value.code == Code.INVALID_ARG and "Unable to parse 'data'" in e.value.message


def test_json_data_valid_values() -> None:
    req = _decode(
        [
            {"name": "A", "datatype": "UINT64", "shape": [2], "data": [0, 2**64 - 1]},
            {"name": "B", "datatype": "FP16", "shape": [1, 2], "data": [[65504.0, -1]]},
            {"name": "C", "datatype": "BYTES", "shape": [2], "data": ["a", "\u00e9"]},
            {"name": "D", "datatype": "BOOL", "shape": [1], "data": [False]},
        ]
    )
    assert req.inputs["A"].tolist() == [0, 2**64 - 1]
    assert req.inputs["B"].dtype == np.float16 and req.inputs["B"].shape == (1, 2)
    assert req.inputs["C"].tolist() == [b"a", "\u00e9".encode()]


def test_json_shape_checked_before_data() -> None:
    with pytest.raises(InferenceError) as e:
        _decode([{"name": "IN", "datatype": "BYTES", "shape": [1, 250_000_000], "data": ["ab"]}])
    assert "Shape does not match" in e.value.message


def test_json_nan_infinity_tokens_and_limits() -> None:
    head = b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [NaN, -Infinity]}]}'
    req, _ = kserve_json.decode_request(head, None, "m", "")
    x = req.inputs["X"]
    assert np.isnan(x[0]) and x[1] == -np.inf
    for bad in (
        b'{"inputs": [{"name": "X", "datatype": "FP64", "shape": [2], "data": [NaN, 1e400]}]}',
        b'{"inputs": [{"name": "X", "datatype": "FP64", "shape": [1], "data": [nan]}]}',
        b'{"inputs": [], "id": "NaN", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",  # the stdlib path too
        b"[" * 50_000 + b"]" * 50_000,
    ):
        with pytest.raises(InferenceError) as e:
            kserve_json.decode_request(bad, None, "m", "")
        assert e.value.code == Code.INVALID_ARG and "failed to parse the request JSON" in e.value.message


def test_json_duplicate_input_names_and_id_type() -> None:
    x = {"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}
    with pytest.raises(InferenceError) as e:
        _decode([x, x])
    assert e.value.message == "input 'X' already exists in request"
    with pytest.raises(InferenceError) as e:
        _decode([x], id=17)
    assert e.value.message == "Unable to parse 'id'"


def test_json_messages_clip_client_strings() -> None:
    with pytest.raises(InferenceError) as e:
        _decode([{"name": "X", "datatype": "F" * 100_000, "shape": [1], "data": [1]}])
    assert len(e.value.message) < 400 and "(100000 characters)" in e.value.message


# ---------------------------------------------------------------------- parameters


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("priority", 2**31, True),  # the engine maps it to the default level, as Triton does
        ("priority", 2**64 - 1, True),
        ("priority", 2**64, False),
        ("timeout", 2**63 - 1, True),
        ("timeout", -1, False),
        ("timeout", 2**64, False),
        ("sequence_id", 2**64 - 1, True),
        ("sequence_id", 2**64, False),
        ("custom", 2**64, False),
        ("custom", -(2**63), True),
        ("custom", {"a": 1}, False),
        ("custom", [1], False),
        ("custom", None, False),
        ("custom", "text", True),
    ],
)
def test_parameter_ranges(key: str, value: Any, ok: bool) -> None:
    assert set_parameter(InferRequest("m", {}), key, value) is ok


def test_grpc_custom_parameters_keep_their_values() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["custom"].uint64_param = 2**64 - 1
    msg.parameters["unset"].Clear()
    req, _ = grpc_codec.decode_request(msg)
    assert req.parameters == {"custom": 2**64 - 1, "unset": None}


def test_grpc_duplicate_inputs_and_rank() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    for _ in range(2):
        msg.inputs.add(name="X", datatype="FP32", shape=[1])
        msg.raw_input_contents.append(b"\0\0\0\0")
    with pytest.raises(InferenceError) as e:
        grpc_codec.decode_request(msg)
    assert e.value.message == "input 'X' already exists in request"
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1] * 65)
    msg.raw_input_contents.append(b"\0\0\0\0")
    with pytest.raises(InferenceError) as e:
        grpc_codec.decode_request(msg)
    assert "65 dimensions" in e.value.message


def test_safe_deserializer() -> None:
    parse = safe_deserializer(pb.ModelInferRequest)
    good = pb.ModelInferRequest(model_name="m").SerializeToString()
    assert parse(good).model_name == "m"
    bad = parse(b"\xff" * 16)
    assert type(bad) is Undecodable
    assert bad.message.startswith("failed to parse the ModelInferRequest message")
    assert bad.error().code == Code.INVALID_ARG


def test_large_bytes_and_typed_contents_decode_off_the_loop() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1 << 20])
    msg.raw_input_contents.append(bytes(4 << 20))
    req, _ = grpc_codec.decode_request(msg, inline=True)  # a zero-copy view: decoded inline
    assert req.inputs["X"].shape == (1 << 20,)
    msg.inputs[0].datatype = "BYTES"
    msg.inputs[0].shape[0] = 1
    msg.raw_input_contents[0] = struct.pack("<I", 2 << 20) + bytes(2 << 20)
    with pytest.raises(grpc_codec.DecodeOffLoop):
        grpc_codec.decode_request(msg, inline=True)
    req, _ = grpc_codec.decode_request(msg)  # what the executor runs
    assert len(req.inputs["X"][0]) == 2 << 20
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="X", datatype="FP32", shape=[1 << 18]).contents.fp32_contents.extend([1.0] * (1 << 18))
    with pytest.raises(grpc_codec.DecodeOffLoop):
        grpc_codec.decode_request(typed, inline=True)


# ------------------------------------------------------------------------- settings


def test_limits_settings() -> None:
    assert HttpLimits(header_timeout_s=10, keepalive_s=30).idle_s == 10
    assert HttpLimits(header_timeout_s=10, keepalive_s=2).idle_s == 2
    assert HttpLimits(header_timeout_s=10, keepalive_s=0).idle_s == 10
    opts = dict(GrpcLimits(max_receive_message_bytes=1000, max_connection_idle_s=0).options())
    assert opts["grpc.max_receive_message_length"] == 1000
    assert opts["grpc.max_send_message_length"] == 64 * MiB
    assert "grpc.max_connection_idle_ms" not in opts
    assert dict(GrpcLimits().options())["grpc.max_connection_idle_ms"] == 300_000


# ------------------------------------------------------------------- internal errors


def test_internal_errors_have_a_request_id_and_rate_limited_tracebacks(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "_sites", {})
    caplog.set_level(logging.ERROR, logger="seqserve.api")
    exc = RuntimeError("boom")
    first = errors.internal_error("site A", exc)
    assert first.code == Code.INTERNAL
    assert first.message.startswith("internal error (request id ") and "boom" not in first.message
    msgs = [errors.internal_error("site A", exc).message for _ in range(200)]
    assert len(set(msgs)) == 200  # every failure its own id
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1  # one full traceback per site and interval
    lines = [r for r in caplog.records if not r.exc_info]
    assert len(lines) == errors.LINES_PER_INTERVAL  # then only counted
    errors.internal_error("site B", exc)  # another site has its own budget
    assert len([r for r in caplog.records if r.exc_info]) == 2
    rid = msgs[0].split()[-1].rstrip(")")
    assert any(rid in r.getMessage() for r in lines)  # the id a client reports is in the log


# ------------------------------------------------------------------------ HTTP 500s


class _BrokenServer:
    """Every call fails as a bug would."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"bug in {name}")

        return fail


async def _asgi(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-length", str(len(body)).encode())], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1), "root_path": ""}  # fmt: skip
    await app(scope, receive, send)  # never raises: the error is answered
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body_out)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v2/models/m/infer", b'{"inputs": []}'),  # infer, answered before routing
        ("GET", "/v2/models/m", b""),  # a route of the router
    ],
)
async def test_an_unexpected_exception_is_a_500_with_a_request_id(
    method: str, path: str, body: bytes, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seqserve.api.http.routes import HttpFrontend

    monkeypatch.setattr(errors, "_sites", {})
    caplog.set_level(logging.ERROR)
    app = HttpFrontend(_BrokenServer()).asgi()  # type: ignore[arg-type]
    status, doc = await _asgi(app, method, path, body)
    assert status == 500
    assert set(doc) == {"error"} and doc["error"].startswith("internal error (request id ")
    rid = doc["error"].split()[-1].rstrip(")")
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info  # logged once, with its traceback
