"""What the server (parent) and an isolated instance (child) say to each other.

Two channels per child (see ``channel``), each strictly request/reply:

- the **batch channel**, driven by the parent: ``INIT`` -> ``READY``/``INIT_FAILED``, then per
  batch ``EXEC`` -> ``RESULT``/``FAILED``, and at unload ``FINALIZE`` -> ``FINALIZED``;
- the **event channel**, driven by the child (any thread, any time): ``SEND`` (one response
  of one request, from a responder), ``CANCELLED`` (``is_cancelled()``) and ``LOG`` (a log
  record, so that the model's logging reaches the server's log), each answered by the parent
  with ``OK``/``ERR``/``BOOL``.

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

import marshal
import os
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.batch import ExecuteBatch, RaggedInput
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation.slab import Slab, aligned
from seqserve.engine.responses import DEFERRED
from seqserve.engine.tensors import deserialize_bytes, serialize_bytes

# message kinds: parent -> child (batch channel)
INIT, EXEC, FINALIZE = 1, 2, 3
# child -> parent (batch channel)
READY, INIT_FAILED, RESULT, FAILED, FINALIZED = 10, 11, 12, 13, 14
# child -> parent (event channel), and the parent's answers
SEND, CANCELLED, LOG = 20, 21, 22
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
_CODE = {d.str: i for i, d in enumerate(DTYPES)}
#: the native, fixed-size ones by dtype: the fast path of results
_FAST_CODE = {d: i for i, d in enumerate(DTYPES) if d.kind != "O" and d.isnative}

_KIND = struct.Struct("<B")
_EXEC = struct.Struct("<BBHIIQ")  # kind, flags, ints that describe tensors, nints, ntail, token
_RESULT = struct.Struct("<BBHII")  # kind, flags, -, nints, ntext
_CODE_MSG = struct.Struct("<BB")  # kind, code (then utf-8 text)
_SEND = struct.Struct("<BBBBIIQ")  # kind, final, outcome kind, code, nints, index, token (then ints, text)
_BOOL = struct.Struct("<BB")
_INTS: dict[int, struct.Struct] = {}

#: the most tensors, requests or dimensions a child may describe in one message
_MAX_COUNT = 1 << 20


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
    return _CODE_MSG.pack(kind, int(code)) + message.encode("utf-8", "surrogateescape")


def read_code_message(body: memoryview) -> InferenceError:
    if len(body) < _CODE_MSG.size:
        raise ProtocolError("short error message")
    _kind, code = _CODE_MSG.unpack_from(body)
    try:
        c = Code(code)
    except ValueError:
        c = Code.INTERNAL
    return InferenceError(c, bytes(body[_CODE_MSG.size :]).decode("utf-8", "replace"))


def kind_of(body: memoryview) -> int:
    if not len(body):
        raise ProtocolError("empty message")
    return body[0]


# --------------------------------------------------------------------------- tensors out


def _prepared(value: Any) -> tuple[int, Any, int, tuple[int, ...]]:
    """(dtype code, data: array or bytes, nbytes, shape) of one tensor to place in a slab."""
    arr = np.asarray(value)
    if arr.dtype.kind in "OSU":
        data = serialize_bytes(arr)
        return OBJECT, data, len(data), arr.shape
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    code = _CODE.get(arr.dtype.str)
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


def _describe(ints: list[int], name_id: int, item: tuple[int, Any, int, tuple[int, ...]], off: int) -> None:
    code, _data, n, shape = item
    ints += (name_id, code, n, off, len(shape), *shape)


def _describe_entry(ints: list[int], item: tuple[int, Any, int, tuple[int, ...]], off: int) -> None:
    code, _data, n, shape = item
    ints += (code, n, off, len(shape), *shape)


_NONE_ITEM: tuple[int, Any, int, tuple[int, ...]] = (NONE, b"", 0, ())


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


def _read_tensors(
    reader: SlabReader, ints: tuple[int, ...], pos: int, count: int, names: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """Described tensors by name: an array, or for a list (one array per request) a list."""
    out: dict[str, Any] = {}
    if not 0 <= count <= _MAX_COUNT:
        raise ProtocolError("bad tensor count")
    for _ in range(count):
        name_id, code, n, off, ndim = ints[pos : pos + 5]
        if not 0 <= name_id < len(names) or not 0 <= ndim <= 64:
            raise ProtocolError("bad tensor descriptor")
        if code == LIST:  # n entries follow, each (code, nbytes, offset, ndim, *shape)
            if not 0 <= n <= _MAX_COUNT:
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


# ------------------------------------------------------------------- batches (parent side)


class BatchWriter:
    """Parent side: one batch into the request slab and an ``EXEC`` message.

    The slab and the tables (sets of requested outputs) outlive a child; ``reset`` is called
    for each new child, so the first batch it gets carries the layout, the slab and the
    output sets again."""

    __slots__ = ("_layout_sent", "_osets", "_slab_sent", "slab")

    def __init__(self) -> None:
        self.slab = SlabWriter()
        self._osets: dict[tuple[str, ...], int] = {}
        self._layout_sent = False
        self._slab_sent = False

    def reset(self) -> None:
        self._osets = {}
        self._layout_sent = False
        self._slab_sent = False

    def encode(self, batch: Any, token: int) -> tuple[bytes, list[int]]:
        inputs, states, controls = batch.inputs, batch.states, batch.controls
        corrid = batch.corrid
        flags = 0
        arrays: list[Any] = [
            *inputs.values(),
            *states.values(),
            *controls.values(),
            batch.start,
            batch.end,
            batch.ready,
        ]
        if corrid.dtype.kind == "O":  # string ids (mixed with ints for padding rows)
            flags |= X_STR_CORRID
            corrid = np.array(
                [b"s" + c.encode("utf-8", "surrogateescape") if isinstance(c, str) else b"i%d" % c for c in corrid],
                dtype=object,
            )
        arrays.append(corrid)
        ints: list[int] = [batch.size, len(batch.request_rows)]
        fds = self._place(arrays, ints)
        described = len(ints)
        if fds or not self._slab_sent:
            flags |= X_SLAB
            fds = [self.slab.slab.fd]  # type: ignore[union-attr]
            self._slab_sent = True
        rows = batch.request_rows
        if rows.count(1) != len(rows):
            flags |= X_ROWS
            ints += rows
        tail: dict[str, Any] = {}
        osets = self._osets
        for wanted in batch.request_outputs:
            if wanted is None:
                ints.append(-1)
                continue
            oid = osets.get(wanted)
            if oid is None:
                oid = osets[wanted] = len(osets)
                tail.setdefault("osets", []).append((oid, tuple(wanted)))
            ints.append(oid)
        if any(batch.request_ids):
            tail["ids"] = list(batch.request_ids)
        if batch.ragged:  # ragged inputs: each request's shape
            tail["ragged"] = {name: r.shapes for name, r in batch.ragged.items()}
        if not self._layout_sent:
            tail["layout"] = (
                [(k, _CODE_OF(a)) for k, a in inputs.items()],
                [(k, _CODE_OF(a)) for k, a in states.items()],
                [(k, _CODE_OF(a)) for k, a in controls.items()],
            )
            self._layout_sent = True
        if tail:
            flags |= X_TAIL
            blob = marshal.dumps(tail)
            head = _EXEC.pack(EXEC, flags, described, len(ints), len(blob), token)
            return head + ints_struct(len(ints)).pack(*ints) + blob, fds
        return _EXEC.pack(EXEC, flags, described, len(ints), 0, token) + ints_struct(len(ints)).pack(*ints), fds

    def _place(self, arrays: list[np.ndarray], ints: list[int]) -> list[int]:
        """Copy the batch's arrays into the request slab (grown when they do not fit) and
        describe them in ``ints``; the descriptors of a new slab."""
        holder = self.slab
        slab = holder.slab
        fds: list[int] = []
        if slab is None:
            slab = holder.slab = Slab.create(0)
            fds.append(slab.fd)
        mv, cap = slab.mv, slab.size
        off = 0
        base = len(ints)
        for a in arrays:
            if a.dtype.kind == "O":
                data: Any = serialize_bytes(a)
                n = len(data)
            else:
                n = a.nbytes
                data = a.data
            if off + n > cap:  # rare: grow, then start over
                del ints[base:]
                old = slab
                holder.slab = Slab.create(_total(arrays))
                old.close()
                self._place(arrays, ints)
                return [holder.slab.fd]
            if n:
                try:
                    mv[off : off + n] = data.cast("B") if data.__class__ is memoryview else data
                except TypeError:  # not C-contiguous (never from the core)
                    mv[off : off + n] = np.ascontiguousarray(a).data.cast("B")
            ints.append(n)
            ints.append(a.ndim)
            ints += a.shape
            off = (off + n + 63) & -64
        return fds

    def close(self) -> None:
        self.slab.close()


def _CODE_OF(arr: np.ndarray) -> int:
    return OBJECT if arr.dtype.kind in "OSU" else _CODE[arr.dtype.str]


def _total(arrays: list[np.ndarray]) -> int:
    """Slab bytes for a batch's arrays (BYTES at their serialized size)."""
    total = 0
    for a in arrays:
        total = aligned(total + (len(serialize_bytes(a)) if a.dtype.kind == "O" else a.nbytes))
    return total


