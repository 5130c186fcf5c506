"""A live sequence's checkpoint: what moves a sequence from one server to another.

``LoadedModel.checkpoint_sequence`` copies a sequence's implicit state out of its slot (and,
with ``release``, frees the slot: the sequence moved, it did not end); ``restore_sequence``
puts it into a free slot of another server, where its next non-START request continues. See
docs/checkpoints.md.

The binary format (``to_bytes`` / ``from_bytes``), all integers little-endian::

    magic   8 bytes  b"SQSVCKPT"
    format  u16      1
    flags   u16      0 (reserved: a reader refuses others)
    hlen    u32      length of the header
    header  hlen     JSON: {"model", "version", "sequence_id", "steps", "session",
                            "states": [{"name", "dtype", "shape", "nbytes"}, ...]}
    payload          each state's bytes, in header order, back to back (BYTES states in the
                     4-byte-length-prefixed wire format)

The decoder trusts nothing: sizes are checked against the data before anything is allocated,
dtypes come from the one dtype table (``engine/tensors.py``), and the arrays it returns are
read-only views of the data (no copy of the payload).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from seqserve.engine import tensors
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import SequenceId

MAGIC = b"SQSVCKPT"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sHHI")  # magic, format, flags, header length

#: bounds of the decoder (beyond what any real checkpoint needs)
MAX_HEADER_BYTES = 1 << 20
MAX_STATES = 1024
MAX_RANK = 16  # the core's kMaxRank
MAX_NAME_CHARS = 1024
MAX_STRING_ID_CHARS = 1 << 16
_U64 = 1 << 64

#: what a client that hits a busy sequence or a full model is told to wait (Retry-After)
RETRY_AFTER_S = 0.05


class CheckpointError(ValueError):
    """Checkpoint bytes that cannot be decoded (malformed, truncated, oversized, or not a
    checkpoint at all), or a checkpoint that cannot be encoded."""


class SequenceBusyError(InferenceError):
    """The sequence has a request queued or running (or waits in the backlog for a slot); try
    again after its step. UNAVAILABLE, with a short ``retry_after_s``."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.UNAVAILABLE, message, retry_after_s=RETRY_AFTER_S)


class CheckpointUnsupportedError(InferenceError):
    """The model keeps its sequences' state itself (no implicit state in its config), so the
    server cannot move them: finish them where they run. UNSUPPORTED."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.UNSUPPORTED, message)


class SequenceReleasedError(InferenceError):
    """A non-START request for a sequence this server checkpointed and released: it lives on
    elsewhere. Triton's START error (INVALID_ARG), so that a server without a state store
    answers as for any unknown sequence; a coordinator catches it to look the sequence up."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.INVALID_ARG, message)


