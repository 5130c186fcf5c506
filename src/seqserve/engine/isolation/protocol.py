"""What the server (parent) and an isolated instance (child) say to each other.

Two channels per child (see ``channel``), each strictly request/reply:

- the **batch channel**, driven by the parent: ``INIT`` -> ``READY``/``INIT_FAILED``, then per
  batch ``EXEC`` -> ``RESULT``/``FAILED``, and at unload ``FINALIZE`` -> ``FINALIZED``;
- the **event channel**, driven by the child (any thread, any time): ``SEND`` (one response
  of one request, from a responder), ``CANCELLED`` (``is_cancelled()``), ``LOG`` (a log
  record, so that the model's logging reaches the server's log) and ``METRICS`` (a JSON
  snapshot of the model's custom metrics, so that they reach ``/metrics``), each answered by
  the parent with ``OK``/``ERR``/``BOOL``.

Tensors never travel in messages. The parent writes a batch's inputs, implicit states,
control tensors, START/END/READY and CORRID into its request slab; the child writes outputs
and output states into its reply slab, and responses into its response slab (``slab``). A
message carries only a compact header, the shapes and offsets of its tensors as int64s and,
rarely, a small tail (the names of a new set of requested outputs, request ids, error text).
BYTES tensors are laid out in the slab in the 4-byte-length-prefixed wire format.

Tensors are placed one after the other, each at a 64-byte boundary, in an order both sides
know, so a batch message lists only ``nbytes, ndim, *shape`` per tensor. Results name each
tensor by its index in the model's ``result_names`` and give its offset.

The parent trusts nothing it decodes from a child: every count, index, offset and size is
checked (``ProtocolError``), since a model's code runs there.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation.slab import Slab, aligned
from seqserve.engine.tensors import deserialize_bytes, serialize_bytes

# message kinds: parent -> child (batch channel)
INIT, EXEC, FINALIZE = 1, 2, 3
# child -> parent (batch channel)
READY, INIT_FAILED, RESULT, FAILED, FINALIZED = 10, 11, 12, 13, 14
# child -> parent (event channel), and the parent's answers
SEND, CANCELLED, LOG, METRICS = 20, 21, 22, 23
OK, ERR, BOOL = 30, 31, 32

# EXEC flags
X_ROWS = 1  # request_rows follow (else every request has one row)
X_TAIL = 2  # a marshalled tail follows the ints
X_STR_CORRID = 4  # CORRID holds string ids: serialized b"s<utf-8>" / b"i<decimal>" items
X_SLAB = 8  # a new request slab's descriptor comes with this message
# RESULT flags
R_REQUESTS = 1  # per-request outcomes (RequestResults) follow the batched tensors
R_SLAB = 2  # a new reply slab's descriptor comes with this message

# per-request outcome kinds (RESULT) and response kinds (SEND)
O_NONE, O_DEFERRED, O_ERROR, O_TENSORS = 0, 1, 2, 3

#: tensor dtypes that cross, by code; the last is BYTES (object arrays)
DTYPES: tuple[np.dtype[Any], ...] = (
    *(np.dtype(c) for c in ("?", "i1", "u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8")),
    *(np.dtype(c) for c in ("<c8", "<c16")),
    np.dtype(object),
)
OBJECT = len(DTYPES) - 1
#: pseudo dtype codes of results: an output given as one array per request (a list), whose
#: entries follow; an entry that is None
LIST = OBJECT + 1
NONE = OBJECT + 2
DTYPE_CODE = {d.str: i for i, d in enumerate(DTYPES)}
#: the native, fixed-size ones by dtype: the fast path of results
NATIVE_DTYPE_CODE = {d: i for i, d in enumerate(DTYPES) if d.kind != "O" and d.isnative}

KIND_HEAD = struct.Struct("<B")
EXEC_HEAD = struct.Struct("<BBHIIQ")  # kind, flags, ints that describe tensors, nints, ntail, token
RESULT_HEAD = struct.Struct("<BBHII")  # kind, flags, -, nints, ntext
CODE_HEAD = struct.Struct("<BB")  # kind, code (then utf-8 text)
SEND_HEAD = struct.Struct("<BBBBIIQ")  # kind, final, outcome kind, code, nints, index, token (then ints, text)
BOOL_HEAD = struct.Struct("<BB")
_INTS: dict[int, struct.Struct] = {}

#: the most tensors, requests or dimensions a child may describe in one message
MAX_COUNT = 1 << 20


class ProtocolError(Exception):
    """A child sent something that does not decode: it is out of step and gets restarted."""


def ints_struct(n: int) -> struct.Struct:
    s = _INTS.get(n)
    if s is None:
        s = _INTS[n] = struct.Struct(f"<{n}q")
    return s


def result_names(cfg: mc.ModelConfig) -> tuple[str, ...]:
    """The names a result may carry, by index: the outputs, then each output state."""
    names = [o.name for o in cfg.output]
    for s in cfg.sequence_batching.state:
        name = s.output_name or s.name
        if name not in names:
            names.append(name)
    return tuple(names)


def code_message(kind: int, code: int, message: str) -> bytes:
    return CODE_HEAD.pack(kind, int(code)) + message.encode("utf-8", "surrogateescape")


def read_code_message(body: memoryview) -> InferenceError:
    if len(body) < CODE_HEAD.size:
        raise ProtocolError("short error message")
    _kind, code = CODE_HEAD.unpack_from(body)
    try:
        c = Code(code)
    except ValueError:
        c = Code.INTERNAL
    return InferenceError(c, bytes(body[CODE_HEAD.size :]).decode("utf-8", "replace"))


def kind_of(body: memoryview) -> int:
    if not len(body):
        raise ProtocolError("empty message")
    return body[0]


# --------------------------------------------------------------------------- tensors out


def prepared(value: Any) -> tuple[int, Any, int, tuple[int, ...]]:
    """(dtype code, data: array or bytes, nbytes, shape) of one tensor to place in a slab."""
    arr = np.asarray(value)
    if arr.dtype.kind in "OSU":
        data = serialize_bytes(arr)
        return OBJECT, data, len(data), arr.shape
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    code = DTYPE_CODE.get(arr.dtype.str)
    if code is None:
        raise TypeError(f"tensors of dtype {arr.dtype} cannot be returned by an isolated model")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return code, arr, arr.nbytes, arr.shape


def _copy_in(mv: memoryview, off: int, data: Any, n: int) -> None:
    if n:
        mv[off : off + n] = data if isinstance(data, bytes) else memoryview(data).cast("B")


class SlabWriter:
    """Places the tensors of one message in a slab this side owns, replacing the slab with a
    larger one when they do not fit (its descriptor then goes with the message)."""

    __slots__ = ("slab",)

    def __init__(self) -> None:
        self.slab: Slab | None = None

    def place(self, items: Sequence[tuple[int, Any, int, tuple[int, ...]]]) -> tuple[list[int], list[int]]:
        """Copy prepared tensors in; their offsets, and the descriptors to send along."""
        offsets = []
        total = 0
        for item in items:
            offsets.append(total)
            total = aligned(total + item[2])
        fds: list[int] = []
        slab = self.slab
        if slab is None or total > slab.size:
            old = slab
            slab = self.slab = Slab.create(total)
            fds.append(slab.fd)
            if old is not None:
                old.close()
        mv = slab.mv
        for (_code, data, n, _shape), off in zip(items, offsets, strict=True):
            _copy_in(mv, off, data, n)
        return offsets, fds

    def close(self) -> None:
        if self.slab is not None:
            self.slab.close()
            self.slab = None


def describe_tensor(ints: list[int], name_id: int, item: tuple[int, Any, int, tuple[int, ...]], off: int) -> None:
    code, _data, n, shape = item
    ints += (name_id, code, n, off, len(shape), *shape)


def describe_entry(ints: list[int], item: tuple[int, Any, int, tuple[int, ...]], off: int) -> None:
    code, _data, n, shape = item
    ints += (code, n, off, len(shape), *shape)


NONE_ITEM: tuple[int, Any, int, tuple[int, ...]] = (NONE, b"", 0, ())


# ---------------------------------------------------------------------------- tensors in


class SlabReader:
    """The read-only mapping of the peer's slab, and checked views onto it."""

    __slots__ = ("_views", "slab")

    def __init__(self) -> None:
        self.slab: Slab | None = None
        self._views: dict[tuple[Any, ...], np.ndarray] = {}

    def take(self, fds: list[int]) -> None:
        """Map a new slab that came with a message (closing any extra descriptors)."""
        if not fds:
            return
        for extra in fds[1:]:
            os.close(extra)
        fd = fds[0]
        size = os.fstat(fd).st_size
        old = self.slab
        self.slab = Slab.attach(fd, size)
        self._views = {}
        if old is not None:
            old.close()

    def tensor(self, code: int, n: int, off: int, shape: tuple[int, ...]) -> np.ndarray:
        """A view (or, for BYTES, a decoded object array) of a described tensor; checked.
        Views are cached by their descriptor: the same batch size gives the same views."""
        key = (code, n, off, shape)
        view = self._views.get(key)
        if view is not None:
            return view
        slab = self.slab
        if slab is None or off < 0 or n < 0 or off + n > slab.size or min(shape, default=0) < 0:
            raise ProtocolError("tensor outside the slab")
        if code == OBJECT:
            try:
                return deserialize_bytes(slab.mv[off : off + n], list(shape))
            except ValueError as e:
                raise ProtocolError(str(e)) from None
        if not 0 <= code < OBJECT:
            raise ProtocolError(f"unknown dtype code {code}")
        dt = DTYPES[code]
        count = 1
        for d in shape:
            count *= d
        if count * dt.itemsize != n:
            raise ProtocolError("tensor size does not match its shape")
        view = slab.array(dt, shape, off)
        if len(self._views) < 256:
            self._views[key] = view
        return view

    def close(self) -> None:
        if self.slab is not None:
            self.slab.close()
            self.slab = None
        self._views = {}


