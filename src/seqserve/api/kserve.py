"""What the two KServe v2 codecs share (``kserve_json`` for HTTP, ``grpc.codec`` for gRPC).

The datatypes as the protocol names them (derived from ``seqserve.engine.tensors``), the raw
tensor layout (HTTP's binary tensor extension and gRPC's ``raw_input_contents`` /
``raw_output_contents`` carry the same bytes), the scheduling parameters every request may
carry, Triton's refusal of decoupled models on single-response calls, and the protocol
extensions both front-ends serve.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from seqserve.engine import Code, DecoupledModelError, InferenceError, InferRequest, InferResult, Server, tensors

#: The protocol extensions the front-ends serve, reported by server metadata on HTTP and gRPC.
EXTENSIONS = (
    "sequence",
    "sequence(string_id)",
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
    "parameters",
    "schedule_policy",
    "classification",
    "system_shared_memory",
    "logging",
    "trace",
    "cuda_shared_memory",
)

#: Protocol datatype -> numpy dtype, for every datatype numpy has (BYTES: object; not BF16).
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {d.wire: d.numpy for d in tensors.DATA_TYPES if d.numpy is not None}


#: the most dimensions a tensor may have (a larger rank is refused before anything is allocated)
MAX_RANK = 64
#: dimensions and element counts are int64 on the wire and in the core
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
#: a BYTES element is at least its 4-byte length prefix
BYTES_PREFIX = 4


def bad(msg: str) -> InferenceError:
    return InferenceError(Code.INVALID_ARG, msg)


def clip(text: str, limit: int = 200) -> str:
    """A client string quoted in an error message, cut to ``limit`` characters: a reply must not
    echo a megabyte name back (gRPC clients drop trailers over 16 KiB)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def element_count(shape: list[int] | tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_shape(name: str, shape: Any) -> int:
    """The element count of a client's shape, refused (400) unless it is a list of at most
    ``MAX_RANK`` integers in [0, 2^63) whose product, zeros counted as ones, stays below 2^63
    (what numpy and the core can hold). Python integers: nothing overflows while checking."""
    if not isinstance(shape, list | tuple):
        raise bad(f"input '{clip(name)}' needs a 'shape' of non-negative integers")
    if len(shape) > MAX_RANK:
        raise bad(f"input '{clip(name)}' has {len(shape)} dimensions; at most {MAX_RANK} are supported")
    count = 1
    span = 1
    for d in shape:
        if type(d) is not int or d < 0:  # bool is not a dimension, nor a float
            raise bad(f"input '{clip(name)}' needs a 'shape' of non-negative integers, got {clip(str(list(shape)))}")
        count *= d
        if d:
            span *= d
    if span > INT64_MAX:
        raise bad(f"input '{clip(name)}': shape {clip(str(list(shape)))} has more elements than an int64 can count")
    return count


# ------------------------------------------------------------------------- tensors


def wire_datatype(arr: np.ndarray) -> str:
    """The protocol datatype of an output array ("FP32"; str/bytes arrays are "BYTES")."""
    return tensors.numpy_wire_name(arr.dtype)


def tensor_from_raw(name: str, datatype: str, shape: list[int], chunk: memoryview | bytes) -> np.ndarray:
    """One input's raw bytes as an array: a zero-copy view for fixed-size types, an object
    array of bytes for BYTES (length-prefixed elements). The shape is checked against the
    bytes actually present before anything is allocated."""
    count = check_shape(name, shape)
    if datatype == "BYTES":
        check_bytes_count(name, count, len(chunk))
        try:
            return tensors.deserialize_bytes(chunk, list(shape))
        except ValueError as e:
            raise bad(f"input '{clip(name)}': {e}") from None
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        if datatype == "BF16":
            raise InferenceError(Code.UNSUPPORTED, f"input '{clip(name)}': BF16 tensors are not supported")
        raise bad(f"input '{clip(name)}' has unknown datatype '{clip(datatype)}'")
    want = count * dtype.itemsize
    if len(chunk) != want:
        raise bad(f"unexpected size for input '{clip(name)}', expecting {want} bytes but got {len(chunk)}")
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def check_bytes_count(name: str, count: int, size: int) -> None:
    """A BYTES tensor of ``count`` elements needs at least 4 bytes per element: refuse it
    before the decoder allocates ``count`` objects for a few bytes of data."""
    if count * BYTES_PREFIX > size or (count == 0 and size):
        raise bad(
            f"unexpected size for BYTES input '{clip(name)}': {size} bytes cannot hold the {count} elements "
            f"of its shape (each element is a 4-byte length and its bytes)"
        )


def raw_bytes(arr: np.ndarray) -> bytes:
    """An output array in the raw layout."""
    if arr.dtype.kind in "OSU":
        return tensors.serialize_bytes(arr)
    return arr.tobytes()


# ---------------------------------------------------------------------- parameters


def set_parameter(request: InferRequest, key: str, value: Any) -> bool:
    """One request parameter onto ``request``: ``sequence_id`` (a uint64 or a string: 42 and
    "42" are different sequences), ``sequence_start``, ``sequence_end`` (booleans),
    ``priority`` and ``timeout`` (uint64s, as in Triton; microseconds for the timeout) onto
    their fields, any other key into ``request.parameters`` (a string, a boolean, a number:
    an integer within int64 or uint64, or a float). Returns False when a value has the wrong
    type or is out of range: each codec words that error as its protocol does. (The engine
    maps a priority beyond the model's levels to its default level, as Triton does, and
    bounds a timeout to what its clock can add.)"""
    if key == "sequence_id":
        if isinstance(value, str) or (type(value) is int and 0 <= value <= UINT64_MAX):
            request.sequence_id = value
            return True
        return False
    if key == "sequence_start":
        if type(value) is not bool:
            return False
        request.sequence_start = value
    elif key == "sequence_end":
        if type(value) is not bool:
            return False
        request.sequence_end = value
    elif key == "priority":
        if type(value) is not int or not 0 <= value <= UINT64_MAX:
            return False
        request.priority = value
    elif key == "timeout":
        if type(value) is not int or not 0 <= value <= UINT64_MAX:
            return False
        request.timeout_us = value
    else:
        if type(value) is int:
            if not -(2**63) <= value <= UINT64_MAX:
                return False
        elif not isinstance(value, str | bool | float):
            return False
        request.parameters[key] = value
    return True


# -------------------------------------------------------------------------- sessions

#: the session id and end flag, as HTTP headers and as gRPC metadata keys (lower case)
SESSION_ID_KEY = "inference-session-id"
SESSION_END_KEY = "inference-session-end"


def apply_session(server: Server, request: InferRequest, session: str | None, end: str | None) -> None:
    """Name ``request``'s sequence by a session id (HTTP ``Inference-Session-Id``, gRPC
    ``inference-session-id`` metadata) unless its parameters name one: START is implied for a
    session the server does not know, and a session that ended or expired is refused (see
    ``seqserve.engine.sessions``). ``end`` ("true" / "false") ends the session with this request."""
    if not session:
        if end is not None:
            raise bad("Inference-Session-End needs an Inference-Session-Id")
        return
    if request.sequence_id:  # the request's sequence_id parameter names its sequence
        return
    request.sequence_id = server.session_sequence_id(request.model, request.version, session)
    request.session = True
    if end is not None and _session_end(end):
        request.sequence_end = True


def _session_end(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise bad(f"Inference-Session-End must be 'true' or 'false', not '{value}'")


# --------------------------------------------------------------------------- submit


def enqueue_single(server: Server, request: InferRequest, endpoint: str) -> asyncio.Future[InferResult]:
    """Queue a single-response request (HTTP infer, gRPC ModelInfer). Decoupled models are
    refused with Triton's words; ``endpoint`` names the caller in them."""
    try:
        return server.enqueue(request)
    except DecoupledModelError:
        raise InferenceError(
            Code.UNSUPPORTED, f"{endpoint} doesn't support models with decoupled transaction policy"
        ) from None
