"""A corpus of hostile requests (issue 11 item 7) against a live server, over HTTP JSON, HTTP
binary, raw HTTP framing, gRPC unary and the ModelStreamInfer stream, while live sequences step
beside every case and must keep correct sums (tests/support/hostile.py).

Every case checks (tests/support/wire.py): the expected status, a `{"error": "..."}` body (HTTP)
or an allowed gRPC status with a message, an answer within a bound (socket timeouts everywhere:
a hang fails the case instead of the run), and afterwards that the server is still up and the
live sequences stepped on. A case that kills the server fails, and the next case gets a fresh
one.

Status rules where the answer is a judgment call (protocol.md 4.1, Triton's behaviour):
* malformed request content (JSON, shapes, datatypes, parameters, binary sizes, BYTES data,
  compressed bodies) -> 400 / INVALID_ARGUMENT, as Triton answers INVALID_ARG;
* an unknown model or version, an unroutable path -> 404 / NOT_FOUND (a model name that cannot
  be a model, e.g. one with a NUL or a "/", may get 400 / INVALID_ARGUMENT instead);
* a wrong method -> 405; a name too long to route -> 404, or 414 / 431 from a server that caps
  request lines and headers;
* a body over the server's limit, before or after decompression -> 413; gRPC: a message over the
  receive limit -> RESOURCE_EXHAUSTED;
* an unsupported Content-Encoding -> 415 (issue 11; Triton says 501);
* where Triton answers UNSUPPORTED (BF16 tensors, string ids over 128 characters) 501 /
  UNIMPLEMENTED is accepted beside 400 / INVALID_ARGUMENT;
* out-of-range values: integers outside the datatype (and FP16 values outside FP16, which Triton
  refuses over JSON anyway) -> 400; FP32 values beyond FP32 but within a double follow Triton's
  double-to-float cast (200 with inf, or 400); a number beyond a double (1e400) -> 400
  (rapidjson's "number too big");
* where a request is odd but valid (priority 2^31 on a sequence model, where Triton ignores it;
  a huge timeout; the int64 -2^63 sequence id that is the uint64 2^63) the case accepts a
  correct 200 / OK beside a refusal, and checks the result.
"""

from __future__ import annotations

import gzip
import json
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tests.support.clients import new_int_id
from tests.support.hostile import Harness
from tests.support.models import IDENTITY_DTYPES
from tests.support.wire import (
    ALLOWED_GRPC,
    ANSWER_BOUND_S,
    BOMB_PREFIX,
    FP32_ONE,
    HttpReply,
    RawStream,
    acc_input,
    acc_request,
    assert_clean_grpc,
    assert_clean_http,
    bytes_elements,
    error_message,
    grpc_unary,
    http_bytes,
    infer_path,
    output_values,
    pb_field,
    send_raw,
    seq_params,
    stream_reply_value,
    varint,
    zlib_bomb,
)

Code = grpc.StatusCode
IHCL = "Inference-Header-Content-Length"

E400 = frozenset({400})
E404 = frozenset({404})
E405 = frozenset({405})
E413 = frozenset({413})
E415 = frozenset({415})
E400_404 = frozenset({400, 404})
E400_413 = frozenset({400, 413})
E400_501 = frozenset({400, 501})  # Triton answers UNSUPPORTED (501) here
TOO_LONG = frozenset({404, 414, 431})
OK_OR_400 = frozenset({200, 400})

# ------------------------------------------------------------------------- builders


def jbytes(doc: Any, **raw: str) -> bytes:
    """JSON (NaN/Infinity tokens allowed); each `"__KEY__"` string is replaced by raw[KEY]
    verbatim, for tokens json.dumps cannot write (1e400, nan, -NaN)."""
    out = json.dumps(doc, allow_nan=True)
    for key, text in raw.items():
        out = out.replace(json.dumps(f"__{key}__"), text)
    return out.encode()


def acc_doc(inputs: list[Any] | None = None, params: Any = None, **top: Any) -> dict[str, Any]:
    """An accumulator request (a fresh one-step sequence unless `params` says otherwise)."""
    doc: dict[str, Any] = {"inputs": inputs if inputs is not None else [acc_input()]}
    doc["parameters"] = params if params is not None else seq_params(new_int_id())
    doc.update(top)
    return doc


def post(body: bytes, headers: Any = (), model: str = "accumulator") -> bytes:
    return http_bytes("POST", infer_path(model), body, headers)


def post_json(doc: Any, model: str = "accumulator", headers: Any = (), **raw: str) -> bytes:
    return post(jbytes(doc, **raw), headers, model)


def post_binary(doc: Any, tail: bytes, model: str = "accumulator", ihcl: str | None = None) -> bytes:
    head = jbytes(doc)
    return post(head + tail, [(IHCL, ihcl if ihcl is not None else str(len(head)))], model)


def bin_input(name: str = "INPUT", datatype: str = "FP32", shape: Any = (1, 1), size: Any = 4) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(shape), "parameters": {"binary_data_size": size}}


def nested(depth: int, leaf: str = "1.0") -> str:
    return "[" * depth + leaf + "]" * depth


# identity: every datatype, [-1], max_batch_size 0, all inputs required. A valid request sends
# each one; FP16 goes binary (Triton refuses FP16 over JSON), everything else as JSON.
IDENT_VALUES: dict[str, list[Any]] = {
    "BOOL": [True],
    "FP32": [1.0],
    "FP64": [1.0],
    "BYTES": ["a"],
    **{t: [1] for t in IDENTITY_DTYPES if t.startswith(("INT", "UINT"))},
}


def post_identity(over: str | None = None, data: Any = None, *, datatype: str | None = None, **raw: str) -> bytes:
    """A valid identity request with input IN_<over> replaced by JSON `data` (and datatype)."""
    inputs = []
    tail = b""
    for t in IDENTITY_DTYPES:
        if t == over:
            inputs.append({"name": f"IN_{t}", "datatype": datatype or t, "shape": [1], "data": data})
        elif t == "FP16":
            inputs.append(bin_input(f"IN_{t}", t, [1], 2))
            tail = np.float16(1).tobytes()
        else:
            inputs.append({"name": f"IN_{t}", "datatype": t, "shape": [1], "data": IDENT_VALUES[t]})
    head = jbytes({"inputs": inputs}, **raw)
    headers = [(IHCL, str(len(head)))] if tail else []
    return post(head + tail, headers, "identity")


def ok_sum(value: float) -> Callable[[HttpReply], None]:
    """A 200 must carry the one-step sum."""

    def check(reply: HttpReply) -> None:
        got = output_values(reply)
        assert got == [value] or (np.isnan(value) and np.isnan(got[0])), f"200 with OUTPUT {got}, expected [{value}]"

    return check


# ---------------------------------------------------------------------- HTTP cases


@dataclass(frozen=True)
class HttpCase:
    id: str
    data: bytes  # the whole request, as sent
    expect: frozenset[int] = E400
    ok: Callable[[HttpReply], None] | None = None  # checks a 200, where 200 is expected
    bound: float = ANSWER_BOUND_S
    method: str = "POST"
    #: malformed framing or oversized headers/URL: the HTTP server's own parser answers before the
    #: app runs (granian gives no hook to write a body there), so the right 4xx status with an
    #: empty body is accepted; anything the app answers must still carry {"error": ...}
    framing: bool = False


