"""KServe v2 over HTTP: the JSON inference request and response, the binary tensor data
extension (both directions), and body compression.

``decode_request`` builds the engine's ``InferRequest`` directly from the body; how the reply
is to carry each output (binary or JSON data) is HTTP's own business and comes back beside
it in an ``HttpReplyOptions``, which ``encode_response`` reads. Kept free of framework
objects: the HTTP front-end (``routes``, ``router``, ``status``) owns headers, status codes and
routing.
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from seqserve.api.classification import CLASSIFICATION_PARAM, class_count
from seqserve.api.kserve import (
    NUMPY_DTYPES,
    UINT64_MAX,
    bad,
    check_shape,
    clip,
    raw_bytes,
    set_parameter,
    tensor_from_raw,
    wire_datatype,
)
from seqserve.api.shared_memory import REGION_PARAM, tensor_place
from seqserve.api.tensor_extensions import PlacedOutput, TensorExtensions
from seqserve.engine import InferRequest, InferResult


@dataclass(frozen=True, slots=True)
class HttpReplyOptions:
    """How the reply to one request encodes its outputs."""

    binary_default: bool  # the request's binary_data_output
    #: requested outputs -> their binary_data flag (None: not said, binary_default applies);
    #: None when the request named no outputs
    binary: dict[str, bool | None] | None = None
    #: shared-memory tensors and class counts (None: the request uses neither)
    extensions: TensorExtensions | None = None


# Requests that name no outputs share these (no object per request).
_ALL_JSON = HttpReplyOptions(False)
_ALL_BINARY = HttpReplyOptions(True)


# ------------------------------------------------------------------------- request


def decode_request(
    body: bytes, header_length: int | None, model: str, version: str
) -> tuple[InferRequest, HttpReplyOptions]:
    """Split the JSON header from the binary tail (by Inference-Header-Content-Length) and
    decode both into one engine request for ``model`` / ``version`` (from the URL).

    Every size is checked against the bytes actually present before anything is allocated:
    shapes (rank, int64 products), ``binary_data_size`` against the tail, BYTES element
    counts against their data, JSON ``data`` against the shape."""
    view = memoryview(body)
    if header_length is None:
        head, tail = view, view[len(view) :]
    else:
        if not 0 <= header_length <= len(body):
            raise bad(
                f"Inference-Header-Content-Length {header_length} is out of range for a body of {len(body)} bytes"
            )
        head, tail = view[:header_length], view[header_length:]
    doc = loads(head)
    if not isinstance(doc, dict):
        raise bad("the inference request must be a JSON object")
    rid = doc.get("id", "")
    if not isinstance(rid, str):  # Triton reads it with MemberAsString
        raise bad("Unable to parse 'id'")
    inputs: dict[str, np.ndarray] = {}
    request = InferRequest(model, inputs, version, rid)
    binary_default = False
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad("'parameters' must be a JSON object")
    for key, value in params.items():
        if key == "binary_data_output":
            if not isinstance(value, bool):
                raise bad("Unable to parse 'binary_data_output'")
            binary_default = value
        elif key != "headers" and not set_parameter(request, key, value):
            raise bad(f"Unable to parse '{clip(key)}'")

    specs = doc.get("inputs")
    if not isinstance(specs, list):
        raise bad("the inference request must have an 'inputs' array")
    offset = 0
    extensions: TensorExtensions | None = None  # made when a tensor uses one
    for spec in specs:
        if not isinstance(spec, dict):
            raise bad("each input must be a JSON object")
        name = spec.get("name")
        datatype = spec.get("datatype")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise bad("each input needs a string 'name' and 'datatype'")
        if name in inputs or (extensions is not None and name in extensions.inputs):
            raise bad(f"input '{clip(name)}' already exists in request")
        count = check_shape(name, spec.get("shape"))
        shape: list[int] = spec["shape"]
        if datatype not in NUMPY_DTYPES and datatype != "BF16":
            raise bad(f"input '{clip(name)}' has unknown datatype '{clip(datatype)}'")
        iparams = spec.get("parameters") or {}
        if not isinstance(iparams, dict):
            raise bad(f"input '{clip(name)}': 'parameters' must be a JSON object")
        if REGION_PARAM in iparams:
            if "data" in spec or "binary_data_size" in iparams:
                raise bad(f"input '{clip(name)}' has shared memory and data of its own")
            place = tensor_place(name, iparams)
            assert place is not None
            extensions = extensions if extensions is not None else TensorExtensions()
            extensions.inputs[name] = (datatype, shape, place)
        elif "binary_data_size" in iparams:
            size = iparams["binary_data_size"]
            if "data" in spec:
                raise bad(f"input '{clip(name)}' has both 'data' and 'binary_data_size'")
            if type(size) is not int or size < 0:
                raise bad(f"input '{clip(name)}': 'binary_data_size' must be a non-negative integer")
            if offset + size > len(tail):
                raise bad(
                    f"unexpected size for input '{clip(name)}', expecting {size} additional bytes for model "
                    f"'{clip(model)}'"
                )
            inputs[name] = tensor_from_raw(name, datatype, shape, tail[offset : offset + size])
            offset += size
        elif "data" in spec:
            inputs[name] = json_tensor(name, datatype, shape, count, spec["data"])
        else:
            raise bad(f"input '{clip(name)}' has no 'data' and no 'binary_data_size'")
    if offset != len(tail):
        raise bad(f"unexpected additional input data for model '{clip(model)}'")

    outputs = doc.get("outputs")
    if outputs is None or outputs == []:  # absent or []: every output
        if extensions is not None:
            return request, HttpReplyOptions(binary_default, None, extensions)
        return request, _ALL_BINARY if binary_default else _ALL_JSON
    if not isinstance(outputs, list):
        raise bad("'outputs' must be an array")
    binary: dict[str, bool | None] = {}
    for o in outputs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise bad("each requested output needs a string 'name'")
        oparams = o.get("parameters") or {}
        if not isinstance(oparams, dict):
            raise bad(f"output '{clip(o['name'])}': 'parameters' must be a JSON object")
        if oparams:
            extensions = _output_extensions(o["name"], oparams, extensions)
        flag = oparams.get("binary_data")
        if flag is not None and not isinstance(flag, bool):
            raise bad(f"output '{clip(o['name'])}': Unable to parse 'binary_data'")
        binary[o["name"]] = flag
    request.outputs = tuple(binary)
    return request, HttpReplyOptions(binary_default, binary, extensions or None)


def _output_extensions(
    name: str, params: dict[str, Any], extensions: TensorExtensions | None
) -> TensorExtensions | None:
    """A requested output's shared-memory place and class count, into ``extensions`` (made
    when the output uses one of them)."""
    place = tensor_place(name, params)
    count = class_count(name, params[CLASSIFICATION_PARAM]) if CLASSIFICATION_PARAM in params else 0
    if place is None and not count:
        return extensions
    extensions = extensions if extensions is not None else TensorExtensions()
    if place is not None:
        extensions.outputs[name] = place
    if count:
        extensions.classes[name] = count
    return extensions


def loads(raw: bytes | memoryview) -> Any:
    """The JSON header. orjson first (it refuses nesting deeper than 1024 and numbers beyond a
    double); the stdlib only for the NaN / Infinity tokens rapidjson clients may send, with
    the same refusals (no RecursionError, no 1e400 read as infinity)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        first = e
    data = bytes(raw)
    if b"NaN" not in data and b"Infinity" not in data:
        raise bad(f"failed to parse the request JSON: {first}") from None
    try:
        return json.loads(data, parse_float=_finite_float, parse_int=_int64_or_float)
    except RecursionError:
        raise bad("failed to parse the request JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"failed to parse the request JSON: {e}") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # a literal beyond a double ("Infinity" itself goes to parse_constant)
        raise ValueError(f"number {clip(text, 40)} is beyond a double")
    return value


def _int64_or_float(text: str) -> int | float:
    """Integers as orjson reads them: within [-2^63, 2^64) exactly, beyond as a double; and
    no 4300-digit conversions."""
    if len(text) > 40:
        raise ValueError(f"number {clip(text, 40)} is beyond a double")
    value = int(text)
    return value if -(2**63) <= value <= UINT64_MAX else _finite_float(text)


# The Python types a JSON tensor's elements may have, per datatype (bool is not a number).
_INTS = frozenset({int})
_NUMBERS = frozenset({int, float})
_JSON_TYPES = {
    **{d: _INTS for d in ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64")},
    **{d: _NUMBERS for d in ("FP16", "FP32", "FP64")},
    "BOOL": frozenset({bool}),
    "BYTES": frozenset({str}),
}


def json_tensor(name: str, datatype: str, shape: list[int], count: int, data: Any) -> np.ndarray:
    """An input's JSON ``data`` (flat or nested as the shape) as an array: the element count is
    checked against the shape before any array is made, each element's JSON type against the
    datatype, and each value against the datatype's range (no silent truncation, wrap-around
    or overflow to infinity)."""
    if datatype == "BF16":
        raise bad(
            f"receiving BF16 data via JSON is not supported. Please use the binary data format for input {clip(name)}"
        )
    dtype = NUMPY_DTYPES[datatype]
    flat = _flatten(data)
    if len(flat) != count:
        raise bad(f"Unable to parse 'data': Shape does not match true shape of 'data' field for input '{clip(name)}'")
    if not set(map(type, flat)) <= _JSON_TYPES[datatype]:
        what = {"BYTES": "strings", "BOOL": "booleans"}.get(datatype, "numbers")
        if dtype.kind in "iu":
            what = "integers"
        raise bad(f"Unable to parse 'data': expected {what} for {datatype} input '{clip(name)}'")
    try:
        if datatype == "BYTES":
            arr = np.empty(count, dtype=object)
            arr[:] = [v.encode() for v in flat]
        elif dtype.itemsize < 8 and dtype.kind == "f":
            wide = np.array(flat, np.float64)  # a Python int beyond a double raises here
            finite = wide[np.isfinite(wide)]
            if finite.size and np.abs(finite).max() > np.finfo(dtype).max:
                raise bad(f"Unable to parse 'data': a value of input '{clip(name)}' is out of range for {datatype}")
            arr = wide.astype(dtype)
        else:
            arr = np.array(flat, dtype=dtype)  # numpy refuses ints out of the dtype's range
    except (TypeError, ValueError, OverflowError) as e:
        raise bad(f"Unable to parse 'data' of input '{clip(name)}': {e}") from None
    return arr.reshape(shape)


def _flatten(data: Any) -> list[Any]:
    """Nested lists (as deep as JSON allows) to one list, without recursion."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


# ------------------------------------------------------------------------ response


def encode_response(
    result: InferResult, options: HttpReplyOptions, placed: dict[str, PlacedOutput] | None = None
) -> tuple[bytes, int | None]:
    """Return (body, json_length); json_length is None when no binary tail follows. ``placed``:
    the outputs written into shared memory, whose entries carry their place instead of data."""
    entries = []
    chunks: list[bytes] = []
    flags = options.binary
    for name, arr in result.outputs.items():
        binary = None if flags is None else flags.get(name)
        if binary is None:
            binary = options.binary_default
        entry: dict[str, Any] = {"name": name, "datatype": wire_datatype(arr), "shape": list(arr.shape)}
        if binary:
            raw = raw_bytes(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(name, arr)
        entries.append(entry)
    if placed:
        entries.extend(_placed_entry(name, out) for name, out in placed.items())
    doc: dict[str, Any] = {"model_name": result.model_name, "model_version": result.model_version, "outputs": entries}
    if result.id:
        doc["id"] = result.id
    if result.parameters:
        doc["parameters"] = result.parameters
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def _placed_entry(name: str, out: PlacedOutput) -> dict[str, Any]:
    params: dict[str, Any] = {"shared_memory_region": out.place.region, "shared_memory_byte_size": out.byte_size}
    if out.place.offset:
        params["shared_memory_offset"] = out.place.offset
    return {"name": name, "datatype": out.datatype, "shape": out.shape, "parameters": params}


def _json_data(name: str, arr: np.ndarray) -> Any:
    if arr.dtype.kind in "OSU":
        out = []
        for v in arr.reshape(-1):
            if isinstance(v, bytes):
                try:
                    out.append(v.decode())
                except UnicodeDecodeError:
                    raise bad(
                        f"output '{name}' holds bytes that are not valid UTF-8; request it as binary data"
                    ) from None
            else:
                out.append(str(v))
        return out
    return arr.reshape(-1)


# --------------------------------------------------------------------- compression
# (Request bodies are inflated, within the body limit, by ``limits.inflate``.)


@functools.lru_cache(maxsize=256)  # a client sends the same header with every request
def choose_encoding(accept: str) -> str | None:
    """Pick gzip or deflate from Accept-Encoding by weight (ties: first listed); never br."""
    best: tuple[float, int] | None = None
    choice: str | None = None
    for i, part in enumerate(accept.split(",")):
        token, _, params = part.strip().partition(";")
        token = token.strip().lower()
        if token not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        if q <= 0:
            continue
        if best is None or q > best[0]:
            best, choice = (q, i), token
    return None if choice in (None, "identity") else choice


def compress(body: bytes, encoding: str) -> bytes:
    """``body`` gzip'd or deflated (zlib format) at level 6, with a window and hash table sized
    to the body. zlib's defaults (32 KiB window, memLevel 8) allocate about 256 KiB of state per
    call, which glibc maps fresh each time: compressing a 150-byte infer reply that way cost
    ~160 us, against ~12 us with a 512-byte window. A window at least as large as the body finds
    every match the default would (the output is as small, give or take a few bytes); any
    inflater reads it."""
    bits = min(15, max(9, (len(body) - 1).bit_length()))  # zlib refuses a window under 2**9
    mem_level = min(8, bits - 6)  # its symbol buffer (2**(mem_level+6)) holds the body: one block
    c = zlib.compressobj(6, zlib.DEFLATED, bits + 16 if encoding == "gzip" else bits, mem_level)
    return c.compress(body) + c.flush()
