"""The generate extension's JSON (api/http/generate_json.py): fields to inputs shaped as Triton
shapes them, the rest to parameters, sequence parameters onto the request, the response object
and its server-sent event, and clear 400s for what cannot be an input or a parameter."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from seqserve.api.http.generate_json import decode_generate, encode_generate, sse_event
from seqserve.engine import Code, InferenceError, InferResult

INPUTS = [
    {"name": "X", "datatype": "FP32", "shape": [-1, 4]},
    {"name": "N", "datatype": "INT32", "shape": [1]},
    {"name": "TEXT", "datatype": "BYTES", "shape": [-1, -1]},
]


def decode(doc: Any) -> Any:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return decode_generate(body, INPUTS, "m", "")


def test_fields_become_inputs_shaped_as_triton_shapes_them() -> None:
    req = decode({"X": [1, 2, 3, 4, 5, 6, 7, 8], "N": 3, "TEXT": "hi"})
    assert req.inputs["X"].shape == (2, 4) and req.inputs["X"].dtype == np.float32
    assert req.inputs["N"].tolist() == [3] and req.inputs["N"].dtype == np.int32
    assert req.inputs["TEXT"].shape == (1, 1) and req.inputs["TEXT"][0, 0] == b"hi"


def test_other_fields_and_nested_parameters() -> None:
    req = decode(
        {
            "id": "r1",
            "N": 1,
            "temperature": 0.5,
            "parameters": {"X": [0, 0, 0, 0], "sequence_id": 7, "sequence_start": True, "stream": False},
            "sequence_end": True,
        }
    )
    assert req.id == "r1" and set(req.inputs) == {"N", "X"}
    assert (req.sequence_id, req.sequence_start, req.sequence_end) == (7, True, True)
    assert req.parameters == {"temperature": 0.5, "stream": False}
    assert decode({"N": 1, "sequence_id": "abc"}).sequence_id == "abc"


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (b"{", "failed to parse the request JSON"),
        (b"7", "must be a JSON object"),
        ({"X": [1, 2, 3]}, "can not convert input 'X'"),
        ({"N": [1, 2]}, "can not convert input 'N'"),
        ({"N": [[1]]}, "flat array"),
        ({"N": None}, "flat array"),
        ({"N": 1.5}, "expected integers"),
        ({"N": 2**40}, "out of bounds for int32"),
        ({"N": 1, "sequence_start": 1}, "'sequence_start'"),
        ({"N": 1, "sequence_id": -1}, "'sequence_id'"),
        ({"N": 1, "extra": [1]}, "'extra'"),
        ({"N": 1, "parameters": [1]}, "Expected JSON object"),
        ({"N": 1, "parameters": {"N": 2}}, "given twice"),
        ({"N": 1, "id": 3}, "'id'"),
    ],
)
def test_bad_requests(doc: Any, fragment: str) -> None:
    with pytest.raises(InferenceError) as ei:
        decode(doc)
    assert ei.value.code is Code.INVALID_ARG and fragment in ei.value.message, ei.value.message


def test_parameters_named_as_an_input_is_refused() -> None:
    with pytest.raises(InferenceError, match="nested schema"):
        decode_generate(b"{}", [{"name": "parameters", "datatype": "INT32", "shape": [1]}], "m", "")


def test_response_object_and_event() -> None:
    result = InferResult(
        "m",
        "1",
        "r1",
        {"ONE": np.array([[3]], np.int32), "MANY": np.array([1.5, 2.5], np.float32), "S": np.array([b"ok"], object)},
        {"sequence_id": 9},
    )
    doc = encode_generate(result)
    assert doc == {
        "id": "r1",
        "model_name": "m",
        "model_version": "1",
        "sequence_id": 9,
        "ONE": 3,
        "MANY": [1.5, 2.5],
        "S": "ok",
    }
    assert "id" not in encode_generate(InferResult("m", "1", "", {}, {}))
    event = sse_event(doc)
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and orjson.loads(event[6:]) == doc