def _h(cid: str, data: bytes, expect: frozenset[int] = E400, **kw: Any) -> HttpCase:
    return HttpCase(cid, data, expect, **kw)


_valid_json = jbytes(acc_doc())
BINARY_OUT = [{"name": "OUTPUT", "parameters": {"binary_data": True}}]
_valid_gz = gzip.compress(_valid_json)
_sid = new_int_id  # a fresh uint64 id per case

HTTP_JSON_CASES = [
    # --- shapes
    _h("shape-65-dims", post_json(acc_doc([acc_input(shape=[1] * 65)]))),
    _h("shape-1000-dims", post_json(acc_doc([acc_input(shape=[1] * 1000)]))),
    _h("shape-int64-min-dim", post_json(acc_doc([acc_input(shape=[1, -(2**63)])]))),
    _h("shape-negative-second-dim", post_json(acc_doc([acc_input(shape=[1, -2])]))),
    _h("shape-product-overflows-int64", post_json(acc_doc([acc_input(shape=[2**32, 2**32, 2**32])]))),
    _h("shape-dim-over-uint64", post_json(acc_doc([acc_input(shape=[1, 2**64])]))),
    _h("shape-1x10e12", post_json(acc_doc([acc_input(shape=[1, 10**12])]))),
    _h("shape-float-dims", post_json(acc_doc([acc_input(shape=[1.0, 1.0])]))),
    # JSON booleans are not dimensions (Python's bool is an int: a real trap)
    _h("shape-bool-dims", post_json(acc_doc([acc_input(shape=[True, True])]))),
    _h("shape-as-string", post_json(acc_doc([acc_input(shape="[1, 1]")]))),
    _h("shape-as-object", post_json(acc_doc([acc_input(shape={"0": 1, "1": 1})]))),
    _h("shape-null", post_json(acc_doc([acc_input(shape=None)]))),
    _h("shape-nested-lists", post_json(acc_doc([acc_input(shape=[[1], [1]])]))),
    _h("shape-nan-token", post_json(acc_doc([acc_input(shape=[float("nan"), 1])]))),
    _h("shape-infinity-token", post_json(acc_doc([acc_input(shape=[1, float("inf")])]))),
    _h("shape-missing", post_json(acc_doc([{"name": "INPUT", "datatype": "FP32", "data": [1.0]}]))),
    # --- data vs shape, data types
    _h("data-longer-than-shape", post_json(acc_doc([acc_input(data=[1.0, 2.0, 3.0])]))),
    _h("data-ragged-nesting", post_json(acc_doc([acc_input(data=[[1.0], [2.0, 3.0]])]))),
    _h("data-nested-50k-levels", post_json(acc_doc([acc_input(data="__D__")]), D=nested(50_000))),
    _h("data-nested-5k-levels", post_json(acc_doc([acc_input(data="__D__")]), D=nested(5_000))),
    _h("data-null", post_json(acc_doc([acc_input(data=None)]))),
    _h("data-as-string", post_json(acc_doc([acc_input(data="1.0")]))),
    _h("data-as-object", post_json(acc_doc([acc_input(data={"0": 1.0})]))),
    _h("data-bool-for-fp32", post_json(acc_doc([acc_input(data=[True])]))),
    _h("data-null-element", post_json(acc_doc([acc_input(data=[None])]))),
    _h("data-empty-nested-list", post_json(acc_doc([acc_input(data=[[]])]))),
    _h("data-1e400-beyond-double", post_json(acc_doc([acc_input(data=["__N__"])]), N="1e400")),
    _h("data-10e400-integer", post_json(acc_doc([acc_input(data=[10**400])]))),
    _h("data-lowercase-nan-token", post_json(acc_doc([acc_input(data=["__N__"])]), N="nan")),
    _h("data-negative-nan-token", post_json(acc_doc([acc_input(data=["__N__"])]), N="-NaN")),
    # FP32 beyond its range but within a double: Triton casts (inf), a refusal is also clean
    # (the output comes back binary: these cases are about reading the input)
    _h("data-fp32-overflow-1e39", post_json(acc_doc([acc_input(data=[1e39])], outputs=BINARY_OUT)), OK_OR_400,
       ok=ok_sum(float("inf"))),
    # rapidjson's NaN / Infinity tokens are valid FP32 data (protocol.md 3): a correct 200
    _h("data-infinity-token-fp32", post_json(acc_doc([acc_input(data=[float("inf")])], outputs=BINARY_OUT)),
       frozenset({200}), ok=ok_sum(float("inf"))),
    # --- numbers out of range for their datatype (identity: one input broken, the rest valid)
    _h("int8-300", post_identity("INT8", [300])),
    _h("int8-minus-129", post_identity("INT8", [-129])),
    _h("uint8-minus-1", post_identity("UINT8", [-1])),
    _h("uint8-256", post_identity("UINT8", [256])),
    _h("int16-40000", post_identity("INT16", [40000])),
    _h("uint16-70000", post_identity("UINT16", [70000])),
    _h("int32-2e31", post_identity("INT32", [2**31])),
    _h("uint32-2e32", post_identity("UINT32", [2**32])),
    _h("int64-2e63", post_identity("INT64", [2**63])),
    _h("uint64-2e64", post_identity("UINT64", [2**64])),
    _h("uint64-negative", post_identity("UINT64", [-5])),
    _h("int32-fraction", post_identity("INT32", [1.5])),
    _h("int64-nan-token", post_identity("INT64", [float("nan")])),
    _h("uint32-infinity-token", post_identity("UINT32", [float("inf")])),
    _h("bool-2", post_identity("BOOL", [2])),
    _h("bool-string", post_identity("BOOL", ["true"])),
    _h("fp16-1e6-overflow", post_identity("FP16", [1e6])),
    _h("fp64-1e400", post_identity("FP64", ["__N__"], N="1e400")),
    _h("bytes-as-number", post_identity("BYTES", [12])),
    _h("bytes-as-nested-object", post_identity("BYTES", [{"b64": "AAAA"}])),
    _h("uint8-string-digits", post_identity("UINT8", ["7"])),
    _h("bytes-json-huge-shape", post_json({"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1, 250_000_000],
                                                       "data": ["ab"]}]}, "echo_bytes")),
    # --- wrong JSON types, everywhere
    _h("inputs-as-object", post_json({"inputs": acc_input(), "parameters": seq_params(_sid())})),
    _h("inputs-as-string", post_json({"inputs": "INPUT", "parameters": seq_params(_sid())})),
    _h("inputs-null", post_json({"inputs": None, "parameters": seq_params(_sid())})),
    _h("inputs-of-numbers", post_json({"inputs": [1, 2], "parameters": seq_params(_sid())})),
    _h("inputs-of-lists", post_json({"inputs": [[acc_input()]], "parameters": seq_params(_sid())})),
    _h("input-name-number", post_json(acc_doc([acc_input(name=7)]))),
    _h("input-name-null", post_json(acc_doc([acc_input(name=None)]))),
    _h("input-datatype-list", post_json(acc_doc([acc_input(datatype=["FP32"])]))),
    _h("input-parameters-list", post_json(acc_doc([acc_input(parameters=["binary_data_size"])]))),
    _h("input-parameters-string", post_json(acc_doc([acc_input(parameters="binary")]))),
    _h("parameters-string", post_json(acc_doc(params="sequence_id=5"))),
    _h("parameters-number", post_json(acc_doc(params=5))),
    # request parameters are flat: string, number or boolean values (protocol.md 3)
    _h("parameter-value-object", post_json(acc_doc(params={**seq_params(_sid()), "custom": {"a": 1}}))),
    _h("parameter-value-list", post_json(acc_doc(params={**seq_params(_sid()), "custom": [1, 2]}))),
    _h("outputs-of-strings", post_json(acc_doc(outputs=["OUTPUT"]))),
    _h("output-name-number", post_json(acc_doc(outputs=[{"name": 1}]))),
    _h("output-parameters-list", post_json(acc_doc(outputs=[{"name": "OUTPUT", "parameters": [1]}]))),
    _h("output-binary-data-string",
       post_json(acc_doc(outputs=[{"name": "OUTPUT", "parameters": {"binary_data": "yes"}}]))),
    # Triton reads "id" with MemberAsString: anything but a string is refused
    _h("id-object", post_json(acc_doc(id={"x": 1}))),
    _h("id-number", post_json(acc_doc(id=12345))),
    _h("body-json-null", post(b"null")),
    _h("body-empty", post(b"")),
    _h("body-invalid-utf8",
       post(b'{"inputs": [{"name": "\xff\xfe", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}')),
    _h("body-nul-bytes", post(b"\x00" * 64)),
    _h("body-utf16-bom", post(b"\xff\xfe" + jbytes(acc_doc()).decode().encode("utf-16-le"))),
    _h("object-nested-50k-levels",
       post(b'{"inputs": [], "parameters": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}")),
    _h("top-level-array-50k-levels", post(nested(50_000, "0").encode())),
    # --- duplicate input names, datatypes
    _h("duplicate-input-names", post_json(acc_doc([acc_input(2.0), acc_input(3.0)]))),
    _h("duplicate-input-names-other-dtype", post_json(acc_doc([acc_input(), acc_input(datatype="INT32", data=[1])]))),
    _h("datatype-empty", post_json(acc_doc([acc_input(datatype="")]))),
    _h("datatype-lowercase", post_json(acc_doc([acc_input(datatype="fp32")]))),
    _h("datatype-config-spelling", post_json(acc_doc([acc_input(datatype="TYPE_FP32")]))),
    _h("datatype-STRING", post_json(acc_doc([acc_input(datatype="STRING", data=["1"])]))),
    _h("datatype-64k-long", post_json(acc_doc([acc_input(datatype="F" * 65536)]))),
    _h("bf16-json-to-accumulator", post_json(acc_doc([acc_input(datatype="BF16")])), E400_501),
    # --- parameters out of range
    # priority is ignored for sequence models (sequence-semantics 13): 2^31 is a valid uint64
    _h("priority-2e31", post_json(acc_doc(params=seq_params(_sid(), priority=2**31))), OK_OR_400, ok=ok_sum(1.0)),
    _h("priority-2e64", post_json(acc_doc(params=seq_params(_sid(), priority=2**64)))),
    _h("priority-fraction", post_json(acc_doc(params=seq_params(_sid(), priority=1.5)))),
    _h("priority-string", post_json(acc_doc(params=seq_params(_sid(), priority="high")))),
    _h("priority-nan-token", post_json(acc_doc(params=seq_params(_sid(), priority=float("nan"))))),
    _h("timeout-negative", post_json(acc_doc(params=seq_params(_sid(), timeout=-1)))),
    _h("timeout-2e64", post_json(acc_doc(params=seq_params(_sid(), timeout=2**64)))),
    _h("timeout-int64-max", post_json(acc_doc(params=seq_params(_sid(), timeout=2**63 - 1))), OK_OR_400,
       ok=ok_sum(1.0)),
    _h("timeout-fraction", post_json(acc_doc(params=seq_params(_sid(), timeout=0.5)))),
    _h("sequence-id-int64-min", post_json(acc_doc(params=seq_params(-(2**63))))),
    _h("sequence-id-integral-float", post_json(acc_doc(params=seq_params(_sid(), sequence_id=5.0)))),
    _h("sequence-id-1e300", post_json(acc_doc(params=seq_params(_sid(), sequence_id=1e300)))),
    _h("sequence-id-false", post_json(acc_doc(params=seq_params(_sid(), sequence_id=False)))),
    _h("sequence-id-object", post_json(acc_doc(params=seq_params(_sid(), sequence_id={"id": 5})))),
    _h("sequence-id-null", post_json(acc_doc(params=seq_params(_sid(), sequence_id=None)))),
    _h("sequence-id-nan-token", post_json(acc_doc(params=seq_params(_sid(), sequence_id=float("nan"))))),
    _h("sequence-id-200-chars", post_json(acc_doc(params=seq_params("s" * 200))), E400_501),
    _h("sequence-start-null", post_json(acc_doc(params=seq_params(_sid(), sequence_start=None)))),
    _h("sequence-end-string", post_json(acc_doc(params=seq_params(_sid(), sequence_end="false")))),
    _h("binary-data-output-string", post_json(acc_doc(params=seq_params(_sid(), binary_data_output="true")))),
]  # fmt: skip

_b = bin_input
HTTP_BINARY_CASES = [
    _h("binary-data-size-negative", post_binary(acc_doc([_b(size=-4)]), FP32_ONE)),
    _h("binary-data-size-2e64", post_binary(acc_doc([_b(size=2**64)]), FP32_ONE)),
    _h("binary-data-size-1e18", post_binary(acc_doc([_b(size=10**18)]), FP32_ONE)),
    _h("binary-data-size-float", post_binary(acc_doc([_b(size=4.0)]), FP32_ONE)),
    _h("binary-data-size-string", post_binary(acc_doc([_b(size="4")]), FP32_ONE)),
    _h("binary-data-size-bool", post_binary(acc_doc([_b(size=True)]), FP32_ONE)),
    _h("binary-data-size-null", post_binary(acc_doc([_b(size=None)]), FP32_ONE)),
    _h("binary-data-size-nan", post_binary(acc_doc([_b(size=float("nan"))]), FP32_ONE)),
    _h("ihcl-2e64", post_binary(acc_doc([_b()]), FP32_ONE, ihcl=str(2**64))),
    _h("ihcl-100-digits", post_binary(acc_doc([_b()]), FP32_ONE, ihcl="9" * 100)),
    _h("ihcl-negative-huge", post_binary(acc_doc([_b()]), FP32_ONE, ihcl=str(-(2**70)))),
    # str.isdigit() is true for "²" but int() refuses it
    _h("ihcl-superscript-digit", post_binary(acc_doc([_b()]), FP32_ONE, ihcl="\u00b2")),
    _h("ihcl-hex", post_binary(acc_doc([_b()]), FP32_ONE, ihcl="0x40")),
    _h("ihcl-exponent", post_binary(acc_doc([_b()]), FP32_ONE, ihcl="1e2")),
    _h("ihcl-two-numbers", post_binary(acc_doc([_b()]), FP32_ONE, ihcl="10 20")),
    _h("binary-65-dims", post_binary(acc_doc([_b(shape=[1] * 65)]), FP32_ONE)),
    _h("binary-negative-dim", post_binary(acc_doc([_b(shape=[1, -1])]), FP32_ONE)),
    _h("binary-dims-overflow-int64", post_binary(acc_doc([_b(shape=[2**62, 4])]), FP32_ONE)),
    _h("binary-dims-product-wraps-to-1", post_binary(acc_doc([_b(shape=[2**32, 2**32, 1])]), FP32_ONE)),
    _h("binary-shape-1x10e12", post_binary(acc_doc([_b(shape=[1, 10**12])]), FP32_ONE)),
    _h("binary-size-8-for-one-fp32", post_binary(acc_doc([_b(size=8)]), FP32_ONE * 2)),
    _h("bytes-huge-shape-tiny-data", post_binary({"inputs": [_b("IN", "BYTES", [1, 250_000_000], 8)]},
                                                 bytes_elements(b"abcd"), "echo_bytes")),
    _h("bytes-huge-shape-to-fp32-model", post_binary(acc_doc([_b("INPUT", "BYTES", [1, 250_000_000], 8)]),
                                                     bytes_elements(b"abcd"))),
    _h("bytes-shape-10e12", post_binary({"inputs": [_b("IN", "BYTES", [1, 10**12], 8)]}, bytes_elements(b"abcd"),
                                        "echo_bytes")),
    _h("bytes-shape-product-wraps", post_binary({"inputs": [_b("IN", "BYTES", [2**32, 2**32], 8)]},
                                                bytes_elements(b"abcd"), "echo_bytes")),
    _h("bytes-length-prefix-ffffffff", post_binary({"inputs": [_b("IN", "BYTES", [1, 1], 6)]},
                                                   b"\xff\xff\xff\xffab", "echo_bytes")),
    _h("bytes-length-prefix-2e31", post_binary({"inputs": [_b("IN", "BYTES", [1, 1], 6)]},
                                               b"\x00\x00\x00\x80ab", "echo_bytes")),
    _h("bytes-length-prefix-one-past-end", post_binary({"inputs": [_b("IN", "BYTES", [1, 1], 6)]},
                                                       b"\x03\x00\x00\x00ab", "echo_bytes")),
    _h("bytes-length-prefix-cut", post_binary({"inputs": [_b("IN", "BYTES", [1, 1], 2)]}, b"\x02\x00",
                                              "echo_bytes")),
    _h("bytes-trailing-bytes", post_binary({"inputs": [_b("IN", "BYTES", [1, 1], 8)]}, bytes_elements(b"ab") + b"zz",
                                           "echo_bytes")),
    _h("bytes-fewer-elements-than-shape", post_binary({"inputs": [_b("IN", "BYTES", [1, 3], 6)]},
                                                      bytes_elements(b"ab"), "echo_bytes")),
    _h("bf16-binary-to-fp32-model", post_binary(acc_doc([_b(datatype="BF16", size=2)]), b"\x80\x3f"), E400_501),
    _h("fp16-binary-to-fp32-model", post_binary(acc_doc([_b(datatype="FP16", size=2)]), np.float16(1).tobytes())),
    _h("duplicate-input-names-binary", post_binary(acc_doc([_b(), _b()]), FP32_ONE * 2)),
    _h("tail-without-binary-inputs", post_binary(acc_doc(), FP32_ONE)),
    _h("binary-sizes-swapped", post_binary(
        {"inputs": [_b("INPUT0", shape=[1, 4], size=12), _b("INPUT1", shape=[1, 4], size=20)]}, bytes(32), "add_sub")),
    _h("binary-sequence-id-2e64", post_binary(acc_doc([_b()], seq_params(2**64)), FP32_ONE)),
    _h("binary-sequence-id-negative", post_binary(acc_doc([_b()], seq_params(-7)), FP32_ONE)),
    _h("binary-and-json-same-input", post_binary(acc_doc([acc_input(parameters={"binary_data_size": 4})]), FP32_ONE)),
]  # fmt: skip

_big = post_json(acc_doc())
HTTP_ENCODING_CASES = [
    _h("content-encoding-br", post(_valid_json, [("Content-Encoding", "br")]), E415),
    _h("content-encoding-compress", post(_valid_json, [("Content-Encoding", "compress")]), E415),
    _h("content-encoding-gzip-then-br", post(_valid_gz, [("Content-Encoding", "gzip, br")]), E415),
    _h("content-encoding-x-gzip", post(_valid_gz, [("Content-Encoding", "x-gzip")]), E415),
    _h("content-encoding-garbage-token", post(_valid_json, [("Content-Encoding", "@@;q=zz, ,,")]),
       frozenset({400, 415})),
    _h("gzip-truncated", post(_valid_gz[: len(_valid_gz) // 2], [("Content-Encoding", "gzip")])),
    _h("gzip-not-gzip", post(b"this is not gzip at all", [("Content-Encoding", "gzip")])),
    _h("gzip-empty-body", post(b"", [("Content-Encoding", "gzip")])),
    _h("gzip-bad-crc", post(_valid_gz[:-8] + b"\0\0\0\0" + _valid_gz[-4:], [("Content-Encoding", "gzip")])),
    _h("gzip-of-gzip-declared-once", post(gzip.compress(_valid_gz), [("Content-Encoding", "gzip")])),
    _h("gzip-of-garbage-json", post(gzip.compress(b'{"inputs": [1, 2, }'), [("Content-Encoding", "gzip")])),
    _h("deflate-bomb-256mib", post(zlib_bomb(256 << 20, BOMB_PREFIX), [("Content-Encoding", "deflate")]), E400_413),
    _h("gzip-bomb-ihcl-points-past-inflated", post(gzip.compress(_valid_json),
                                                   [("Content-Encoding", "gzip"), (IHCL, str(len(_valid_json) + 5))])),
]  # fmt: skip

_ok_head = http_bytes("POST", infer_path(), b"", [("Transfer-Encoding", "chunked")])
HTTP_FRAMING_CASES = [
    _h("chunk-size-2e64", _ok_head + b"10000000000000000\r\n" + _valid_json + b"\r\n0\r\n\r\n", E400_413),
    _h("chunk-size-not-hex", _ok_head + b"zz\r\n" + _valid_json + b"\r\n0\r\n\r\n"),
    _h("chunk-size-negative", _ok_head + b"-10\r\n" + _valid_json + b"\r\n0\r\n\r\n"),
    _h("chunked-and-content-length", http_bytes("POST", infer_path(), b"5\r\nhello\r\n0\r\n\r\n",
                                                [("Transfer-Encoding", "chunked"), ("Content-Length", "3")])),
    _h("content-length-negative", http_bytes("POST", infer_path(), _valid_json, [("Content-Length", "-1")]),
       framing=True),
    _h("content-length-not-a-number", http_bytes("POST", infer_path(), _valid_json, [("Content-Length", "abc")]),
       framing=True),
    _h("content-length-2e70", http_bytes("POST", infer_path(), _valid_json, [("Content-Length", str(2**70))]),
       E400_413, framing=True),
    _h("content-length-twice-different",
       http_bytes("POST", infer_path(), _valid_json,
                  [("Content-Length", str(len(_valid_json))), ("Content-Length", "3")]), framing=True),
    _h("content-length-8gib-declared", http_bytes("POST", infer_path(), b"{}", [("Content-Length", str(8 << 30))]),
       E413),
    _h("header-1mib", http_bytes("POST", infer_path(), _valid_json, [("X-Big", "a" * (1 << 20))]),
       frozenset({400, 413, 431}), framing=True),
    _h("headers-10k", http_bytes("POST", infer_path(), _valid_json, [(f"X-H{i}", "v") for i in range(10_000)]),
       frozenset({400, 413, 431}), framing=True),
]  # fmt: skip

_long64k = "m" * 65536
HTTP_URL_METHOD_CASES = [
    _h("model-name-64k", post(_valid_json, model=_long64k), TOO_LONG, framing=True),
    _h("model-name-1mib", post(_valid_json, model="m" * (1 << 20)), frozenset({400, *TOO_LONG}), framing=True),
    _h("model-dotdot", post(_valid_json, model=".."), E404),
    _h("model-dotdot-encoded", post(_valid_json, model="%2e%2e"), E400_404),
    _h("model-encoded-slash-traversal", post(_valid_json, model="accumulator%2F..%2Fadd_sub"), E400_404),
    _h("model-encoded-nul", post(_valid_json, model="accumulator%00"), E400_404),
    _h("model-invalid-utf8", post(_valid_json, model="%ff%fe"), E400_404),
    _h("model-bad-percent-escape", post(_valid_json, model="acc%zzumulator"), E400_404),
    _h("model-encoded-space", post(_valid_json, model="accumulator%20"), E404),
    _h("model-traversal-to-etc", http_bytes("POST", "/v2/models/../../../../etc/passwd/infer", _valid_json), E404),
    _h("version-abc-metadata", http_bytes("GET", "/v2/models/accumulator/versions/abc"), E404, method="GET"),
    _h("version-abc-config", http_bytes("GET", "/v2/models/accumulator/versions/abc/config"), E404, method="GET"),
    _h("version-2e64-infer", http_bytes("POST", infer_path(version=str(2**64)), _valid_json), E404),
    _h("version-40-digits-infer", http_bytes("POST", infer_path(version="9" * 40), _valid_json), E404),
    _h("version-negative-infer", http_bytes("POST", infer_path(version="-1"), _valid_json), E404),
    _h("version-zero-infer", http_bytes("POST", infer_path(version="0"), _valid_json), E404),
    _h("stats-model-name-64k", http_bytes("GET", f"/v2/models/{_long64k}/stats"), frozenset({400, *TOO_LONG}),
       method="GET", framing=True),
    _h("ready-version-abc", http_bytes("GET", "/v2/models/accumulator/versions/abc/ready"), E400_404, method="GET"),
    _h("method-put-infer", http_bytes("PUT", infer_path(), _valid_json), E405, method="PUT"),
    _h("method-delete-model", http_bytes("DELETE", "/v2/models/accumulator"), E405, method="DELETE"),
    _h("method-patch-index", http_bytes("PATCH", "/v2/repository/index", b"{}"), E405, method="PATCH"),
    _h("method-get-infer", http_bytes("GET", infer_path()), E405, method="GET"),
    _h("method-post-health", http_bytes("POST", "/v2/health/live", b"{}"), E405),
    _h("method-trace-root", http_bytes("TRACE", "/v2"), E405, method="TRACE"),
    _h("method-unknown-token", http_bytes("FROBNICATE", infer_path(), _valid_json), frozenset({400, 405}),
       method="FROBNICATE"),
]  # fmt: skip

HTTP_CASES = HTTP_JSON_CASES + HTTP_BINARY_CASES + HTTP_ENCODING_CASES + HTTP_FRAMING_CASES + HTTP_URL_METHOD_CASES


@pytest.mark.parametrize("case", HTTP_CASES, ids=[c.id for c in HTTP_CASES])
def test_http_hostile(hostile: Harness, case: HttpCase) -> None:
    def run() -> None:
        reply = send_raw(hostile.port, case.data, method=case.method)
        assert_clean_http(reply, case.expect, case.bound, empty_ok=case.framing)
        if reply.status == 200:
            assert case.ok is not None, f"unexpected 200: {reply.describe()}"
            case.ok(reply)

    hostile.run_case(case.id, run)


def test_http_body_stall_gets_408(hostile: Harness) -> None:
    """Content-Length 1000, 10 bytes sent, then silence: the server answers 408 (issue 11: a
    slow client is timed out with 408 within ~10 s) and nobody else waits meanwhile."""

    def run() -> None:
        head = http_bytes("POST", infer_path(), b"", [("Content-Length", "1000")])
        reply = send_raw(hostile.port, head + b'{"inputs":', timeout=15.0)
        assert reply.status == 408, f"expected 408 within ~10 s, got {reply.describe()}"
        error_message(reply)
        assert reply.elapsed <= 12.0, reply.describe()

    hostile.run_case("body-stall-408", run)


# ---------------------------------------------------------------------- gRPC cases


@dataclass(frozen=True)
class GrpcCase:
    id: str
    payload: bytes
    expect: frozenset[grpc.StatusCode] = frozenset({Code.INVALID_ARGUMENT})
    method: str = "ModelInfer"
    undecodable: bool = False  # not a valid message: on a stream, ending it is a clean answer
    ok_value: float | None = None  # where OK is expected: the OUTPUT it must carry
    bound: float = ANSWER_BOUND_S
    rid: str = ""  # the request id a stream error must echo


INVALID = frozenset({Code.INVALID_ARGUMENT})
INVALID_OR_NOT_FOUND = frozenset({Code.INVALID_ARGUMENT, Code.NOT_FOUND})
INVALID_OR_UNIMPLEMENTED = frozenset({Code.INVALID_ARGUMENT, Code.UNIMPLEMENTED})
OK_OR_INVALID = frozenset({Code.OK, Code.INVALID_ARGUMENT})
# A huge name or datatype: refused as unknown or invalid, or as too large. The error message must
# not echo it whole: grpcio clients drop trailers over 16 KiB ("received metadata size exceeds
# hard limit"), so such an answer never reaches the client (checked in the test).
HUGE_NAME = frozenset({Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.RESOURCE_EXHAUSTED})


def greq(model: str = "accumulator", value: float = 1.0, *, rid: str = "hostile") -> service_pb2.ModelInferRequest:
    return acc_request(new_int_id(), value, model=model, rid=rid)


def gmut(fn: Callable[[service_pb2.ModelInferRequest], Any], **kw: Any) -> service_pb2.ModelInferRequest:
    r = greq(**kw)
    fn(r)
    return r


def _g(cid: str, msg: Any, expect: frozenset[grpc.StatusCode] = INVALID, **kw: Any) -> GrpcCase:
    if isinstance(msg, bytes):
        return GrpcCase(cid, msg, expect, **kw)
    return GrpcCase(cid, msg.SerializeToString(), expect, rid=getattr(msg, "id", ""), **kw)


def _shape(shape: list[int], raw: bytes = FP32_ONE, datatype: str = "FP32") -> Callable[[Any], None]:
    def fn(r: service_pb2.ModelInferRequest) -> None:
        del r.inputs[0].shape[:]
        r.inputs[0].shape.extend(shape)
        r.inputs[0].datatype = datatype
        r.raw_input_contents[0] = raw

    return fn


def _param(key: str, kind: str, value: Any) -> Callable[[Any], None]:
    def fn(r: service_pb2.ModelInferRequest) -> None:
        setattr(r.parameters[key], kind, value)

    return fn


def _bytes_req(shape: list[int], raw: bytes) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="echo_bytes", id="hostile-bytes")
    r.inputs.add(name="IN", datatype="BYTES", shape=shape)
    r.raw_input_contents.append(raw)
    return r


def _add_sub(typed0: bool = False, raws: int = 2) -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="add_sub", id="hostile-add-sub")
    for name in ("INPUT0", "INPUT1"):
        r.inputs.add(name=name, datatype="FP32", shape=[1, 4])
    if typed0:
        r.inputs[0].contents.fp32_contents.extend([1.0] * 4)
    for _ in range(raws):
        r.raw_input_contents.append(bytes(16))
    return r


def _typed_bytes_huge() -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="echo_bytes", id="hostile-typed-bytes")
    r.inputs.add(name="IN", datatype="BYTES", shape=[1, 250_000_000])
    r.inputs[0].contents.bytes_contents.append(b"ab")
    return r


def _valid_bytes() -> bytes:
    return greq().SerializeToString()


def _metadata(name: str, version: str = "") -> bytes:
    return service_pb2.ModelMetadataRequest(name=name, version=version).SerializeToString()


GRPC_CASES = [
    # --- undecodable protobuf
    # (answered at once: within 1 s, as issue 11 asks of a garbage message on a stream)
    _g("protobuf-16-bytes-ff", b"\xff" * 16, undecodable=True, bound=1.0),
    _g("protobuf-truncated", _valid_bytes()[:25], undecodable=True, bound=1.0),
    _g("protobuf-length-past-end", varint((7 << 3) | 2) + varint(2**31) + b"x" * 10, undecodable=True, bound=1.0),
    _g("protobuf-invalid-utf8-model-name", pb_field(1, 2, b"\xff\xfeacc"), undecodable=True, bound=1.0),
    _g("protobuf-groups-200-deep", varint((15 << 3) | 3) * 200 + varint((15 << 3) | 4) * 200, undecodable=True,
       bound=1.0),
    _g("protobuf-wire-type-7", varint((1 << 3) | 7) + b"abc", undecodable=True, bound=1.0),
    _g("protobuf-field-number-0", varint(0) + b"\x01", undecodable=True, bound=1.0),
    _g("protobuf-garbage-to-metadata", b"\xde\xad\xbe\xef" * 4, method="ModelMetadata", undecodable=True,
       bound=1.0),
    # a known field with the wrong wire type parses as an unknown field: no model name
    _g("protobuf-model-name-as-varint", pb_field(1, 0, 5), INVALID_OR_NOT_FOUND),
    # --- shapes
    _g("shape-65-dims", gmut(_shape([1] * 65))),
    _g("shape-int64-min", gmut(_shape([1, -(2**63)]))),
    _g("shape-negative-dim", gmut(_shape([-4, 1]))),
    _g("shape-product-overflows", gmut(_shape([2**62, 4]))),
    _g("shape-product-wraps-to-zero", gmut(_shape([2**32, 2**32], b""))),
    _g("shape-1x10e12", gmut(_shape([1, 10**12]))),
    _g("raw-shorter-than-shape", gmut(_shape([1, 2]))),
    # --- BYTES
    _g("bytes-huge-shape-tiny-data", _bytes_req([1, 250_000_000], bytes_elements(b"abcd"))),
    _g("bytes-huge-shape-to-fp32-model", gmut(_shape([1, 250_000_000], bytes_elements(b"abcd"), "BYTES"))),
    _g("bytes-shape-product-wraps", _bytes_req([2**32, 2**32], bytes_elements(b"abcd"))),
    _g("bytes-length-prefix-past-end", _bytes_req([1, 1], b"\xff\xff\xff\xffab")),
    _g("bytes-length-prefix-one-past-end", _bytes_req([1, 1], b"\x03\x00\x00\x00ab")),
    _g("bytes-length-prefix-cut", _bytes_req([1, 1], b"\x02\x00")),
    _g("bytes-typed-contents-huge-shape", _typed_bytes_huge()),
    # --- raw / typed contents
    _g("raw-count-short-two-inputs", _add_sub(raws=1)),
    _g("raw-without-inputs", gmut(lambda r: r.ClearField("inputs"))),
    _g("raw-three-entries-one-input", gmut(lambda r: r.raw_input_contents.extend([FP32_ONE, FP32_ONE]))),
    _g("typed-and-raw-across-inputs", _add_sub(typed0=True, raws=1)),
    _g("typed-count-mismatch", gmut(lambda r: (r.ClearField("raw_input_contents"),
                                               r.inputs[0].contents.fp32_contents.extend([1.0, 2.0, 3.0])))),
    _g("typed-wrong-field", gmut(lambda r: (r.ClearField("raw_input_contents"),
                                            r.inputs[0].contents.int_contents.append(1)))),
    _g("typed-fp16-has-no-field", gmut(lambda r: (r.ClearField("raw_input_contents"),
                                                  setattr(r.inputs[0], "datatype", "FP16"),
                                                  r.inputs[0].contents.fp32_contents.append(1.0)))),
    _g("typed-contents-empty-message", gmut(lambda r: (r.ClearField("raw_input_contents"),
                                                       r.inputs[0].contents.SetInParent()))),
    _g("duplicate-input-names", gmut(lambda r: (r.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1]),
                                                r.raw_input_contents.append(FP32_ONE)))),
    _g("ten-thousand-inputs", gmut(lambda r: [(r.inputs.add(name=f"X{i}", datatype="FP32", shape=[1]),
                                               r.raw_input_contents.append(FP32_ONE)) for i in range(10_000)])),
    # --- names, versions, datatypes
    _g("model-name-empty", gmut(lambda r: setattr(r, "model_name", "")), INVALID_OR_NOT_FOUND),
    _g("model-name-1mib", gmut(lambda r: setattr(r, "model_name", "m" * (1 << 20))), HUGE_NAME),
    _g("model-name-nul", gmut(lambda r: setattr(r, "model_name", "accumulator\x00")), INVALID_OR_NOT_FOUND),
    _g("model-name-traversal", gmut(lambda r: setattr(r, "model_name", "../accumulator")), INVALID_OR_NOT_FOUND),
    _g("model-version-40-digits", gmut(lambda r: setattr(r, "model_version", "9" * 40)), INVALID_OR_NOT_FOUND),
    # Triton reads versions with std::stol, which skips leading blanks: " 1" may be version 1
    _g("model-version-padded", gmut(lambda r: setattr(r, "model_version", " 1")),
       frozenset({Code.OK, *INVALID_OR_NOT_FOUND}), ok_value=1.0),
    _g("datatype-empty", gmut(lambda r: setattr(r.inputs[0], "datatype", ""))),
    _g("datatype-64k", gmut(lambda r: setattr(r.inputs[0], "datatype", "F" * 65536)), HUGE_NAME),
    _g("datatype-STRING", gmut(lambda r: setattr(r.inputs[0], "datatype", "STRING"))),
    _g("input-name-empty", gmut(lambda r: setattr(r.inputs[0], "name", ""))),
    _g("output-name-empty", gmut(lambda r: r.outputs.add(name=""))),
    _g("bf16-raw-to-fp32-model", gmut(_shape([1, 1], b"\x80\x3f", "BF16")), INVALID_OR_UNIMPLEMENTED),
    # --- parameters
    _g("priority-uint64-max", gmut(_param("priority", "uint64_param", 2**64 - 1)), OK_OR_INVALID, ok_value=1.0),
    _g("priority-2e31", gmut(_param("priority", "uint64_param", 2**31)), OK_OR_INVALID, ok_value=1.0),
    _g("priority-int64-negative", gmut(_param("priority", "int64_param", -1))),
    _g("priority-string", gmut(_param("priority", "string_param", "high"))),
    _g("priority-bool", gmut(_param("priority", "bool_param", True))),
    _g("timeout-negative", gmut(_param("timeout", "int64_param", -5))),
    _g("timeout-int64-max", gmut(_param("timeout", "int64_param", 2**63 - 1)), OK_OR_INVALID, ok_value=1.0),
    _g("timeout-double", gmut(_param("timeout", "double_param", 1.5))),
    # the int64 -2^63 is the uint64 2^63 (sequence-semantics 12.1): a valid id
    _g("sequence-id-int64-min", gmut(_param("sequence_id", "int64_param", -(2**63))), frozenset({Code.OK}),
       ok_value=1.0),
    _g("sequence-id-100k-chars", gmut(_param("sequence_id", "string_param", "s" * 100_000)),
       INVALID_OR_UNIMPLEMENTED),
    _g("sequence-id-unset-oneof", gmut(lambda r: r.parameters["sequence_id"].Clear())),
    _g("sequence-start-unset-oneof", gmut(lambda r: r.parameters["sequence_start"].Clear())),
    _g("sequence-end-double", gmut(_param("sequence_end", "double_param", 1.0))),
    _g("priority-unset-oneof", gmut(lambda r: r.parameters["priority"].Clear())),
    _g("parameters-100k-custom-keys", gmut(lambda r: [setattr(r.parameters[f"k{i}"], "int64_param", i)
                                                      for i in range(100_000)]),
       frozenset({Code.OK, Code.INVALID_ARGUMENT, Code.RESOURCE_EXHAUSTED}), ok_value=1.0),
    # --- other RPCs
    _g("metadata-name-1mib", _metadata("m" * (1 << 20)), HUGE_NAME, method="ModelMetadata"),
    _g("metadata-version-abc", _metadata("accumulator", "abc"), INVALID_OR_NOT_FOUND, method="ModelMetadata"),
    _g("config-version-negative", service_pb2.ModelConfigRequest(name="accumulator", version="-7"),
       INVALID_OR_NOT_FOUND, method="ModelConfig"),
    _g("statistics-name-1mib", service_pb2.ModelStatisticsRequest(name="s" * (1 << 20)), HUGE_NAME,
       method="ModelStatistics"),
    _g("unknown-rpc", b"", frozenset({Code.UNIMPLEMENTED}), method="/inference.GRPCInferenceService/Nope"),
    _g("unknown-service", b"\x0a\x01x", frozenset({Code.UNIMPLEMENTED}), method="/evil.Service/Exec"),
]  # fmt: skip