# -------------------------------------------------------------------- batches (child side)


class BatchReader:
    """Child side: an ``EXEC`` message back into what ``ExecuteBatch`` needs."""

    __slots__ = ("_layout", "_osets", "_views", "reader")

    def __init__(self) -> None:
        self.reader = SlabReader()
        self._layout: tuple[list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]] | None = None
        self._osets: dict[int, tuple[str, ...]] = {}
        self._views: dict[bytes, tuple[Any, ...]] = {}

    def decode(self, body: memoryview, fds: list[int], instance: int, batched: bool) -> tuple[int, ExecuteBatch]:
        """(token, the batch; its ``responder`` is for the caller to set)."""
        _kind, flags, described, nints, ntail, token = _EXEC.unpack_from(body)
        pos = _EXEC.size
        ints = ints_struct(nints).unpack_from(body, pos)
        pos += nints * 8
        if flags & X_SLAB:
            self.reader.take(fds)
            self._views = {}
        tail: dict[str, Any] = marshal.loads(body[pos : pos + ntail]) if flags & X_TAIL else {}
        if "layout" in tail:
            self._layout = tail["layout"]
            self._views = {}
        for oid, names in tail.get("osets", ()):
            self._osets[oid] = names
        layout = self._layout
        assert layout is not None, "the first batch carries the layout"
        size, nreq = ints[0], ints[1]
        p = described
        # Views onto the slab depend only on the descriptors: reuse them batch after batch.
        key = body[_EXEC.size + 16 : _EXEC.size + p * 8].tobytes()
        cached = None if flags & X_STR_CORRID else self._views.get(key)
        if cached is None:
            cached = self._tensors(ints, 2, layout, bool(flags & X_STR_CORRID))
            if not flags & X_STR_CORRID and not cached[-1] and len(self._views) < 64:
                self._views[key] = cached
        inputs, states, controls, start, end, ready, corrid, _has_bytes = cached
        if flags & X_ROWS:
            rows = list(ints[p : p + nreq])
            p += nreq
        else:
            rows = [1] * nreq
        osets = self._osets
        outputs = [None if o < 0 else osets[o] for o in ints[p : p + nreq]]
        ids = tail.get("ids") or [""] * nreq
        ragged = tail.get("ragged")
        return token, ExecuteBatch(
            size=size,
            instance=instance,
            inputs=dict(inputs),
            states=dict(states),
            controls=dict(controls),
            start=start,
            end=end,
            ready=ready,
            corrid=corrid,
            request_rows=rows,
            request_outputs=outputs,
            request_ids=ids,
            ragged={name: RaggedInput(shapes) for name, shapes in ragged.items()} if ragged else {},
            batched=batched,
        )

    def _tensors(
        self,
        ints: tuple[int, ...],
        p: int,
        layout: tuple[list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]],
        str_corrid: bool,
    ) -> tuple[Any, ...]:
        reader = self.reader
        off = 0
        has_bytes = False

        def nxt(code: int) -> np.ndarray:
            nonlocal p, off, has_bytes
            n, ndim = ints[p], ints[p + 1]
            shape = ints[p + 2 : p + 2 + ndim]
            p += 2 + ndim
            arr = reader.tensor(code, n, off, shape)
            has_bytes |= code == OBJECT
            off = aligned(off + n)
            return arr

        groups = [{name: nxt(code) for name, code in group} for group in layout]
        start, end, ready = nxt(0), nxt(0), nxt(0)
        if str_corrid:
            raw = nxt(OBJECT)
            corrid = np.empty(len(raw), dtype=object)
            for i, item in enumerate(raw):
                corrid[i] = item[1:].decode("utf-8", "surrogateescape") if item[:1] == b"s" else int(item[1:])
        else:
            corrid = nxt(8)
        return (*groups, start, end, ready, corrid, has_bytes)

    def close(self) -> None:
        self.reader.close()
        self._views = {}


