"""What a request and a reply carry between a worker process and the engine, besides the ring
record's fixed part: each tensor in its own slab block (raw bytes; BYTES tensors in their wire
layout) and one more block, at ``META_INDEX``, with the rest (names, datatypes, shapes, the
request's options) pickled. Both sides are the same program started by the same operator, so
pickle crosses no trust boundary here.

A request or reply too large for the rings (``RING_MAX_BYTES``, or a record that does not fit a
ring cell) goes over the worker's control channel instead, as the same meta and tensor bytes."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqserve.engine import tensors
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import SequenceId
from seqserve.engine.responses import InferResult

#: the input (output) index of the block that holds the pickled rest of a record
META_INDEX = 0xFFFFFFFF
#: a request or reply whose blocks add up to more than this goes over the control channel
RING_MAX_BYTES = 256 * 1024
#: the region's slab classes (block bytes, blocks) per worker and direction
SLAB_CLASSES = [(4096, 512), (65536, 64), (1 << 20, 8)]
#: the most dimensions a ring record's tensor descriptor holds (csrc/request.h kMaxRank)
RECORD_MAX_RANK = 16
#: the target of a request whose model the worker did not find in its snapshot: the engine
#: resolves it by name (and answers the error the front-ends expect)
BY_NAME = 1


@dataclass(slots=True)
class RequestMeta:
    """A request's fields that the ring record's header does not carry."""

    model: str
    version: str
    id: str
    sequence_id: SequenceId
    outputs: tuple[str, ...]
    parameters: dict[str, Any]
    client: str
    trace_parent: str
    session_name: str | None  # the session id a session request named (the engine maps it)
    scope: int  # the worker's stream scope (0: none)
    tensors: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)  # name, dtype, shape


def encode_array(arr: np.ndarray) -> tuple[str, bytes | memoryview]:
    """An array's dtype tag and its bytes (BYTES: the wire layout)."""
    if arr.dtype.kind == "O":
        return "BYTES", tensors.serialize_bytes(arr)
    a = np.ascontiguousarray(arr)
    return a.dtype.str, a.reshape(-1).data.cast("B") if a.size else b""


def decode_array(dtype: str, shape: tuple[int, ...], data: memoryview | bytes) -> np.ndarray:
    """A copy of an array out of a block (the block is freed right after)."""
    if dtype == "BYTES":
        return tensors.deserialize_bytes(bytes(data), list(shape))
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()


# ---------------------------------------------------------------------------- replies


@dataclass(slots=True)
class ReplyMeta:
    """A reply's fields besides its tensors: a result's names, or an error whole."""

    result: tuple[str, str, str, dict[str, Any]] | None  # model, version, id, parameters
    tensors: list[tuple[str, str, tuple[int, ...]]]
    #: class (the front-ends tell some apart: a session gone is HTTP 410), code, message, retry_after_s
    error: tuple[type[InferenceError], int, str, float | None] | None


def error_meta(err: InferenceError) -> ReplyMeta:
    return ReplyMeta(None, [], (type(err), int(err.code), err.message, err.retry_after_s))


def error_of(meta: ReplyMeta) -> InferenceError:
    """The engine's error again, of its own class (built without its class's own __init__,
    whose arguments differ from class to class)."""
    assert meta.error is not None
    cls, code, message, retry_after_s = meta.error
    if not (isinstance(cls, type) and issubclass(cls, InferenceError)):
        cls = InferenceError
    err = cls.__new__(cls)
    InferenceError.__init__(err, Code(code), message, retry_after_s=retry_after_s)
    return err


def result_of(meta: ReplyMeta, outputs: dict[str, np.ndarray]) -> InferResult:
    assert meta.result is not None
    model, version, rid, parameters = meta.result
    return InferResult(model, version, rid, outputs, parameters)


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes | memoryview) -> Any:
    return pickle.loads(data)