_PARSERS = {
    "ModelInfer": service_pb2.ModelInferRequest,
    "ModelMetadata": service_pb2.ModelMetadataRequest,
}


@pytest.mark.parametrize("case", GRPC_CASES, ids=[c.id for c in GRPC_CASES])
def test_grpc_unary_hostile(hostile: Harness, case: GrpcCase) -> None:
    if case.undecodable:  # the case is only worth its name if protobuf really refuses it
        with pytest.raises(Exception, match="Error parsing"):
            _PARSERS[case.method].FromString(case.payload)

    def run() -> None:
        reply = grpc_unary(hostile.channel(), case.method, case.payload)
        assert "received metadata size exceeds" not in reply.details, (
            f"the server's error echoed an unbounded client string; the client could not read it: {reply.describe()}"
        )
        assert_clean_grpc(reply, case.expect, case.bound)
        if reply.code == Code.OK and case.method == "ModelInfer":
            assert case.ok_value is not None, "unexpected OK"
            assert reply.payload is not None
            got = stream_reply_value(service_pb2.ModelInferResponse.FromString(reply.payload))
            assert got == case.ok_value, f"OK with OUTPUT {got}, expected {case.ok_value}"

    hostile.run_case(case.id, run)


STREAM_CASES = [c for c in GRPC_CASES if c.method == "ModelInfer"]