def read_tensors(
    reader: SlabReader, ints: tuple[int, ...], pos: int, count: int, names: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """Described tensors by name: an array, or for a list (one array per request) a list."""
    out: dict[str, Any] = {}
    if not 0 <= count <= MAX_COUNT:
        raise ProtocolError("bad tensor count")
    for _ in range(count):
        name_id, code, n, off, ndim = ints[pos : pos + 5]
        if not 0 <= name_id < len(names) or not 0 <= ndim <= 64:
            raise ProtocolError("bad tensor descriptor")
        if code == LIST:  # n entries follow, each (code, nbytes, offset, ndim, *shape)
            if not 0 <= n <= MAX_COUNT:
                raise ProtocolError("bad list length")
            pos += 5
            entries: list[Any] = []
            for _ in range(n):
                code, size, off, ndim = ints[pos : pos + 4]
                if not 0 <= ndim <= 64:
                    raise ProtocolError("bad tensor descriptor")
                shape = ints[pos + 4 : pos + 4 + ndim]
                pos += 4 + ndim
                entries.append(None if code == NONE else reader.tensor(code, size, off, shape))
            out[names[name_id]] = entries
            continue
        shape = ints[pos + 5 : pos + 5 + ndim]
        if len(shape) != ndim:
            raise ProtocolError("truncated tensor descriptor")
        pos += 5 + ndim
        out[names[name_id]] = reader.tensor(code, n, off, shape)
    return out, pos