# -------------------------------------------------------------------- results (child side)


class ResultWriter:
    """Child side: what ``execute`` returned into the reply slab and a ``RESULT`` message.

    Tensors whose names are not outputs or output states of the model are left out (the
    server would ignore them)."""

    __slots__ = ("_ids", "slab")

    def __init__(self, names: tuple[str, ...]) -> None:
        self._ids = {n: i for i, n in enumerate(names)}
        self.slab = SlabWriter()

    def encode(self, produced: Any) -> tuple[bytes, list[int]]:
        if produced.__class__ is dict and self.slab.slab is not None:
            fast = self._encode_plain(produced, self.slab.slab)
            if fast is not None:
                return fast, []
        ids = self._ids
        items: list[tuple[int, Any, int, tuple[int, ...]]] = []
        names: list[tuple[int, int]] = []  # (name id, entries of a list, or -1 for one tensor)
        batched: Mapping[str, Any] = produced if produced is not None else {}
        for name, value in batched.items():
            nid = ids.get(name)
            if nid is None or value is None:
                continue
            if isinstance(value, list | tuple):  # one array per request (ragged outputs)
                names.append((nid, len(value)))
                items.extend(_NONE_ITEM if v is None else _prepared(v) for v in value)
            else:
                names.append((nid, -1))
                items.append(_prepared(value))
        flags = 0
        per_request: list[tuple[int, Any]] = []  # (kind, payload)
        outcomes = getattr(produced, "outcomes", None)
        if outcomes is not None:
            flags |= R_REQUESTS
            for outcome in outcomes:
                if outcome is DEFERRED:
                    per_request.append((O_DEFERRED, None))
                elif outcome is None:
                    per_request.append((O_NONE, None))
                elif isinstance(outcome, InferenceError):
                    per_request.append((O_ERROR, outcome))
                else:
                    mine = []
                    for name, value in outcome.items():
                        nid = ids.get(name)
                        if nid is not None and value is not None:
                            items.append(_prepared(value))
                            mine.append(nid)
                    per_request.append((O_TENSORS, mine))
        offsets, fds = self.slab.place(items)
        if fds:
            flags |= R_SLAB
        ints: list[int] = [len(names)]
        k = 0
        for nid, entries in names:
            if entries < 0:
                _describe(ints, nid, items[k], offsets[k])
                k += 1
                continue
            ints += (nid, LIST, entries, 0, 0)
            for _ in range(entries):
                _describe_entry(ints, items[k], offsets[k])
                k += 1
        text: list[bytes] = []
        if flags & R_REQUESTS:
            ints.append(len(per_request))
            for kind, payload in per_request:
                ints.append(kind)
                if kind == O_ERROR:
                    msg = payload.message.encode("utf-8", "surrogateescape")
                    ints += (int(payload.code), len(msg))
                    text.append(msg)
                elif kind == O_TENSORS:
                    ints.append(len(payload))
                    for nid in payload:
                        _describe(ints, nid, items[k], offsets[k])
                        k += 1
        blob = b"".join(text)
        return _RESULT.pack(RESULT, flags, 0, len(ints), len(blob)) + ints_struct(len(ints)).pack(*ints) + blob, fds

    def _encode_plain(self, produced: dict[str, Any], slab: Slab) -> bytes | None:
        """The common case in one pass: a dict of native numeric arrays that fit the slab as
        it is. None: take the general path."""
        ids = self._ids
        mv, cap = slab.mv, slab.size
        ints: list[int] = [0]
        off = 0
        count = 0
        for name, value in produced.items():
            nid = ids.get(name)
            if nid is None or value is None:
                continue
            if value.__class__ is not np.ndarray:
                return None
            code = _FAST_CODE.get(value.dtype)
            n = value.nbytes
            if code is None or off + n > cap:
                return None
            if n:
                try:
                    mv[off : off + n] = value.data.cast("B")
                except TypeError:  # not C-contiguous
                    return None
            ints += (nid, code, n, off, value.ndim, *value.shape)
            off = (off + n + 63) & -64
            count += 1
        ints[0] = count
        return _RESULT.pack(RESULT, 0, 0, len(ints), 0) + ints_struct(len(ints)).pack(*ints)

    def close(self) -> None:
        self.slab.close()