def check_stream_answer(stream: RawStream, case: GrpcCase, after_value: float) -> None:
    """After the hostile payload and a valid step `after`: the payload is answered first (an
    error reply echoing its id, or OK where allowed), or, for a payload that is not a message
    at all, the stream ends with an allowed status. An open stream then answers the valid step:
    per-request errors never kill the stream (protocol.md 4.2)."""
    ev = stream.next_event(case.bound)
    assert ev is not None, f"the stream went silent for {case.bound} s after the hostile request"
    if ev.message is None:
        assert ev.code in ALLOWED_GRPC, f"stream ended with {ev.describe()}; never UNKNOWN/INTERNAL/OK"
        assert case.undecodable or ev.code == Code.RESOURCE_EXHAUSTED, (
            f"a decodable request must get an error reply on the open stream, not end it: {ev.describe()}"
        )
        return
    m = ev.message
    if m.error_message:
        assert case.expect != {Code.OK}, f"error reply where OK was expected: {ev.describe()}"
        assert m.infer_response.id != "after", f"the hostile request got no reply of its own: {ev.describe()}"
        if case.rid:
            assert m.infer_response.id == case.rid, f"the error reply does not echo the request id: {ev.describe()}"
    else:
        assert m.infer_response.id != "after", f"the hostile request got no reply of its own: {ev.describe()}"
        assert Code.OK in case.expect, f"success reply where an error was expected: {ev.describe()}"
        if case.ok_value is not None:
            assert stream_reply_value(m) == case.ok_value
    nxt = stream.next_event(ANSWER_BOUND_S)
    assert nxt is not None, "the stream went silent after the hostile request"
    assert nxt.message is not None, f"the stream ended after a per-request error: {nxt.describe()}"
    assert not nxt.message.error_message and nxt.message.infer_response.id == "after", nxt.describe()
    assert stream_reply_value(nxt.message) == after_value


