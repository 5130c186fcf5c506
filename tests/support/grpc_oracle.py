"""The oracle for ``api/grpc/wire.py``: the same replies built field by field with protobuf's
own classes (slow, obviously right), which the hand-encoded bytes must decode to."""

from __future__ import annotations

from typing import Any

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.kserve import raw_bytes, wire_datatype
from seqserve.engine import InferenceError, InferResult


def encode_response(result: InferResult) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name=result.model_name, model_version=result.model_version, id=result.id)
    raw = resp.raw_output_contents
    for name, arr in result.outputs.items():
        resp.outputs.add(name=name, datatype=wire_datatype(arr), shape=arr.shape)
        raw.append(raw_bytes(arr))
    for key, value in result.parameters.items():
        set_param(resp.parameters[key], value)
    return resp


def set_param(p: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value if value < 2**63 else value - 2**64
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def stream_response(result: InferResult, final: bool) -> pb.ModelStreamInferResponse:
    """One response on the stream; every one carries ``triton_final_response``."""
    resp = encode_response(result)
    resp.parameters["triton_final_response"].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=resp)


def stream_empty_final(request_id: str, model: str, version: str) -> pb.ModelStreamInferResponse:
    """A final flag that came without a response, for a request that set ``EMPTY_FINAL``."""
    resp = pb.ModelInferResponse(id=request_id, model_name=model, model_version=version)
    resp.parameters["triton_final_response"].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=resp)


def stream_error(
    request_id: str, model: str, version: str, err: InferenceError, final: bool | None = None
) -> pb.ModelStreamInferResponse:
    """An error on the stream (the stream stays open); ``final`` (for errors a model sent)
    marks whether the request is over, as on every response."""
    resp = pb.ModelInferResponse(id=request_id, model_name=model, model_version=version)
    if final is not None:
        resp.parameters["triton_final_response"].bool_param = final
    return pb.ModelStreamInferResponse(error_message=err.message, infer_response=resp)
