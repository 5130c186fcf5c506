"""api/grpc/wire.py's hand-encoded replies decode to the messages the oracle builds with
protobuf (tests/support/grpc_oracle.py); the servicer on raw bytes through both servers' tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.grpc import wire as grpc_wire
from seqserve.api.transport.grpc_context import CallAborted, Status
from seqserve.engine import Code, InferenceError, InferResult
from tests.support import grpc_oracle

_OUTPUTS: list[dict[str, np.ndarray]] = [
    {},
    {"OUTPUT": np.array([[3.5]], np.float32)},
    {"O": np.arange(1000, dtype=np.int64).reshape(10, 100)},  # lengths over one varint byte
    {"A": np.array(7, np.int8), "B": np.zeros((0, 3), np.float64), "": np.array([True, False])},
    {"TEXT": np.array([b"a", b"bc", "d\u00e9".encode()], dtype=object), "S": np.array(["x", "yz"])},
    {"\u00fcnicode name": np.ones((2, 2), np.float16), "U64": np.array([2**64 - 1], np.uint64)},
]

_PARAMETERS: list[dict[str, Any]] = [
    {},
    {"sequence_id": 42},
    {"flag": True, "off": False, "neg": -5, "big": 2**64 - 1, "min": -(2**63), "zero": 0},
    {"scale": 0.25, "nan": float("inf"), "s": "text", "empty": "", "\u00e9": "\u00fc"},
    {grpc_wire.FINAL_KEY: False, "x": 1},
]


def _result(outputs: dict[str, np.ndarray], parameters: dict[str, Any], rid: str = "r-1") -> InferResult:
    return InferResult("model", "3", rid, outputs, parameters)


@pytest.mark.parametrize("outputs", _OUTPUTS)
@pytest.mark.parametrize("parameters", _PARAMETERS)
def test_infer_response_matches_protobuf(outputs: dict[str, np.ndarray], parameters: dict[str, Any]) -> None:
    result = _result(outputs, parameters)
    ours = pb.ModelInferResponse.FromString(grpc_wire.infer_response(result))
    assert ours == grpc_oracle.encode_response(result)


@pytest.mark.parametrize("outputs", _OUTPUTS[:3])
@pytest.mark.parametrize("parameters", _PARAMETERS)
@pytest.mark.parametrize("final", [True, False])
def test_stream_response_matches_protobuf(
    outputs: dict[str, np.ndarray], parameters: dict[str, Any], final: bool
) -> None:
    result = _result(outputs, parameters)
    ours = pb.ModelStreamInferResponse.FromString(grpc_wire.stream_response(result, final))
    assert ours == grpc_oracle.stream_response(result, final)
    assert ours.infer_response.parameters[grpc_wire.FINAL_KEY].bool_param is final


def test_empty_strings_are_left_out_as_protobuf_does() -> None:
    result = InferResult("", "", "", {"OUTPUT": np.array([1], np.int32)})
    assert grpc_wire.infer_response(result) == grpc_oracle.encode_response(result).SerializeToString()


@pytest.mark.parametrize("final", [None, True, False])
@pytest.mark.parametrize("rid", ["", "req-2", "x" * 300])
def test_stream_reply_matches_protobuf(final: bool | None, rid: str) -> None:
    err = InferenceError(Code.NOT_FOUND, "Request for unknown model: 'x'")
    ours = pb.ModelStreamInferResponse.FromString(grpc_wire.stream_reply(rid, "x", "", final, err.message))
    assert ours == grpc_oracle.stream_error(rid, "x", "", err, final)
    assert ours.HasField("infer_response")
    if final:
        empty = pb.ModelStreamInferResponse.FromString(grpc_wire.stream_reply(rid, "m", "1", True))
        assert empty == grpc_oracle.stream_empty_final(rid, "m", "1")
        assert empty.error_message == ""


def test_varint() -> None:
    for n in (0, 1, 127, 128, 300, 2**31, 2**63, 2**64 - 1):
        msg = pb.InferParameter.FromString(b"\x28" + grpc_wire.varint(n))  # uint64_param = 5
        assert msg.uint64_param == n


def test_output_heads_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grpc_wire, "_OUTPUT_HEADS_MAX", 4)
    monkeypatch.setattr(grpc_wire, "_OUTPUT_HEADS", {})
    for i in range(10):
        result = InferResult("m", "", "", {f"O{i}": np.array([i], np.int32)})
        assert pb.ModelInferResponse.FromString(grpc_wire.infer_response(result)).outputs[0].name == f"O{i}"
        assert len(grpc_wire._OUTPUT_HEADS) <= 4


# ------------------------------------------------------------------ the servicer on raw bytes


class _Registry:
    """What add_service needs of a grpc.aio.Server; a registered method fails the test."""

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic = handlers[0]

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        raise AssertionError(f"registered methods cost every call an asyncio.wait: {sorted(handlers)}")


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.metadata = metadata

    def peer(self) -> str:
        return "test"

    async def read(self) -> Any:
        return None


def test_every_rpc_is_served_by_the_generic_handler_and_the_hot_ones_take_bytes() -> None:
    from seqserve.api.grpc import aio
    from seqserve.api.grpc.serve import INFERENCE_SERVICE, method_table
    from seqserve.api.grpc.servicer import RAW_RPCS, HealthServicer, InferenceServicer

    registry = _Registry()
    service = INFERENCE_SERVICE
    aio.add_service(registry, service, method_table(InferenceServicer(None), HealthServicer(None)))  # type: ignore[arg-type]
    assert {"ModelInfer", "ModelStreamInfer"} == RAW_RPCS
    for method in service.methods:
        details = type("D", (), {"method": f"/{service.full_name}/{method.name}", "invocation_metadata": ()})()
        handler = registry.generic.service(details)
        assert handler is not None, method.name
        raw = method.name in RAW_RPCS
        assert (handler.request_deserializer is None) == raw, method.name
        assert (handler.response_serializer is None) == raw, method.name


async def test_model_infer_on_bytes() -> None:
    import asyncio

    from seqserve.api.grpc.servicer import InferenceServicer

    seen: list[Any] = []

    class Server:
        def enqueue(self, request: Any) -> asyncio.Future[InferResult]:
            seen.append(request)
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(InferResult(request.model, "1", request.id, {"OUT": np.array([[2.0]], np.float32)}))
            return fut

    servicer = InferenceServicer(Server())  # type: ignore[arg-type]
    req = pb.ModelInferRequest(model_name="m", id="r1")
    req.inputs.add(name="IN", datatype="FP32", shape=[1, 1])
    req.raw_input_contents.append(np.float32(1.5).tobytes())
    for request in (req.SerializeToString(), req):  # as grpcio hands it, or called directly
        reply = pb.ModelInferResponse.FromString(await servicer.ModelInfer(request, _Context()))
        assert (reply.id, reply.model_name, reply.outputs[0].name) == ("r1", "m", "OUT")
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [2.0]
    assert seen[0].inputs["IN"].tolist() == [[1.5]]
    with pytest.raises(CallAborted) as aborted:
        await servicer.ModelInfer(b"\xff\xff\xff", _Context())
    assert aborted.value.status == Status.INVALID_ARGUMENT
    assert aborted.value.details.startswith("failed to parse the ModelInferRequest message")