@pytest.mark.parametrize("case", STREAM_CASES, ids=[c.id for c in STREAM_CASES])
def test_stream_hostile(hostile: Harness, case: GrpcCase) -> None:
    def run() -> None:
        stream = RawStream(hostile.channel())
        try:
            stream.send(case.payload)
            stream.send(acc_request(new_int_id(), 2.0, rid="after"))
            check_stream_answer(stream, case, 2.0)
        finally:
            stream.cancel()

    hostile.run_case("stream-" + case.id, run)


def test_stream_10k_unknown_models(hostile: Harness) -> None:
    """10k requests for unknown models, as fast as the client can write them, then one valid
    step: each gets its error reply (or the server sheds the stream with RESOURCE_EXHAUSTED /
    UNAVAILABLE), the valid step is answered, within a bound; the live sequences keep going."""
    n = 10_000

    def run() -> None:
        stream = RawStream(hostile.channel())
        try:
            t0 = time.monotonic()
            for i in range(n):
                stream.send(service_pb2.ModelInferRequest(model_name=f"no_such_model_{i}", id=f"u{i}"))
            stream.send(acc_request(new_int_id(), 3.0, rid="after"))
            errors = 0
            while True:
                ev = stream.next_event(ANSWER_BOUND_S)
                assert ev is not None, f"the stream went silent after {errors} error replies"
                if ev.message is None:
                    assert ev.code in (Code.RESOURCE_EXHAUSTED, Code.UNAVAILABLE), ev.describe()
                    break
                m = ev.message
                if m.infer_response.id == "after":
                    assert not m.error_message and stream_reply_value(m) == 3.0, ev.describe()
                    assert errors == n, f"only {errors} of {n} unknown-model requests got an error reply"
                    break
                assert m.error_message and m.infer_response.id == f"u{errors}", ev.describe()
                errors += 1
            elapsed = time.monotonic() - t0
            assert elapsed < 30.0, f"{n} refusals took {elapsed:.1f} s"
        finally:
            stream.cancel()

    hostile.run_case("stream-10k-unknown-models", run)


