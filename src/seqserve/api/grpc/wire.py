"""ModelInferResponse / ModelStreamInferResponse written straight to protobuf's wire format.

The hot gRPC paths (ModelInfer, ModelStreamInfer) hand either gRPC server bytes instead of
messages: building an upb message field by field and serializing it costs about twice what
joining the encoded fields does, and the part that describes an output (name, datatype,
shape) is the same step after step, so it is encoded once per (name, dtype, shape) and reused.

The bytes decode to the same message that protobuf builds from the same result (the oracle in
tests/support/grpc_oracle.py; tests/unit/test_grpc_wire.py compares them field by field); only the
order of map entries, which protobuf leaves open, may differ. Outputs always go in
``raw_output_contents``, one entry per output: tritonclient reads nothing else. Fields are
written in field-number order, with proto3's rules: an empty string is left out, a oneof
member (``InferParameter``) and every element of a repeated field are always written.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from seqserve.api.kserve import raw_bytes, wire_datatype
from seqserve.engine import InferResult

#: field tags (field number << 3 | wire type 2, length-delimited), as single bytes
_MODEL_NAME = b"\x0a"  # ModelInferResponse.model_name = 1
_MODEL_VERSION = b"\x12"  # .model_version = 2
_ID = b"\x1a"  # .id = 3
_PARAMETERS = b"\x22"  # .parameters = 4 (map entries)
_OUTPUTS = b"\x2a"  # .outputs = 5
_RAW = b"\x32"  # .raw_output_contents = 6
_ENTRY_KEY = b"\x0a"  # map entry key = 1
_ENTRY_VALUE = b"\x12"  # map entry value = 2
_TENSOR_NAME = b"\x0a"  # InferOutputTensor.name = 1
_TENSOR_DATATYPE = b"\x12"  # .datatype = 2
_TENSOR_SHAPE = b"\x1a"  # .shape = 3 (packed int64)
_STREAM_ERROR = b"\x0a"  # ModelStreamInferResponse.error_message = 1
_STREAM_RESPONSE = b"\x12"  # .infer_response = 2

FINAL_KEY = "triton_final_response"

#: one-byte lengths, the common case, without a call
_SHORT = [bytes((n,)) for n in range(128)]


def varint(n: int) -> bytes:
    """A non-negative integer (below 2**64) as a protobuf varint."""
    if n < 0x80:
        return _SHORT[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: tag, length, bytes."""
    n = len(data)
    return tag + (_SHORT[n] if n < 0x80 else varint(n)) + data


def _string(tag: bytes, text: str) -> bytes:
    return _field(tag, text.encode()) if text else b""


def _parameter(key: str, value: Any) -> bytes:
    """One ``parameters`` map entry, its value typed as the oracle's ``set_param`` types it."""
    if isinstance(value, bool):
        body = b"\x08\x01" if value else b"\x08\x00"  # bool_param = 1
    elif isinstance(value, int):  # int64_param = 2; a uint64 beyond int64 keeps its bits
        body = b"\x10" + varint(value & 0xFFFFFFFFFFFFFFFF)
    elif isinstance(value, float):
        body = b"\x21" + struct.pack("<d", value)  # double_param = 4 (fixed64)
    else:
        body = _field(b"\x1a", str(value).encode())  # string_param = 3
    return _field(_PARAMETERS, _string(_ENTRY_KEY, key) + _field(_ENTRY_VALUE, body))


_FINAL = {True: _parameter(FINAL_KEY, True), False: _parameter(FINAL_KEY, False)}

#: (name, dtype, shape) -> the encoded ``outputs`` entry; bounded, as clients name the outputs
_OUTPUT_HEADS: dict[tuple[str, np.dtype[Any], tuple[int, ...]], bytes] = {}
_OUTPUT_HEADS_MAX = 4096


def _output_head(name: str, arr: np.ndarray) -> bytes:
    key = (name, arr.dtype, arr.shape)
    head = _OUTPUT_HEADS.get(key)
    if head is None:
        shape = b"".join([varint(d) for d in arr.shape])
        body = _string(_TENSOR_NAME, name) + _string(_TENSOR_DATATYPE, wire_datatype(arr))
        if shape:
            body += _field(_TENSOR_SHAPE, shape)
        head = _field(_OUTPUTS, body)
        if len(_OUTPUT_HEADS) >= _OUTPUT_HEADS_MAX:
            _OUTPUT_HEADS.clear()
        _OUTPUT_HEADS[key] = head
    return head


def _response_parts(result: InferResult, parts: list[bytes], final: bool | None) -> None:
    if result.model_name:
        parts.append(_field(_MODEL_NAME, result.model_name.encode()))
    if result.model_version:
        parts.append(_field(_MODEL_VERSION, result.model_version.encode()))
    if result.id:
        parts.append(_field(_ID, result.id.encode()))
    params = result.parameters
    if params:
        for key, value in params.items():
            if final is None or key != FINAL_KEY:  # the stream's flag replaces a parameter of its name
                parts.append(_parameter(key, value))
    if final is not None:
        parts.append(_FINAL[final])
    outputs = result.outputs
    if len(outputs) == 1:  # the common case: no second pass
        for name, arr in outputs.items():
            parts.append(_output_head(name, arr))
            data = raw_bytes(arr)
            n = len(data)
            parts.append(_RAW + (_SHORT[n] if n < 0x80 else varint(n)))
            parts.append(data)
        return
    raws = []
    for name, arr in outputs.items():
        parts.append(_output_head(name, arr))
        raws.append(raw_bytes(arr))
    for data in raws:
        n = len(data)
        parts.append(_RAW + (_SHORT[n] if n < 0x80 else varint(n)))
        parts.append(data)


def infer_response(result: InferResult) -> bytes:
    """A serialized ModelInferResponse: what the oracle's ``encode_response`` builds."""
    parts: list[bytes] = []
    _response_parts(result, parts, None)
    return b"".join(parts)


def stream_response(result: InferResult, final: bool) -> bytes:
    """A serialized ModelStreamInferResponse carrying ``result`` and ``triton_final_response``:
    what the oracle's ``stream_response`` builds."""
    parts: list[bytes] = []
    _response_parts(result, parts, final)
    body = b"".join(parts)
    n = len(body)
    return _STREAM_RESPONSE + (_SHORT[n] if n < 0x80 else varint(n)) + body


def stream_reply(request_id: str, model: str, version: str, final: bool | None, error: str = "") -> bytes:
    """A serialized ModelStreamInferResponse without outputs: an error (``error``) or a bare
    final flag, carrying the request's id, model and version (``final`` None: no flag)."""
    body = _string(_MODEL_NAME, model) + _string(_MODEL_VERSION, version) + _string(_ID, request_id)
    if final is not None:
        body += _FINAL[final]
    return _string(_STREAM_ERROR, error) + _field(_STREAM_RESPONSE, body)
