"""Results, responses, logs and events: the child writes them, the parent reads them."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from seqserve.engine.errors import Code, InferenceError

# message kinds: parent -> child (batch channel)
from seqserve.engine.isolation.protocol import (
    BOOL,
    BOOL_HEAD,
    CANCELLED,
    ERR,
    KIND_HEAD,
    LIST,
    LOG,
    MAX_COUNT,
    NATIVE_DTYPE_CODE,
    NONE_ITEM,
    O_DEFERRED,
    O_ERROR,
    O_NONE,
    O_TENSORS,
    OK,
    R_REQUESTS,
    R_SLAB,
    RESULT,
    RESULT_HEAD,
    SEND,
    SEND_HEAD,
    ProtocolError,
    SlabReader,
    SlabWriter,
    describe_entry,
    describe_tensor,
    ints_struct,
    kind_of,
    prepared,
    read_code_message,
    read_tensors,
)
from seqserve.engine.isolation.slab import Slab
from seqserve.engine.responses import DEFERRED

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
                items.extend(NONE_ITEM if v is None else prepared(v) for v in value)
            else:
                names.append((nid, -1))
                items.append(prepared(value))
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
                            items.append(prepared(value))
                            mine.append(nid)
                    per_request.append((O_TENSORS, mine))
        offsets, fds = self.slab.place(items)
        if fds:
            flags |= R_SLAB
        ints: list[int] = [len(names)]
        k = 0
        for nid, entries in names:
            if entries < 0:
                describe_tensor(ints, nid, items[k], offsets[k])
                k += 1
                continue
            ints += (nid, LIST, entries, 0, 0)
            for _ in range(entries):
                describe_entry(ints, items[k], offsets[k])
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
                        describe_tensor(ints, nid, items[k], offsets[k])
                        k += 1
        blob = b"".join(text)
        return RESULT_HEAD.pack(RESULT, flags, 0, len(ints), len(blob)) + ints_struct(len(ints)).pack(*ints) + blob, fds

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
            code = NATIVE_DTYPE_CODE.get(value.dtype)
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
        return RESULT_HEAD.pack(RESULT, 0, 0, len(ints), 0) + ints_struct(len(ints)).pack(*ints)

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
        if len(body) < RESULT_HEAD.size:
            raise ProtocolError("short result")
        _kind, flags, _pad, nints, ntext = RESULT_HEAD.unpack_from(body)
        key = body.tobytes() if flags == 0 else b""
        if key and not fds:
            hit = self._plain.get(key)
            if hit is not None:
                return dict(hit), None
        if RESULT_HEAD.size + nints * 8 + ntext != len(body):
            raise ProtocolError("result size mismatch")
        if flags & R_SLAB:
            if not fds:
                raise ProtocolError("a new reply slab was announced without its descriptor")
            self.reader.take(fds)
            self._plain = {}
        ints = ints_struct(nints).unpack_from(body, RESULT_HEAD.size)
        text = body[RESULT_HEAD.size + nints * 8 :]
        names = self._names
        try:
            batched, pos = read_tensors(self.reader, ints, 1, ints[0], names)
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
            if not 0 <= count <= MAX_COUNT:
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
                    tensors, pos = read_tensors(self.reader, ints, pos + 1, ints[pos], names)
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
            return SEND_HEAD.pack(SEND, final, O_NONE, 0, 0, index, token), []
        if isinstance(outcome, InferenceError):
            msg = outcome.message.encode("utf-8", "surrogateescape")
            return SEND_HEAD.pack(SEND, final, O_ERROR, int(outcome.code), 0, index, token) + msg, []
        items = []
        nids = []
        for name, value in outcome.items():
            nid = self._ids.get(name)
            if nid is not None and value is not None:
                items.append(prepared(value))
                nids.append(nid)
        offsets, fds = self.slab.place(items)
        ints: list[int] = [len(nids)]
        for k, nid in enumerate(nids):
            describe_tensor(ints, nid, items[k], offsets[k])
        head = SEND_HEAD.pack(SEND, final, O_TENSORS, 1 if fds else 0, len(ints), index, token)
        return head + ints_struct(len(ints)).pack(*ints), fds

    def close(self) -> None:
        self.slab.close()


def encode_cancelled_query(token: int, index: int) -> bytes:
    return SEND_HEAD.pack(CANCELLED, 0, 0, 0, 0, index, token)


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
        if len(body) < SEND_HEAD.size:
            raise ProtocolError("short event")
        kind, final, okind, code, nints, index, token = SEND_HEAD.unpack_from(body)
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
            text = bytes(body[SEND_HEAD.size :]).decode("utf-8", "replace")
            return kind, token, index, bool(final), InferenceError(c, text)
        if okind != O_TENSORS or SEND_HEAD.size + nints * 8 != len(body) or nints < 1:
            raise ProtocolError("malformed response")
        if code:  # a new response slab
            if not fds:
                raise ProtocolError("a new response slab was announced without its descriptor")
            self.reader.take(fds)
        ints = ints_struct(nints).unpack_from(body, SEND_HEAD.size)
        try:
            tensors, pos = read_tensors(self.reader, ints, 1, ints[0], self._names)
        except (IndexError, ValueError) as e:
            raise ProtocolError(f"malformed response: {e}") from None
        if pos != nints:
            raise ProtocolError("trailing response data")
        return kind, token, index, bool(final), tensors

    def close(self) -> None:
        self.reader.close()


def encode_ok() -> bytes:
    return KIND_HEAD.pack(OK)


def encode_bool(value: bool) -> bytes:
    return BOOL_HEAD.pack(BOOL, bool(value))


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