def _hundred_mb_request() -> bytes:
    """A request that would be valid but for its size: one 100 MB BYTES element for echo_bytes."""
    r = service_pb2.ModelInferRequest(model_name="echo_bytes", id="huge")
    r.inputs.add(name="IN", datatype="BYTES", shape=[1, 1])
    r.raw_input_contents.append(struct.pack("<I", 100_000_000) + bytes(100_000_000))
    return r.SerializeToString()


def test_grpc_100mb_message_unary(hostile: Harness) -> None:
    """A 100 MB ModelInfer message is refused by the receive limit: RESOURCE_EXHAUSTED (issue 11;
    the limit is the server's, below tritonclient's INT32_MAX send limit)."""
    payload = _hundred_mb_request()

    def run() -> None:
        reply = grpc_unary(hostile.channel(), "ModelInfer", payload, timeout=30.0)
        assert_clean_grpc(reply, {Code.RESOURCE_EXHAUSTED}, bound=10.0)

    hostile.run_case("grpc-100mb-unary", run)


def test_grpc_100mb_message_on_stream(hostile: Harness) -> None:
    """The same on a stream: it ends with RESOURCE_EXHAUSTED (or refuses the message with an
    error reply); never a success, never silence."""
    payload = _hundred_mb_request()

    def run() -> None:
        stream = RawStream(hostile.channel())
        try:
            stream.send(payload)
            stream.send(acc_request(new_int_id(), 2.0, rid="after"))
            ev = stream.next_event(10.0)
            assert ev is not None, "the stream went silent after a 100 MB message"
            if ev.message is None:
                assert ev.code == Code.RESOURCE_EXHAUSTED, ev.describe()
            else:
                assert ev.message.error_message and ev.message.infer_response.id != "after", (
                    f"a 100 MB message was not refused: {ev.describe()}"
                )
        finally:
            stream.cancel()

    hostile.run_case("stream-100mb", run)