# ------------------------------------------------------------------- results (parent side)


class ResultReader:
    """Parent side: a ``RESULT`` message into the mapping ``execute`` returns (views onto the
    child's reply slab; the engine copies what it keeps before the next batch)."""

    __slots__ = ("_names", "_plain", "reader")

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self.reader = SlabReader()
        # plain results (one dict of numeric arrays) by their message: the same shapes give
        # the same views, batch after batch
        self._plain: dict[bytes, dict[str, np.ndarray]] = {}

    def decode(self, body: memoryview, fds: list[int]) -> tuple[dict[str, np.ndarray], list[Any] | None]:
        """(batched tensors, per-request outcomes or None)."""
        if len(body) < _RESULT.size:
            raise ProtocolError("short result")
        _kind, flags, _pad, nints, ntext = _RESULT.unpack_from(body)
        key = body.tobytes() if flags == 0 else b""
        if key and not fds:
            hit = self._plain.get(key)
            if hit is not None:
                return dict(hit), None
        if _RESULT.size + nints * 8 + ntext != len(body):
            raise ProtocolError("result size mismatch")
        if flags & R_SLAB:
            if not fds:
                raise ProtocolError("a new reply slab was announced without its descriptor")
            self.reader.take(fds)
            self._plain = {}
        ints = ints_struct(nints).unpack_from(body, _RESULT.size)
        text = body[_RESULT.size + nints * 8 :]
        names = self._names
        try:
            batched, pos = _read_tensors(self.reader, ints, 1, ints[0], names)
            if not flags & R_REQUESTS:
                if (
                    key
                    and len(self._plain) < 64
                    and all(v.__class__ is np.ndarray and v.dtype.kind != "O" for v in batched.values())
                ):
                    self._plain[key] = batched
                    return dict(batched), None
                return batched, None
            count = ints[pos]
            pos += 1
            if not 0 <= count <= _MAX_COUNT:
                raise ProtocolError("bad outcome count")
            outcomes: list[Any] = []
            tpos = 0
            for _ in range(count):
                kind = ints[pos]
                pos += 1
                if kind == O_DEFERRED:
                    outcomes.append(DEFERRED)
                elif kind == O_NONE:
                    outcomes.append(None)
                elif kind == O_ERROR:
                    code, n = ints[pos], ints[pos + 1]
                    pos += 2
                    if n < 0 or tpos + n > len(text):
                        raise ProtocolError("bad error text")
                    msg = bytes(text[tpos : tpos + n]).decode("utf-8", "replace")
                    tpos += n
                    try:
                        outcomes.append(InferenceError(Code(code), msg))
                    except ValueError:
                        outcomes.append(InferenceError(Code.INTERNAL, msg))
                elif kind == O_TENSORS:
                    tensors, pos = _read_tensors(self.reader, ints, pos + 1, ints[pos], names)
                    outcomes.append(tensors)
                else:
                    raise ProtocolError(f"unknown outcome kind {kind}")
            if pos != len(ints):
                raise ProtocolError("trailing result data")
            return batched, outcomes
        except (IndexError, ValueError) as e:
            raise ProtocolError(f"malformed result: {e}") from None

    def close(self) -> None:
        self.reader.close()


