"""KServe v2 wire formats <-> the engine's numpy tensors.

HTTP: the JSON header, the binary tensor data extension (both directions), BYTES
serialization and body compression. gRPC: ModelInferRequest / ModelInferResponse. Kept free of
framework objects so both front-ends and the tests share it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from seqserve.engine import InferRequest, InferResult, Server, _core
from seqserve.engine.errors import Code, DecoupledModelError, InferenceError
from seqserve.engine.responses import ResponseCallback
from seqserve.engine.tensors import numpy_wire_name

# Protocol datatype -> numpy dtype (BYTES are object arrays of bytes; BF16 has no numpy type).
NP_DTYPE: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

RESERVED_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}
)


def wire_datatype(arr: np.ndarray) -> str:
    return numpy_wire_name(arr.dtype)


def bad(msg: str) -> InferenceError:
    return InferenceError(Code.INVALID_ARG, msg)


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ------------------------------------------------------------------------- request


@dataclass(slots=True)
class Request:
    """A decoded inference request, independent of the transport."""

    id: str = ""
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    #: requested outputs: name -> wants binary (None: not said); empty = all outputs
    outputs: dict[str, bool | None] = field(default_factory=dict)
    binary_output: bool = False
    sequence_id: int | str = 0
    sequence_start: bool = False
    sequence_end: bool = False
    priority: int = 0
    timeout_us: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)


def to_engine(req: Request, model: str, version: str) -> InferRequest:
    """The engine's request for a decoded one."""
    return InferRequest(
        model,
        req.inputs,
        version,
        req.id,
        req.sequence_id,
        req.sequence_start,
        req.sequence_end,
        tuple(req.outputs),
        req.priority,
        req.timeout_us,
        req.parameters,
    )


def submit(server: Server, model: str, version: str | int, req: Request, endpoint: str) -> asyncio.Future[InferResult]:
    """Queue a decoded single-response request on the engine (both front-ends go through
    here). ``endpoint`` names the caller in Triton's refusal of decoupled models."""
    try:
        return server.enqueue(to_engine(req, model, str(version)))
    except DecoupledModelError:
        raise InferenceError(
            Code.UNSUPPORTED, f"{endpoint} doesn't support models with decoupled transaction policy"
        ) from None


def submit_streaming(
    server: Server, model: str, version: str | int, req: Request, on_response: ResponseCallback
) -> Callable[[], None]:
    """Queue a decoded request whose responses (one, or many from decoupled models) go to
    ``on_response``; returns its ``cancel()``."""
    return server.enqueue_streaming(to_engine(req, model, str(version)), on_response)


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


def _loads(raw: bytes | memoryview) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # rapidjson clients may send NaN / Infinity tokens, which only the stdlib accepts.
        try:
            return json.loads(bytes(raw))
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"failed to parse the request JSON: {e}") from None


def _sequence_id(value: Any) -> int | str:
    # A JSON number is a uint64 id, a JSON string a string id ("42" is not 42).
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise bad("Unable to parse 'sequence_id'")
    if isinstance(value, int) and not 0 <= value < 2**64:
        raise bad("Unable to parse 'sequence_id'")
    return value


def _flag(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise bad(f"Unable to parse '{key}'")
    return value


def apply_parameters(req: Request, params: dict[str, Any]) -> None:
    """Sequence and scheduling parameters (shared by HTTP JSON and decoded gRPC maps)."""
    for key, value in params.items():
        if key == "sequence_id":
            req.sequence_id = _sequence_id(value)
        elif key in ("sequence_start", "sequence_end"):
            setattr(req, key, _flag(params, key))
        elif key == "priority":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad("Unable to parse 'priority'")
            req.priority = value
        elif key == "timeout":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad("Unable to parse 'timeout'")
            req.timeout_us = value
        elif key == "binary_data_output":
            if not isinstance(value, bool):
                raise bad("Unable to parse 'binary_data_output'")
            req.binary_output = value
        elif key != "headers":
            req.parameters[key] = value


def _json_tensor(name: str, datatype: str, shape: list[int], data: Any) -> np.ndarray:
    if datatype == "BF16":
        raise bad(f"receiving BF16 data via JSON is not supported. Please use the binary data format for input {name}")
    dtype = NP_DTYPE[datatype]
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


def binary_tensor(name: str, datatype: str, shape: list[int], chunk: memoryview) -> np.ndarray:
    if datatype == "BYTES":
        try:
            return _core.deserialize_bytes(chunk, list(shape))
        except ValueError as e:
            raise bad(f"input '{name}': {e}") from None
    dtype = NP_DTYPE.get(datatype)
    if dtype is None:
        if datatype == "BF16":
            raise InferenceError(Code.UNSUPPORTED, f"input '{name}': BF16 tensors are not supported")
        raise bad(f"input '{name}' has unknown datatype '{datatype}'")
    want = element_count(shape) * dtype.itemsize
    if len(chunk) != want:
        raise bad(f"unexpected size for input '{name}', expecting {want} bytes but got {len(chunk)}")
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def parse_http_request(body: bytes, header_length: int | None, model: str) -> Request:
    """Split JSON header and binary tail (by Inference-Header-Content-Length) and decode."""
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
    req = Request()
    rid = doc.get("id", "")
    req.id = rid if isinstance(rid, str) else str(rid)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad("'parameters' must be a JSON object")
    apply_parameters(req, params)

    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise bad("the inference request must have an 'inputs' array")
    offset = 0
    for spec in inputs:
        if not isinstance(spec, dict):
            raise bad("each input must be a JSON object")
        name = spec.get("name")
        datatype = spec.get("datatype")
        shape = spec.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise bad("each input needs a string 'name' and 'datatype'")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise bad(f"input '{name}' needs a 'shape' of non-negative integers")
        if datatype not in NP_DTYPE and datatype != "BF16":
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
            req.inputs[name] = binary_tensor(name, datatype, shape, tail[offset : offset + size])
            offset += size
        elif "data" in spec:
            req.inputs[name] = _json_tensor(name, datatype, shape, spec["data"])
        else:
            raise bad(f"input '{name}' has no 'data' and no 'binary_data_size'")
    if offset != len(tail):
        raise bad(f"unexpected additional input data for model '{model}'")

    outputs = doc.get("outputs")
    if outputs:
        if not isinstance(outputs, list):
            raise bad("'outputs' must be an array")
        for o in outputs:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise bad("each requested output needs a string 'name'")
            oparams = o.get("parameters") or {}
            if "shared_memory_region" in oparams:
                raise InferenceError(Code.UNSUPPORTED, f"output '{o['name']}': shared memory outputs are not supported")
            binary = oparams.get("binary_data")
            req.outputs[o["name"]] = binary if isinstance(binary, bool) else None
    return req


# ------------------------------------------------------------------------ response


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


def raw_bytes(arr: np.ndarray) -> bytes:
    if arr.dtype.kind in "OSU":
        return _core.serialize_bytes(arr)
    return arr.tobytes()


def encode_http_response(
    model: str,
    version: str,
    request_id: str,
    outputs: dict[str, np.ndarray],
    requested: dict[str, bool | None],
    binary_default: bool,
    parameters: dict[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """Return (body, json_length); json_length is None when no binary tail follows."""
    entries = []
    chunks: list[bytes] = []
    for name, arr in outputs.items():
        binary = requested.get(name)
        if binary is None:
            binary = binary_default
        entry: dict[str, Any] = {"name": name, "datatype": wire_datatype(arr), "shape": list(arr.shape)}
        if binary:
            raw = raw_bytes(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(name, arr)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": entries}
    if request_id:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


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