@dataclass(frozen=True)
class SequenceCheckpoint:
    """One sequence as it stood between two steps."""

    model: str
    version: int
    sequence_id: SequenceId  # uint64 or string id, as the core keys it (5 and "5" differ)
    steps: int  # steps the model has run for this sequence
    session: bool  # named by a session (Inference-Session-Id): START implied rules
    #: implicit state keyed by the state's input_name: this sequence's value without the batch
    #: dim (its own shape for variable-shape state); object arrays of bytes for BYTES states
    states: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def state_bytes(self) -> int:
        """Bytes of state it carries (BYTES states: serialized)."""
        return sum(len(_raw(a)) if a.dtype.kind == "O" else a.nbytes for a in self.states.values())

    def to_bytes(self) -> bytes:
        """The binary format (module docstring). CheckpointError when a field is out of range
        or a state's dtype is not a tensor datatype."""
        check_fields(self.model, self.version, self.sequence_id, self.steps, self.session)
        if len(self.states) > MAX_STATES:
            raise CheckpointError(f"a checkpoint holds at most {MAX_STATES} states, not {len(self.states)}")
        entries: list[dict[str, Any]] = []
        parts: list[Any] = []
        for name, value in self.states.items():
            if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
                raise CheckpointError(f"state name {name!r:.80} must be a non-empty string")
            arr = np.asarray(value)
            dt = tensors.of_wire("BYTES") if arr.dtype.kind in "OSU" else tensors.of_numpy(arr.dtype)
            if dt is None or dt.numpy is None:
                raise CheckpointError(f"state '{name}': dtype {arr.dtype} is not a tensor datatype of the table")
            if arr.ndim > MAX_RANK:
                raise CheckpointError(f"state '{name}': rank {arr.ndim} is above {MAX_RANK}")
            if dt.is_bytes:
                data: Any = _raw(arr)
            else:
                if arr.dtype != dt.numpy:  # the table is little-endian
                    arr = arr.astype(dt.numpy)
                data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)  # joined without a copy
            entries.append({"name": name, "dtype": dt.wire, "shape": list(arr.shape), "nbytes": len(data)})
            parts.append(data)
        header = orjson.dumps(
            {
                "model": self.model,
                "version": self.version,
                "sequence_id": self.sequence_id,
                "steps": self.steps,
                "session": self.session,
                "states": entries,
            }
        )
        return b"".join([_PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header)), header, *parts])

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, *, max_bytes: int = 1 << 30) -> SequenceCheckpoint:
        """Decode ``to_bytes`` output. CheckpointError on anything malformed, truncated or
        larger than ``max_bytes``; sizes are checked before anything is allocated. The arrays
        are read-only views of ``data`` (copied first when ``data`` is mutable)."""
        try:
            view = memoryview(data).cast("B")
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"a checkpoint is bytes, not {type(data).__name__}") from e
        n = view.nbytes
        if n > max_bytes:
            raise CheckpointError(f"the checkpoint has {n} bytes, more than the limit of {max_bytes}")
        if n < _PREFIX.size:
            raise CheckpointError(f"truncated checkpoint: {n} bytes, the fixed prefix alone is {_PREFIX.size}")
        magic, fmt, flags, hlen = _PREFIX.unpack_from(view)
        if magic != MAGIC:
            raise CheckpointError("not a seqserve sequence checkpoint (bad magic)")
        if fmt != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint format {fmt} is not supported (this server reads {FORMAT_VERSION})")
        if flags != 0:
            raise CheckpointError(f"checkpoint flags {flags:#x} are not supported")
        if hlen > MAX_HEADER_BYTES or hlen > n - _PREFIX.size:
            raise CheckpointError(f"truncated or oversized checkpoint header ({hlen} bytes declared, {n} in all)")
        if not isinstance(data, bytes):
            view = memoryview(bytes(view))  # the arrays must not change under the checkpoint
        body = _PREFIX.size + hlen
        try:
            header = orjson.loads(view[_PREFIX.size : body])
        except orjson.JSONDecodeError as e:
            raise CheckpointError(f"the checkpoint header is not valid JSON: {e}") from None
        if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
            raise CheckpointError(f"the checkpoint header must have exactly the keys {sorted(_HEADER_KEYS)}")
        model, version, sequence_id = header["model"], header["version"], header["sequence_id"]
        steps, session, entries = header["steps"], header["session"], header["states"]
        check_fields(model, version, sequence_id, steps, session)
        if not isinstance(entries, list) or len(entries) > MAX_STATES:
            raise CheckpointError(f"the checkpoint's states must be a list of at most {MAX_STATES}")
        specs = [_check_entry(e) for e in entries]
        if len({name for name, *_ in specs}) != len(specs):
            raise CheckpointError("the checkpoint names a state twice")
        total = sum(nbytes for *_, nbytes in specs)
        if total != n - body:
            raise CheckpointError(f"the checkpoint's states declare {total} bytes, it carries {n - body}")
        states: dict[str, np.ndarray] = {}
        off = body
        for name, dt, shape, nbytes in specs:
            chunk = view[off : off + nbytes]
            off += nbytes
            count = math.prod(shape)
            if dt.is_bytes:
                if count * 4 > nbytes:  # each element has a 4-byte length: checked before allocating
                    raise CheckpointError(f"state '{name}': {nbytes} bytes cannot hold {count} BYTES elements")
                try:
                    arr = tensors.deserialize_bytes(chunk, list(shape))
                except ValueError as e:
                    raise CheckpointError(f"state '{name}': {e}") from None
            else:
                assert dt.numpy is not None
                if count * dt.itemsize != nbytes:
                    raise CheckpointError(
                        f"state '{name}': shape {list(shape)} of {dt.wire} needs {count * dt.itemsize} bytes, "
                        f"it has {nbytes}"
                    )
                arr = np.frombuffer(chunk, dtype=dt.numpy).reshape(shape)
            arr.flags.writeable = False
            states[name] = arr
        return cls(model, version, sequence_id, steps, session, states)


