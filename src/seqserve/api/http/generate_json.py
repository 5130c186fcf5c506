"""The JSON of Triton's generate extension (docs/protocol/extension_generate.md): a request is
one JSON object whose top-level fields name the model's inputs (a value, or a flat array of
values) or are request parameters, and whose ``parameters`` object holds more of either; a
response is one JSON object: ``id`` (when the request had one), ``model_name``,
``model_version``, the response's parameters, then each output by name (its one element, or
its elements as a flat array). Pure functions: no I/O."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from seqserve.api.http.kserve_json import json_tensor
from seqserve.api.kserve import bad, clip, set_parameter
from seqserve.engine import InferRequest, InferResult

#: the top-level key whose members are more inputs or parameters
PARAMETERS = "parameters"

#: Triton's error for a non-streaming generate whose model answered other than once
NOT_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that "
    "generates various number of responses"
)


def decode_generate(body: bytes, inputs: list[dict[str, Any]], model: str, version: str) -> InferRequest:
    """A generate request as an InferRequest. ``inputs``: the model metadata's inputs (name,
    datatype, shape with -1 for variable dimensions)."""
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise bad(f"failed to parse the request JSON: {e}") from None
    if not isinstance(doc, dict):
        raise bad("a generate request must be a JSON object")
    meta = {i["name"]: i for i in inputs}
    request = InferRequest(model=model, inputs={}, version=version)
    request_id = doc.get("id")
    if request_id is not None:
        if not isinstance(request_id, str):
            raise bad("Unable to parse 'id': it must be a string")
        request.id = request_id
    nested = doc.get(PARAMETERS)
    if PARAMETERS in meta:
        raise bad(f"Keyword '{PARAMETERS}' for nested schema also given as input tensor name")
    if nested is not None and not isinstance(nested, dict):
        raise bad(f"Expected JSON object for keyword: '{PARAMETERS}'")
    fields = [(k, v) for k, v in doc.items() if k not in ("id", PARAMETERS)]
    fields += list((nested or {}).items())
    for key, value in fields:
        if key in meta:
            if key in request.inputs:
                raise bad(f"input '{clip(key)}' is given twice (at the top level and in '{PARAMETERS}')")
            request.inputs[key] = _input(key, meta[key], value)
        elif not set_parameter(request, key, value):
            raise bad(
                f"Unable to parse '{clip(key)}': parameter '{clip(key)}' has invalid type. It should be either "
                "'int', 'bool', or 'string'"
                + (" (sequence_start and sequence_end are booleans)" if key.startswith("sequence_") else "")
            )
    return request


def _input(name: str, meta: dict[str, Any], value: Any) -> np.ndarray:
    """One input's value as a tensor of the model's shape: its fixed dimensions take their
    share of the elements, the innermost variable one the rest, other variable ones 1 (Triton's
    rule, as a generate request carries no shape)."""
    if isinstance(value, list) and any(isinstance(v, list | dict) for v in value):
        raise bad(f"input '{clip(name)}' must be a value or a flat array of values")
    if isinstance(value, dict) or value is None:
        raise bad(f"input '{clip(name)}' must be a value or a flat array of values")
    count = len(value) if isinstance(value, list) else 1
    shape = [int(d) for d in meta["shape"]]
    left = count
    for d in shape:
        if d != -1:
            if d == 0 or left % d:
                raise bad(f"The schema can not convert input '{clip(name)}' to tensor with proper shape")
            left //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i] = left
            left = 1
    if left != 1:
        raise bad(f"The schema can not convert input '{clip(name)}' to tensor with proper shape")
    return json_tensor(name, meta["datatype"], shape, count, value)


def encode_generate(result: InferResult) -> dict[str, Any]:
    """One response as the generate response object."""
    doc: dict[str, Any] = {}
    if result.id:
        doc["id"] = result.id
    doc["model_name"] = result.model_name
    doc["model_version"] = result.model_version
    for key, value in result.parameters.items():
        if isinstance(value, str | bool | int | float):
            doc[key] = value
    for name, arr in result.outputs.items():
        values = _json_values(arr)
        doc[name] = values[0] if len(values) == 1 else values
    return doc


def _json_values(arr: np.ndarray) -> list[Any]:
    flat = np.asarray(arr).reshape(-1)
    if flat.dtype == object or flat.dtype.kind == "S":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat.tolist()]
    values: list[Any] = flat.tolist()
    return values


def sse_event(doc: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``doc``."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"