# ------------------------------------------------------------------------ responses (SEND)


class ResponseWriter:
    """Child side: one response of one request into the response slab and a ``SEND``."""

    __slots__ = ("_ids", "slab")

    def __init__(self, names: tuple[str, ...]) -> None:
        self._ids = {n: i for i, n in enumerate(names)}
        self.slab = SlabWriter()

    def encode(self, token: int, index: int, outcome: Any, final: bool) -> tuple[bytes, list[int]]:
        if outcome is None:
            return _SEND.pack(SEND, final, O_NONE, 0, 0, index, token), []
        if isinstance(outcome, InferenceError):
            msg = outcome.message.encode("utf-8", "surrogateescape")
            return _SEND.pack(SEND, final, O_ERROR, int(outcome.code), 0, index, token) + msg, []
        items = []
        nids = []
        for name, value in outcome.items():
            nid = self._ids.get(name)
            if nid is not None and value is not None:
                items.append(_prepared(value))
                nids.append(nid)
        offsets, fds = self.slab.place(items)
        ints: list[int] = [len(nids)]
        for k, nid in enumerate(nids):
            _describe(ints, nid, items[k], offsets[k])
        head = _SEND.pack(SEND, final, O_TENSORS, 1 if fds else 0, len(ints), index, token)
        return head + ints_struct(len(ints)).pack(*ints), fds

    def close(self) -> None:
        self.slab.close()


