"""grpc_wire's hand-encoded replies decode to the messages grpc_codec builds with protobuf."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api import grpc_codec, grpc_wire
from seqserve.engine import Code, InferenceError, InferResult

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
    assert ours == grpc_codec.encode_response(result)


@pytest.mark.parametrize("outputs", _OUTPUTS[:3])
@pytest.mark.parametrize("parameters", _PARAMETERS)
@pytest.mark.parametrize("final", [True, False])
def test_stream_response_matches_protobuf(
    outputs: dict[str, np.ndarray], parameters: dict[str, Any], final: bool
) -> None:
    result = _result(outputs, parameters)
    ours = pb.ModelStreamInferResponse.FromString(grpc_wire.stream_response(result, final))
    assert ours == grpc_codec.stream_response(result, final)
    assert ours.infer_response.parameters[grpc_wire.FINAL_KEY].bool_param is final


def test_empty_strings_are_left_out_as_protobuf_does() -> None:
    result = InferResult("", "", "", {"OUTPUT": np.array([1], np.int32)})
    assert grpc_wire.infer_response(result) == grpc_codec.encode_response(result).SerializeToString()


@pytest.mark.parametrize("final", [None, True, False])
@pytest.mark.parametrize("rid", ["", "req-2", "x" * 300])
def test_stream_reply_matches_protobuf(final: bool | None, rid: str) -> None:
    err = InferenceError(Code.NOT_FOUND, "Request for unknown model: 'x'")
    ours = pb.ModelStreamInferResponse.FromString(grpc_wire.stream_reply(rid, "x", "", final, err.message))
    assert ours == grpc_codec.stream_error(rid, "x", "", err, final)
    assert ours.HasField("infer_response")
    if final:
        empty = pb.ModelStreamInferResponse.FromString(grpc_wire.stream_reply(rid, "m", "1", True))
        assert empty == grpc_codec.stream_empty_final(rid, "m", "1")
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