# ---------------------------------------------------------------- valid baselines


def test_baselines_are_valid(hostile: Harness) -> None:
    """The valid requests the hostile cases are cut from succeed: a case fails for its hostile
    part, not for a broken base."""
    port = hostile.port
    r = send_raw(port, post_json(acc_doc([acc_input(4.0)])))
    assert r.status == 200 and output_values(r) == [4.0], r.describe()
    r = send_raw(port, post_binary(acc_doc([bin_input()]), FP32_ONE))
    assert r.status == 200 and output_values(r) == [1.0], r.describe()
    r = send_raw(port, post(gzip.compress(jbytes(acc_doc([acc_input(5.0)]))), [("Content-Encoding", "gzip")]))
    assert r.status == 200 and output_values(r) == [5.0], r.describe()
    r = send_raw(port, post_identity())
    assert r.status == 200, r.describe()
    r = send_raw(port, post_binary({"inputs": [bin_input("IN", "BYTES", [1, 2], 12)]},
                                   bytes_elements(b"ab", b"cd"), "echo_bytes"))  # fmt: skip
    assert r.status == 200, r.describe()
    pair = [bin_input("INPUT0", shape=[1, 4], size=16), bin_input("INPUT1", shape=[1, 4], size=16)]
    r = send_raw(port, post_binary({"inputs": pair}, bytes(32), "add_sub"))
    assert r.status == 200, r.describe()
    g = grpc_unary(hostile.channel(), "ModelInfer", greq(value=6.0))
    assert g.code == Code.OK and g.payload is not None, g.describe()
    assert stream_reply_value(service_pb2.ModelInferResponse.FromString(g.payload)) == 6.0
    g = grpc_unary(hostile.channel(), "ModelInfer", _bytes_req([1, 1], bytes_elements(b"abcd")))
    assert g.code == Code.OK, g.describe()
    g = grpc_unary(hostile.channel(), "ModelInfer", _add_sub())
    assert g.code == Code.OK, g.describe()
    stream = RawStream(hostile.channel())
    try:
        stream.send(greq(value=7.0, rid="base"))
        ev = stream.next_event(ANSWER_BOUND_S)
        assert ev is not None and ev.message is not None and not ev.message.error_message, ev and ev.describe()
        assert stream_reply_value(ev.message) == 7.0
    finally:
        stream.cancel()


def test_corpus_size() -> None:
    """Issue 11 asks for over a hundred distinct hostile requests."""
    for cases in (HTTP_CASES, GRPC_CASES):
        ids = [c.id for c in cases]
        assert len(ids) == len(set(ids)), "duplicate case ids"
        assert len({c.data if isinstance(c, HttpCase) else (c.method, c.payload) for c in cases}) == len(cases)
    assert len(HTTP_CASES) + len(GRPC_CASES) + len(STREAM_CASES) > 100