def encode_cancelled_query(token: int, index: int) -> bytes:
    return _SEND.pack(CANCELLED, 0, 0, 0, 0, index, token)


_LOG = struct.Struct("<BIH")  # kind, level, name length (then the name and the text, utf-8)


def encode_log(level: int, name: str, text: str) -> bytes:
    raw = name.encode("utf-8", "replace")[:1024]
    return _LOG.pack(LOG, max(0, int(level)), len(raw)) + raw + text.encode("utf-8", "replace")


def decode_log(body: memoryview) -> tuple[int, str, str]:
    if len(body) < _LOG.size:
        raise ProtocolError("short log record")
    _kind, level, n = _LOG.unpack_from(body)
    name = bytes(body[_LOG.size : _LOG.size + n]).decode("utf-8", "replace")
    return min(level, 100), name, bytes(body[_LOG.size + n :]).decode("utf-8", "replace")


class EventReader:
    """Parent side: decodes ``SEND``/``CANCELLED`` from a child."""

    __slots__ = ("_names", "reader")

    def __init__(self, names: tuple[str, ...]) -> None:
        self._names = names
        self.reader = SlabReader()

    def decode(self, body: memoryview, fds: list[int]) -> tuple[int, int, int, bool, Any]:
        """(kind, token, index, final, outcome): outcome is None, an InferenceError or a dict
        of views onto the response slab."""
        if len(body) < _SEND.size:
            raise ProtocolError("short event")
        kind, final, okind, code, nints, index, token = _SEND.unpack_from(body)
        if kind == CANCELLED:
            return kind, token, index, False, None
        if kind != SEND:
            raise ProtocolError(f"unexpected event kind {kind}")
        if okind == O_NONE:
            return kind, token, index, bool(final), None
        if okind == O_ERROR:
            try:
                c = Code(code)
            except ValueError:
                c = Code.INTERNAL
            text = bytes(body[_SEND.size :]).decode("utf-8", "replace")
            return kind, token, index, bool(final), InferenceError(c, text)
        if okind != O_TENSORS or _SEND.size + nints * 8 != len(body) or nints < 1:
            raise ProtocolError("malformed response")
        if code:  # a new response slab
            if not fds:
                raise ProtocolError("a new response slab was announced without its descriptor")
            self.reader.take(fds)
        ints = ints_struct(nints).unpack_from(body, _SEND.size)
        try:
            tensors, pos = _read_tensors(self.reader, ints, 1, ints[0], self._names)
        except (IndexError, ValueError) as e:
            raise ProtocolError(f"malformed response: {e}") from None
        if pos != nints:
            raise ProtocolError("trailing response data")
        return kind, token, index, bool(final), tensors

    def close(self) -> None:
        self.reader.close()


def encode_ok() -> bytes:
    return _KIND.pack(OK)


def encode_bool(value: bool) -> bytes:
    return _BOOL.pack(BOOL, bool(value))


def decode_reply(body: memoryview) -> bool | InferenceError:
    """Child side: the parent's answer to an event (True for OK)."""
    kind = kind_of(body)
    if kind == OK:
        return True
    if kind == BOOL:
        return bool(body[1])
    if kind == ERR:
        return read_code_message(body)
    raise ProtocolError(f"unexpected reply kind {kind}")
