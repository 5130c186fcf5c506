"""A worker's side of the engine's compiled path (issue 27): requests the engine can run with no
Python of its own are validated here, against the model config the snapshot carries (the
engine's ``RequestValidator``, so its messages), and sent as plain records: the target, the
inputs in config order with their shapes, the header. Their replies carry every configured
output in config order and no meta block; the worker builds the ``InferResult`` (names, dtypes,
the outputs its client asked for) and the refusals as ``LoadedModel.submit`` raises them
(a model without a sequence batcher: ``[request id: ...]`` first, as Triton words them).

Anything else (sessions, stream scopes, tracing, parameters the model may read, a request the
validator refuses: the engine answers and counts it) takes the slow way, with its meta block."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.api.workers.snapshot import ModelEntry
from seqserve.engine import SERVER_STOPPING, Code, InferenceError, InferRequest, InferResult
from seqserve.engine.tensors import to_numpy_dtype
from seqserve.engine.workers import (
    BACKLOG_RETRY_AFTER_S,
    REPLY_BACKLOG_FULL,
    REPLY_RELEASED,
    REPLY_RETRY_SHIFT,
    CheckedRequest,
    RequestHeader,
    RequestValidator,
    SequenceReleasedError,
    build_core_spec,
)

#: a ring cell (1,008 bytes) holds the header, a string id of up to 128 bytes and this many
#: input descriptors (offset, nbytes, index, up to 16 dims each)
FAST_MAX_INPUTS = 4

#: what the core's schedulers of models without a sequence batcher refuse a submit with
#: (csrc/dynamic.cc, stateless.cc, scheduler.cc): ``LoadedModel.submit`` puts the request id
#: first in these, never in the failures the core reports later (a timeout, a cancel, an
#: unload) nor in a model's failure; the reply's flags do not say which kind it is
SUBMIT_REFUSALS = frozenset({"Exceeds maximum queue size", SERVER_STOPPING})


class FastModel:
    """One model version on the compiled path, as a worker validates and answers for it."""

    def __init__(self, name: str, version: int, entry: ModelEntry) -> None:
        cfg = entry.config
        self.name = name
        self.version = str(version)
        self.target = entry.target
        self.is_sequence = entry.is_sequence
        self.validator = RequestValidator(cfg, build_core_spec(cfg, Path(entry.model_dir), 1))
        self.dtypes = {t.name: np.dtype(to_numpy_dtype(t.data_type)) for t in cfg.output}
        self.output_names = [t.name for t in cfg.output]


def fast_model(name: str, version: int, entry: ModelEntry) -> FastModel | None:
    """The model version's fast form, or None when its requests take the slow way."""
    if not entry.fast or entry.decoupled:
        return None
    if len(entry.config.input) > FAST_MAX_INPUTS:
        return None  # its record might not fit a ring cell
    try:
        return FastModel(name, version, entry)
    except Exception:  # a config the worker cannot lay out: the engine runs it
        return None


def takes(request: InferRequest, session_name: str | None, scope: int, *, is_sequence: bool = True) -> bool:
    """Whether a request to a sequence model (``is_sequence``) or another model needs none of
    the engine's per-request Python (the caller checks the server-wide reasons: tracing, verbose
    request lines). A sequence model's request names its sequence (else the engine picks an
    id); another model's carries no request id of the client's (a failed batch's words name the
    request id, and the engine's log line the same one: the engine never sees a fast record's);
    a sequence id there is ignored, as one process ignores it."""
    sequence_named = isinstance(request.sequence_id, int | str) and bool(request.sequence_id)
    return (
        (sequence_named if is_sequence else not request.id)
        and session_name is None
        and not request.session
        and scope == 0
        and request.trace is None
        and not request.parameters
    )


@dataclass(slots=True)
class FastRequest:
    """What the worker keeps of a request in flight on the compiled path to answer it."""

    model: FastModel
    checked: CheckedRequest


def check(model: FastModel, request: InferRequest) -> CheckedRequest | None:
    """The request laid out for the record, or None when the validator refuses it (the slow way
    then: the engine answers with the same words and counts the failure)."""
    try:
        checked = model.validator.check(request)
    except InferenceError:
        return None
    if any(not isinstance(b, np.ndarray) for b in checked.buffers):
        return None  # a BYTES input (fast targets have none)
    return checked


def header_of(checked: CheckedRequest, handle: int) -> RequestHeader:
    return checked.core_header(handle)


def result_of(fast: FastRequest, outputs: list[tuple[int, Any]]) -> InferResult | InferenceError:
    """A reply's outputs (index in config order, (a bytearray of their own, shape)) -> the
    client's result; its arrays are views of those bytearrays (writable, as a model's are)."""
    model = fast.model
    by_name: dict[str, Any] = {}
    for index, (data, shape) in outputs:
        name = model.output_names[index]
        by_name[name] = np.frombuffer(data, dtype=model.dtypes[name]).reshape(shape)
    request = fast.checked.request
    out = {}
    for name in fast.checked.outputs:
        arr = by_name.get(name)
        if arr is None:
            return InferenceError(Code.INTERNAL, f"model '{model.name}' did not produce output '{name}'")
        out[name] = arr
    return InferResult(model.name, model.version, request.id, out, {})


def error_of(fast: FastRequest, flags: int, code: int, message: str) -> InferenceError:
    """An error reply as ``LoadedModel.submit`` raises a refusal (a released sequence, the
    backlog's Retry-After, the request id first for a model without a sequence batcher). A
    model's failure comes logged and worded by the engine (its words name a request id the
    engine made: a fast record carries none)."""
    if flags & REPLY_RELEASED:
        return SequenceReleasedError(message)
    if not fast.model.is_sequence and code == Code.UNAVAILABLE and message in SUBMIT_REFUSALS:
        message = f"[request id: {fast.checked.request.id or '<id_unknown>'}] {message}"
    retry_ms = flags >> REPLY_RETRY_SHIFT
    retry_after_s = BACKLOG_RETRY_AFTER_S if flags & REPLY_BACKLOG_FULL else None
    if retry_ms:
        retry_after_s = retry_ms / 1000
    return InferenceError(Code(code) if code else Code.INTERNAL, message, retry_after_s=retry_after_s)
