"""KServe v2 over gRPC, the request side: ModelInferRequest -> the engine's InferRequest (the
replies are written by ``wire``, without building messages).

``decode_request`` builds the ``InferRequest`` directly from the message; the one option that
belongs to the gRPC stream alone (``triton_enable_empty_final_response``) comes back beside it
in a ``GrpcReplyOptions``. Inputs arrive in ``raw_input_contents`` (tritonclient) or, from other
KServe clients, in typed ``contents``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.classification import CLASSIFICATION_PARAM, class_count
from seqserve.api.kserve import (
    MAX_RANK,
    NUMPY_DTYPES,
    bad,
    check_shape,
    clip,
    element_count,
    set_parameter,
    tensor_from_raw,
)
from seqserve.api.limits import OFFLOAD_BYTES
from seqserve.api.shared_memory import REGION_PARAM, tensor_place
from seqserve.api.tensor_extensions import TensorExtensions
from seqserve.engine import Code, InferenceError, InferRequest

EMPTY_FINAL = "triton_enable_empty_final_response"


@dataclass(frozen=True, slots=True)
class GrpcReplyOptions:
    """What a request asks of its replies on a stream."""

    empty_final: bool  # triton_enable_empty_final_response: a bare final flag is written as an empty response
    #: shared-memory tensors and class counts (None: the request uses neither)
    extensions: TensorExtensions | None = None


# Shared by every request (no object per request).
_PLAIN = GrpcReplyOptions(False)
_EMPTY_FINAL = GrpcReplyOptions(True)

# The parameter variant each scheduling parameter must use, in Triton's error message.
_EXPECTED = {
    "sequence_id": "int64_param or string_param",
    "sequence_start": "bool_param",
    "sequence_end": "bool_param",
    "priority": "uint64_param",
    "timeout": "int64_param",
}

# Typed InferTensorContents field per datatype (the wire names of engine.tensors), for KServe
# clients that do not send raw bytes. FP16 and BF16 have none.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# ------------------------------------------------------------------------- request


class Undecodable:
    """What the front-end's deserializer hands on for bytes that are not a valid message
    (protobuf's DecodeError): the rpc answers INVALID_ARGUMENT, a stream an error reply,
    instead of grpcio's UNKNOWN or a stream that goes silent."""

    __slots__ = ("message",)

    def __init__(self, message_type: str, error: BaseException) -> None:
        self.message = f"failed to parse the {message_type} message: {clip(str(error), 200) or type(error).__name__}"

    def error(self) -> InferenceError:
        return bad(self.message)


def safe_deserializer(message_class: Any) -> Callable[[bytes], Any]:
    """``message_class.FromString``, with undecodable bytes turned into an ``Undecodable``."""
    parse = message_class.FromString
    name = message_class.DESCRIPTOR.name

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as e:  # DecodeError, and whatever else the parser refuses with
            return Undecodable(name, e)

    return deserialize


#: a ModelInferRequest from its serialized bytes (the hot rpcs get bytes: ``servicer.RAW_RPCS``)
parse_infer_request: Callable[[bytes], pb.ModelInferRequest | Undecodable] = safe_deserializer(pb.ModelInferRequest)


class DecodeOffLoop(Exception):
    """Raised by ``decode_request(msg, inline=True)`` for a message whose decoding grows with
    its size past ``OFFLOAD_BYTES``: over that much BYTES data (one object per element) or typed
    contents (one Python value per element). The caller decodes it again off the event loop.
    Raw fixed-size tensors are zero-copy views and never are."""


def decode_request(msg: pb.ModelInferRequest, *, inline: bool = False) -> tuple[InferRequest, GrpcReplyOptions]:
    """One engine request from the message: parameters, then inputs (``raw_input_contents``
    belong, in order, to the inputs; without them, typed ``contents``), then outputs. With
    ``inline``, DecodeOffLoop instead of a long decode."""
    inputs: dict[str, np.ndarray] = {}
    request = InferRequest(msg.model_name, inputs, msg.model_version, msg.id)
    options = _PLAIN
    params = msg.parameters
    for key in params:
        p = params[key]
        kind = p.WhichOneof("parameter_choice")
        value: Any = None if kind is None else getattr(p, kind)
        if key not in _EXPECTED:  # typed protobuf values are in range: kept as they are
            if key == EMPTY_FINAL:
                options = _EMPTY_FINAL if value is True else _PLAIN
            else:
                request.parameters[key] = value
            continue
        if kind == "int64_param" and key == "sequence_id":
            value &= 0xFFFFFFFFFFFFFFFF  # the int64 carries a uint64's bits
        if not set_parameter(request, key, value):
            raise bad(f"invalid value type for '{key}' parameter, expected {_EXPECTED[key]}.")

    raw = msg.raw_input_contents
    specs: Any = msg.inputs
    extensions = None
    if any(t.parameters for t in specs):
        extensions = TensorExtensions()
        specs = _place_inputs(specs, extensions)  # the rest, which raw_input_contents belong to
    if raw:
        if len(raw) > len(specs):
            raise bad(f"unexpected additional input data for model '{clip(msg.model_name)}'")
        if len(raw) < len(specs):
            raise bad(f"expected raw_input_contents for input '{clip(specs[len(raw)].name)}'")
        for t, data in zip(specs, raw, strict=True):
            if t.name in inputs:
                raise bad(f"input '{clip(t.name)}' already exists in request")
            inputs[t.name] = _raw_input(t, data, inline)
    else:
        for t in specs:
            if t.name in inputs or (extensions is not None and t.name in extensions.inputs):
                raise bad(f"input '{clip(t.name)}' already exists in request")
            _check_input(t)
            inputs[t.name] = _typed_contents(t, list(t.shape), inline)
    if msg.outputs:
        requested: dict[str, None] = {}
        for o in msg.outputs:
            if o.parameters:
                extensions = extensions if extensions is not None else TensorExtensions()
                _output_extensions(o, extensions)
            requested[o.name] = None
        request.outputs = tuple(requested)
    if extensions:
        return request, GrpcReplyOptions(options.empty_final, extensions)
    return request, options


def parameter_values(params: Any) -> dict[str, Any]:
    """A protobuf ``parameters`` map as plain values (whichever member of the oneof is set)."""
    out = {}
    for key in params:
        p = params[key]
        kind = p.WhichOneof("parameter_choice")
        out[key] = None if kind is None else getattr(p, kind)
    return out


def _place_inputs(specs: Any, extensions: TensorExtensions) -> list[Any]:
    """The inputs placed in shared memory, into ``extensions``; the others, in order."""
    rest = []
    for t in specs:
        params = parameter_values(t.parameters) if t.parameters else {}
        if REGION_PARAM not in params:
            rest.append(t)
            continue
        if t.name in extensions.inputs:
            raise bad(f"input '{clip(t.name)}' already exists in request")
        if t.HasField("contents"):
            raise bad(f"input '{clip(t.name)}' has shared memory and contents of its own")
        _check_input(t)
        place = tensor_place(t.name, params)
        assert place is not None
        extensions.inputs[t.name] = (t.datatype, list(t.shape), place)
    return rest


def _output_extensions(o: pb.ModelInferRequest.InferRequestedOutputTensor, extensions: TensorExtensions) -> None:
    params = parameter_values(o.parameters)
    place = tensor_place(o.name, params)
    if place is not None:
        extensions.outputs[o.name] = place
    if CLASSIFICATION_PARAM in params:
        count = class_count(o.name, params[CLASSIFICATION_PARAM])
        if count:
            extensions.classes[o.name] = count


def _check_input(t: pb.ModelInferRequest.InferInputTensor) -> int:
    """Refusals that do not depend on the data; returns the shape's element count."""
    if t.datatype not in NUMPY_DTYPES:
        if t.datatype == "BF16":
            raise InferenceError(Code.UNSUPPORTED, f"input '{clip(t.name)}': BF16 tensors are not supported")
        raise bad(f"input '{clip(t.name)}' has unknown datatype '{clip(t.datatype)}'")
    return check_shape(t.name, list(t.shape))


def _raw_input(t: pb.ModelInferRequest.InferInputTensor, data: bytes, inline: bool) -> np.ndarray:
    """One raw_input_contents entry as an array (a zero-copy view for fixed-size types)."""
    if t.HasField("contents"):
        raise bad("contents field must not be specified when using raw_input_contents")
    dtype = NUMPY_DTYPES.get(t.datatype)
    if dtype is None or dtype.kind == "O" or t.parameters:
        _check_input(t)
        if inline and dtype is not None and dtype.kind == "O" and len(data) > OFFLOAD_BYTES:
            raise DecodeOffLoop
        return tensor_from_raw(t.name, t.datatype, list(t.shape), memoryview(data))
    shape = tuple(t.shape)
    if len(shape) > MAX_RANK:
        check_shape(t.name, list(shape))  # raises
    count = 1
    for d in shape:
        if d < 0:
            raise bad(f"input '{clip(t.name)}' has a negative dimension in shape {clip(str(list(shape)))}")
        count *= d
    if len(data) != count * dtype.itemsize:
        raise bad(
            f"unexpected size for input '{clip(t.name)}', expecting {count * dtype.itemsize} bytes but got {len(data)}"
        )
    if not count:  # an empty tensor: its other dimensions must still be countable
        check_shape(t.name, list(shape))
    return np.frombuffer(data, dtype).reshape(shape)


def _typed_contents(t: pb.ModelInferRequest.InferInputTensor, shape: list[int], inline: bool) -> np.ndarray:
    field = _CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise bad(f"input '{clip(t.name)}': datatype {t.datatype} must be sent in raw_input_contents")
    values = getattr(t.contents, field)
    if len(values) != element_count(shape):  # before anything is allocated
        raise bad(f"unexpected number of elements in the contents of input '{clip(t.name)}'")
    if inline and len(values) * 8 > OFFLOAD_BYTES:
        raise DecodeOffLoop
    if t.datatype == "BYTES":
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
    else:
        try:
            arr = np.array(values, dtype=NUMPY_DTYPES[t.datatype])
        except OverflowError as e:  # e.g. int_contents beyond INT8
            raise bad(f"input '{clip(t.name)}': {e}") from None
    return arr.reshape(shape)