_HEADER_KEYS = frozenset({"model", "version", "sequence_id", "steps", "session", "states"})
_ENTRY_KEYS = frozenset({"name", "dtype", "shape", "nbytes"})


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_fields(model: object, version: object, sequence_id: object, steps: object, session: object) -> None:
    """CheckpointError unless the scalar fields are of their types and in range."""
    if not isinstance(model, str) or not model or len(model) > MAX_NAME_CHARS:
        raise CheckpointError(f"a checkpoint's model must be a non-empty name, not {model!r:.80}")
    if not _is_int(version) or not 0 <= version < 2**63:  # type: ignore[operator]
        raise CheckpointError(f"a checkpoint's version must be an integer >= 0, not {version!r:.80}")
    if _is_int(sequence_id):
        if not 0 < sequence_id < _U64:  # type: ignore[operator]
            raise CheckpointError(f"a checkpoint's integer sequence id must be a non-zero uint64, not {sequence_id}")
    elif not isinstance(sequence_id, str) or not sequence_id or len(sequence_id) > MAX_STRING_ID_CHARS:
        raise CheckpointError(
            f"a checkpoint's sequence id must be a uint64 or a non-empty string, not {sequence_id!r:.80}"
        )
    if not _is_int(steps) or not 0 <= steps < _U64:  # type: ignore[operator]
        raise CheckpointError(f"a checkpoint's steps must be an integer >= 0, not {steps!r:.80}")
    if not isinstance(session, bool):
        raise CheckpointError(f"a checkpoint's session flag must be true or false, not {session!r:.80}")


def _check_entry(e: object) -> tuple[str, tensors.DataType, tuple[int, ...], int]:
    if not isinstance(e, dict) or set(e) != _ENTRY_KEYS:
        raise CheckpointError(f"each state of a checkpoint must have exactly the keys {sorted(_ENTRY_KEYS)}")
    name, dtype, shape, nbytes = e["name"], e["dtype"], e["shape"], e["nbytes"]
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        raise CheckpointError(f"a state name must be a non-empty string, not {name!r:.80}")
    dt = tensors.of_wire(dtype) if isinstance(dtype, str) else None
    if dt is None or dt.numpy is None:
        raise CheckpointError(f"state '{name}': {dtype!r:.40} is not a datatype a state can have")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and 0 <= d < 2**63 for d in shape):
        raise CheckpointError(f"state '{name}': its shape must be a list of at most {MAX_RANK} dims >= 0")
    if not _is_int(nbytes) or nbytes < 0:
        raise CheckpointError(f"state '{name}': its byte count must be an integer >= 0")
    return name, dt, tuple(shape), nbytes


def _raw(arr: np.ndarray) -> bytes:
    """A BYTES state's wire form (str elements are encoded as UTF-8)."""
    try:
        return tensors.serialize_bytes(np.ascontiguousarray(arr, dtype=object))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"a BYTES state cannot be serialized: {e}") from None
