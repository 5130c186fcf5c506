"""Batches over the slab: the parent writes a batch, the child reads it."""

from __future__ import annotations

import marshal
from typing import Any

import numpy as np

from seqserve.engine.batch import ExecuteBatch, RaggedInput

# message kinds: parent -> child (batch channel)
from seqserve.engine.isolation.protocol import (
    DTYPE_CODE,
    EXEC,
    EXEC_HEAD,
    OBJECT,
    X_ROWS,
    X_SLAB,
    X_STR_CORRID,
    X_TAIL,
    SlabReader,
    SlabWriter,
    ints_struct,
)
from seqserve.engine.isolation.slab import Slab, aligned
from seqserve.engine.tensors import serialize_bytes

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
                [(k, _dtype_code(a)) for k, a in inputs.items()],
                [(k, _dtype_code(a)) for k, a in states.items()],
                [(k, _dtype_code(a)) for k, a in controls.items()],
            )
            self._layout_sent = True
        if tail:
            flags |= X_TAIL
            blob = marshal.dumps(tail)
            head = EXEC_HEAD.pack(EXEC, flags, described, len(ints), len(blob), token)
            return head + ints_struct(len(ints)).pack(*ints) + blob, fds
        return EXEC_HEAD.pack(EXEC, flags, described, len(ints), 0, token) + ints_struct(len(ints)).pack(*ints), fds

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


def _dtype_code(arr: np.ndarray) -> int:
    return OBJECT if arr.dtype.kind in "OSU" else DTYPE_CODE[arr.dtype.str]


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
        _kind, flags, described, nints, ntail, token = EXEC_HEAD.unpack_from(body)
        pos = EXEC_HEAD.size
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
        key = body[EXEC_HEAD.size + 16 : EXEC_HEAD.size + p * 8].tobytes()
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
