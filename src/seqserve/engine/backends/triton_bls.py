"""BLS for Triton-style Python models: what ``pb_utils.InferenceRequest.exec`` and
``async_exec`` do (the calls themselves: ``seqserve.engine.backends.bls``).

As in Triton: ``exec()`` blocks until the callee answers and returns an
``InferenceResponse``; a failed call (unknown model, bad input, a refusal, the timeout) is an
``InferenceResponse`` whose ``error()`` is a ``TritonError`` with the callee's message and
code, never an exception that fails the caller's batch. ``exec(decoupled=True)`` returns an
iterator over the callee's responses as they come (the last may be empty: a bare final flag);
an error ends it as one error response; ``exec()`` on a decoupled callee is an error, in
Triton's words. ``async_exec`` is the awaitable form of both, for an
``async def execute``. The request's ``timeout`` is in microseconds (0: none); the
``correlation_id`` and the SEQUENCE_START / SEQUENCE_END flags go with the call.
``preferred_memory`` is accepted; outputs arrive in CPU memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from seqserve.engine.backends import bls
from seqserve.engine.backends import triton_utils as pb
from seqserve.engine.device.arrays import to_host
from seqserve.engine.errors import InferenceError
from seqserve.engine.request import InferRequest

#: Triton's words for exec() / async_exec() without decoupled=True on a decoupled model
ONE_RESPONSE_ONLY = (
    "Model {model} is using the decoupled. The current BLS request call doesn't support models using the decoupled "
    "transaction policy. Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled "
    "models.'"
)


def engine_request(
    request: pb.InferenceRequest, model_name: str, model_version: int
) -> tuple[InferRequest, float | None]:
    """The call as the engine takes it, and its timeout in seconds (None: none)."""
    if not model_name:
        raise pb.TritonModelException("InferenceRequest: model_name is needed to execute a request")
    flags = request.flags()
    try:
        parameters = json.loads(request.parameters() or "{}")
    except ValueError:
        parameters = {}
    engine = bls.call_request(
        model_name,
        {t.name(): _host(t) for t in request.inputs()},
        model_version,
        request.correlation_id(),
        bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START),
        bool(flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END),
        request.requested_output_names(),
        request.request_id(),
        parameters if isinstance(parameters, dict) else {},
    )
    timeout_us = int(request.timeout() or 0)
    return engine, (timeout_us / 1e6 if timeout_us > 0 else None)


def _host(t: pb.Tensor) -> np.ndarray:
    return t.as_numpy() if t.is_cpu() else np.asarray(to_host(t.device_array))


def response_of(result: bls.Response) -> pb.InferenceResponse:
    """An engine response as pb_utils presents it (None: an empty final response)."""
    if result is None:
        return pb.InferenceResponse()
    if isinstance(result, InferenceError):
        return error_response(result)
    return pb.InferenceResponse(
        [pb.Tensor(name, value) for name, value in result.outputs.items()], parameters=result.parameters
    )


def error_response(e: InferenceError) -> pb.InferenceResponse:
    return pb.InferenceResponse(error=pb.TritonError(e.message, e.code))


def execute(request: pb.InferenceRequest, model_name: str, model_version: int, decoupled: bool) -> Any:
    """``InferenceRequest.exec``: one response, or (decoupled) an iterator over them."""
    calls, caller = _current()
    try:
        engine, timeout_s = engine_request(request, model_name, model_version)
        if decoupled:
            return _responses(calls.stream(engine, caller, timeout_s))
        return response_of(calls.infer(engine, caller, timeout_s, ONE_RESPONSE_ONLY))
    except InferenceError as e:
        return iter([error_response(e)]) if decoupled else error_response(e)


def _current() -> tuple[bls.ModelCalls, bls.Caller | None]:
    try:
        return bls.current_caller_or_error()
    except InferenceError as e:
        raise pb.TritonModelException(e.message) from None


def _responses(stream: Iterator[bls.InferResult | None]) -> Iterator[pb.InferenceResponse]:
    try:
        for r in stream:
            yield response_of(r)
    except InferenceError as e:
        yield error_response(e)


async def execute_async(request: pb.InferenceRequest, model_name: str, model_version: int, decoupled: bool) -> Any:
    """``InferenceRequest.async_exec``: awaited on the model's own event loop."""
    calls, caller = _current()
    try:
        engine, timeout_s = engine_request(request, model_name, model_version)
        refusal = "" if decoupled else ONE_RESPONSE_ONLY
        got: Sequence[bls.InferResult | None] = await calls.infer_async(engine, caller, timeout_s, refusal)
    except InferenceError as e:
        return iter([error_response(e)]) if decoupled else error_response(e)
    if decoupled:
        return iter([response_of(r) for r in got])
    first = next((r for r in got if r is not None), None)
    return response_of(first)


class TritonBls:
    """``InferenceRequest.exec`` / ``async_exec``, as ``bls.TRITON_EXEC`` calls them."""

    def execute(self, request: pb.InferenceRequest, model_name: str, model_version: int, decoupled: bool) -> Any:
        return execute(request, model_name, model_version, decoupled)

    def execute_async(self, request: pb.InferenceRequest, model_name: str, model_version: int, decoupled: bool) -> Any:
        return execute_async(request, model_name, model_version, decoupled)
