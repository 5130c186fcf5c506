"""KServe v2 over HTTP: the JSON inference request and response, the binary tensor data
extension (both directions), and body compression.

``decode_request`` builds the engine's ``InferRequest`` directly from the body; how the reply
is to carry each output (binary or JSON data) is HTTP's own business and comes back beside
it in an ``HttpReplyOptions``, which ``encode_response`` reads. Kept free of framework
objects: the HTTP front-end (``http.py``) owns headers, status codes and routing.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from seqserve.api.kserve import (
    NUMPY_DTYPES,
    bad,
    element_count,
    raw_bytes,
    set_parameter,
    tensor_from_raw,
    wire_datatype,
)
from seqserve.engine import Code, InferenceError, InferRequest, InferResult


@dataclass(frozen=True, slots=True)
class HttpReplyOptions:
    """How the reply to one request encodes its outputs."""

    binary_default: bool  # the request's binary_data_output
    #: requested outputs -> their binary_data flag (None: not said, binary_default applies);
    #: None when the request named no outputs
    binary: dict[str, bool | None] | None = None


# Requests that name no outputs share these (no object per request).
_ALL_JSON = HttpReplyOptions(False)
_ALL_BINARY = HttpReplyOptions(True)


# ------------------------------------------------------------------------- request


def decode_request(
    body: bytes, header_length: int | None, model: str, version: str
) -> tuple[InferRequest, HttpReplyOptions]:
    """Split the JSON header from the binary tail (by Inference-Header-Content-Length) and
    decode both into one engine request for ``model`` / ``version`` (from the URL)."""
    view = memoryview(body)
    if header_length is None:
        head, tail = view, view[len(view) :]
    else:
        if not 0 <= header_length <= len(body):
            raise bad(
                f"Inference-Header-Content-Length {header_length} is out of range for a body of {len(body)} bytes"
            )
        head, tail = view[:header_length], view[header_length:]
    doc = _loads(head)
    if not isinstance(doc, dict):
        raise bad("the inference request must be a JSON object")
    rid = doc.get("id", "")
    inputs: dict[str, np.ndarray] = {}
    request = InferRequest(model, inputs, version, rid if isinstance(rid, str) else str(rid))
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
            raise bad(f"Unable to parse '{key}'")

    specs = doc.get("inputs")
    if not isinstance(specs, list):
        raise bad("the inference request must have an 'inputs' array")
    offset = 0
    for spec in specs:
        if not isinstance(spec, dict):
            raise bad("each input must be a JSON object")
        name = spec.get("name")
        datatype = spec.get("datatype")
        shape = spec.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise bad("each input needs a string 'name' and 'datatype'")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise bad(f"input '{name}' needs a 'shape' of non-negative integers")
        if datatype not in NUMPY_DTYPES and datatype != "BF16":
            raise bad(f"input '{name}' has unknown datatype '{datatype}'")
        iparams = spec.get("parameters") or {}
        if "shared_memory_region" in iparams:
            raise InferenceError(Code.UNSUPPORTED, f"input '{name}': shared memory inputs are not supported")
        size = iparams.get("binary_data_size")
        if size is not None:
            if "data" in spec:
                raise bad(f"input '{name}' has both 'data' and 'binary_data_size'")
            if not isinstance(size, int) or size < 0:
                raise bad(f"input '{name}': 'binary_data_size' must be a non-negative integer")
            if offset + size > len(tail):
                raise bad(f"unexpected size for input '{name}', expecting {size} additional bytes for model '{model}'")
            inputs[name] = tensor_from_raw(name, datatype, shape, tail[offset : offset + size])
            offset += size
        elif "data" in spec:
            inputs[name] = _json_tensor(name, datatype, shape, spec["data"])
        else:
            raise bad(f"input '{name}' has no 'data' and no 'binary_data_size'")
    if offset != len(tail):
        raise bad(f"unexpected additional input data for model '{model}'")

    outputs = doc.get("outputs")
    if not outputs:  # absent or []: every output
        return request, _ALL_BINARY if binary_default else _ALL_JSON
    if not isinstance(outputs, list):
        raise bad("'outputs' must be an array")
    binary: dict[str, bool | None] = {}
    for o in outputs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise bad("each requested output needs a string 'name'")
        oparams = o.get("parameters") or {}
        if "shared_memory_region" in oparams:
            raise InferenceError(Code.UNSUPPORTED, f"output '{o['name']}': shared memory outputs are not supported")
        flag = oparams.get("binary_data")
        binary[o["name"]] = flag if isinstance(flag, bool) else None
    request.outputs = tuple(binary)
    return request, HttpReplyOptions(binary_default, binary)


def _loads(raw: bytes | memoryview) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # rapidjson clients may send NaN / Infinity tokens, which only the stdlib accepts.
        try:
            return json.loads(bytes(raw))
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"failed to parse the request JSON: {e}") from None


def _json_tensor(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    if datatype == "BF16":
        raise bad(f"receiving BF16 data via JSON is not supported. Please use the binary data format for input {name}")
    dtype = NUMPY_DTYPES[datatype]
    try:
        if datatype == "BYTES":
            flat = _flatten(data)
            arr = np.empty(len(flat), dtype=object)
            for i, v in enumerate(flat):
                if not isinstance(v, str):
                    raise bad(f"Unable to parse 'data': expected a string for BYTES input '{name}'")
                arr[i] = v.encode()
        elif datatype == "BOOL":
            flat = _flatten(data)
            if not all(isinstance(v, bool) for v in flat):
                raise bad(f"Unable to parse 'data': expected booleans for BOOL input '{name}'")
            arr = np.array(flat, dtype=dtype)
        else:
            arr = np.array(data, dtype=dtype).reshape(-1)
    except (TypeError, ValueError, OverflowError) as e:
        raise bad(f"Unable to parse 'data' of input '{name}': {e}") from None
    if arr.size != element_count(shape):
        raise bad(f"Unable to parse 'data': Shape does not match true shape of 'data' field for input '{name}'")
    return arr.reshape(shape)


def _flatten(data: Any) -> list[Any]:
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


def encode_response(result: InferResult, options: HttpReplyOptions) -> tuple[bytes, int | None]:
    """Return (body, json_length); json_length is None when no binary tail follows."""
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
    doc: dict[str, Any] = {"model_name": result.model_name, "model_version": result.model_version, "outputs": entries}
    if result.id:
        doc["id"] = result.id
    if result.parameters:
        doc["parameters"] = result.parameters
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


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


def decompress(body: bytes, encoding: str) -> bytes:
    """Undo a request Content-Encoding. 'deflate' is zlib-wrapped (RFC 1950), as clients send it."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc not in ("gzip", "deflate"):
        raise InferenceError(Code.UNSUPPORTED, "Unsupported compression type")
    try:
        return zlib.decompress(body, 47)  # 32 + 15: detect gzip or zlib header
    except zlib.error as e:
        raise bad(f"failed to decompress the request body ({enc}): {e}") from None


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
    return gzip.compress(body, compresslevel=6) if encoding == "gzip" else zlib.compress(body)
