"""Checks of one request against its model's config, with Triton's messages, and the
request laid out for the core: a header of named scalars (``_core.RequestHeader``) and the
buffers the core reads, one per configured input in config order, kept apart (the header is
what a shared-memory ring would carry; the buffers would lie in shared-memory slabs)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import RequestHeader
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.spec import CoreSpec
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.sessions import client_key
from seqserve.engine.tensors import numpy_wire_name, serialize_bytes, to_numpy_dtype, wire_dtype_name

MAX_STRING_ID = 128
_MAX_PRIORITY = 2**31 - 1  # the core's priority is an int32
_MAX_TIMEOUT_US = 2**62 // 1000  # ns on the core's steady clock, added to now: 146 years
INTEGER_CORRID = frozenset({mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32})

_BATCH_DIM_NOTE = (
    ". NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


@dataclass(slots=True)
class _Input:
    index: int
    name: str
    datatype: str  # protocol name, e.g. "FP32"
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    is_bytes: bool


@dataclass(slots=True)
class CheckedRequest:
    """A request the model accepts, laid out for the core."""

    request: InferRequest
    buffers: tuple[Any, ...]  # per configured input: a C-contiguous array, or (BYTES wire data, shape)
    rows: int  # batch rows the request occupies
    outputs: tuple[str, ...]  # the outputs it gets
    corrid: SequenceId  # its sequence's id (0 for models without a sequence batcher)

    def core_header(self, handle: int) -> RequestHeader:
        """The request's scalars for the core, under the caller's ``handle``. The longest
        timeout is what the core's clock can add without overflowing, and a priority level
        the model does not have means its default level (Triton's rule)."""
        request = self.request
        timeout_us = request.timeout_us
        priority = request.priority
        return RequestHeader(
            handle=handle,
            sequence_id=self.corrid,
            start=request.sequence_start,
            end=request.sequence_end,
            session=request.session,
            timeout_us=timeout_us if 0 <= timeout_us <= _MAX_TIMEOUT_US else max(0, min(timeout_us, _MAX_TIMEOUT_US)),
            rows=self.rows,
            priority=priority if 0 <= priority <= _MAX_PRIORITY else 0,
            client=client_key(request.client) if request.session else 0,
        )


class RequestValidator:
    """Validates requests for one model version. ``failures`` counts the refused ones."""

    def __init__(self, cfg: mc.ModelConfig, spec: CoreSpec) -> None:
        self.name = cfg.name
        self.max_batch_size = cfg.max_batch_size
        self.is_sequence = cfg.HasField("sequence_batching")
        self.failures = 0
        self._inputs = {
            t.name: _Input(
                i,
                t.name,
                wire_dtype_name(t.data_type),
                np.dtype(to_numpy_dtype(t.data_type) or np.uint16),
                tuple(t.dims),
                t.data_type == mc.TYPE_STRING,
            )
            for i, t in enumerate(cfg.input)
        }
        self._outputs = frozenset(t.name for t in cfg.output)
        self._all_outputs = tuple(t.name for t in cfg.output)
        self._server_inputs = spec.server_inputs
        self._corrid_dtype = spec.corrid_dtype
        self._corrid_name = spec.corrid_name

    def check(self, request: InferRequest) -> CheckedRequest:
        """The request laid out for the core; raises InferenceError (and counts it) when the
        model refuses it."""
        try:
            return self._check(request)
        except InferenceError:
            self.failures += 1
            raise

    def _bad(self, request: InferRequest, msg: str) -> InferenceError:
        return InferenceError(Code.INVALID_ARG, f"[request id: {request.id or '<id_unknown>'}] {msg}")

    def _check(self, request: InferRequest) -> CheckedRequest:
        name = self.name
        mbs = self.max_batch_size
        ordered: list[Any] = [None] * len(self._inputs)
        batch = -1
        for key, arr in request.inputs.items():
            spec = self._inputs.get(key)
            if spec is None:
                if key in self._server_inputs:  # control/state tensors are supplied by the server
                    continue
                raise InferenceError(Code.INVALID_ARG, f"unexpected inference input '{key}' for model '{name}'")
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr, dtype=spec.dtype)
            if spec.is_bytes:
                if arr.dtype != object and arr.dtype.kind not in "SU":
                    raise self._bad(
                        request,
                        f"inference input '{key}' data-type is '{numpy_wire_name(arr.dtype)}', but model '{name}' "
                        f"expects 'BYTES'",
                    )
            elif arr.dtype != spec.dtype:
                raise self._bad(
                    request,
                    f"inference input '{key}' data-type is '{numpy_wire_name(arr.dtype)}', but model '{name}' "
                    f"expects '{spec.datatype}'",
                )
            shape = arr.shape
            item = shape[1:] if mbs > 0 else shape
            if mbs > 0:
                if len(shape) == 0:
                    raise self._bad(
                        request,
                        f"unexpected shape for input '{key}' for model '{name}'. "
                        f"Expected {_shape_str((-1, *spec.dims))}, got {_shape_str(shape)}{_BATCH_DIM_NOTE}",
                    )
                if batch < 0:
                    batch = shape[0]
                elif shape[0] != batch:
                    raise self._bad(
                        request, f"input '{key}' batch size {shape[0]} does not match other inputs ({batch})"
                    )
            if not _dims_match(item, spec.dims):
                want = (-1, *spec.dims) if mbs > 0 else spec.dims
                raise self._bad(
                    request,
                    f"unexpected shape for input '{key}' for model '{name}'. "
                    f"Expected {_shape_str(want)}, got {_shape_str(shape)}{_BATCH_DIM_NOTE if mbs > 0 else ''}",
                )
            if spec.is_bytes:
                ordered[spec.index] = (serialize_bytes(arr), shape)
            else:
                ordered[spec.index] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        if any(o is None for o in ordered):
            missing = [n for n, s in self._inputs.items() if ordered[s.index] is None]
            got = [n for n in request.inputs if n in self._inputs]
            raise self._bad(
                request,
                f"expected {len(self._inputs)} inputs but got {len(got)} inputs for model '{name}'. "
                f"Got input(s) {_name_list(got)}, but missing required input(s) {_name_list(missing)}. "
                "Please provide all required input(s).",
            )
        if mbs > 0 and batch > mbs:
            raise self._bad(request, f"inference request batch-size must be <= {mbs} for '{name}'")
        outputs = request.outputs
        if outputs:
            for o in outputs:
                if o not in self._outputs:
                    raise InferenceError(Code.INVALID_ARG, f"unexpected inference output '{o}' for model '{name}'")
        else:
            outputs = self._all_outputs
        corrid: SequenceId = 0
        if self.is_sequence:
            corrid = request.sequence_id
            self._check_sequence(request, corrid, batch)
        return CheckedRequest(
            request=request, buffers=tuple(ordered), rows=batch if batch > 0 else 1, outputs=outputs, corrid=corrid
        )

    def _check_sequence(self, request: InferRequest, corrid: SequenceId, batch: int) -> None:
        is_str = isinstance(corrid, str)
        if is_str and len(corrid) > MAX_STRING_ID:  # type: ignore[arg-type]
            # refused when the id is set, before any request id applies
            raise InferenceError(Code.INVALID_ARG, "string correlation ID cannot be longer than 128 characters")
        cd = self._corrid_dtype
        if cd is not None and ((is_str and cd != mc.TYPE_STRING) or (not is_str and cd not in INTEGER_CORRID)):
            raise self._bad(
                request,
                f"sequence batching control '{self._corrid_name}' data-type is "
                f"'{'BYTES' if is_str else 'UINT64'}', but model '{self.name}' expects '{wire_dtype_name(cd)}'",
            )
        if self.max_batch_size > 0 and batch != 1:
            raise InferenceError(
                Code.INVALID_ARG,
                f"inference request to model '{self.name}' must specify batch-size 1 due to requirements "
                "of sequence batcher",
            )


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _dims_match(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _name_list(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"  # Triton's formatting, no spaces


def fresh_sequence_id(corrid_dtype: int | None) -> SequenceId:
    """A fresh id for a sequence the client did not name, typed to suit the CORRID control."""
    if corrid_dtype in (mc.TYPE_UINT32, mc.TYPE_INT32):
        return secrets.randbelow(2**31 - 1) + 1
    if corrid_dtype in INTEGER_CORRID:
        return secrets.randbelow(2**63 - 1) + 1
    return uuid.uuid4().hex
