"""The sending half of an HTTP/2 connection: each stream's state and outbox, the client's
windows and frame size, and the framing of header blocks and DATA. ``H2Connection`` owns one
``Outbound`` and gives it the bytes sink and what to tell it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from seqserve.api.transport.h2_frames import (
    CONTINUATION,
    DATA,
    DEFAULT_FRAME_SIZE,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    HEADERS,
    MAX_WINDOW,
    STREAM_WINDOW,
    ProtocolError,
    frame,
    frame_header,
)
from seqserve.api.transport.h2_hpack import DEFAULT_TABLE_SIZE, table_size_update


class StreamState:
    """One stream's windows, halves and outbox. The connection changes it; the layer above
    reads it (``local_open``, ``remote_open``, ``outbox``, ``progress``)."""

    __slots__ = (
        "content_left",
        "id",
        "local_open",
        "outbox",
        "owner",
        "progress",
        "recv_unacked",
        "recv_window",
        "remote_open",
        "send_window",
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int, now: float, owner: Any) -> None:
        self.id = stream_id
        self.owner = owner  # the layer above's object for the stream (events carry the state)
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW  # what the client may still send
        self.recv_unacked = 0  # bytes received and consumed whose window is not yet given back
        self.remote_open = True  # the client may still send
        self.local_open = True  # we may still send
        # (DATA payload or header block, kind) waiting for window
        self.outbox: list[tuple[bytes | memoryview, int]] | None = None
        self.progress = now  # when its request or its reply last moved
        self.content_left = -1  # DATA still due by the request's content-length (-1: none given)


class Outbound:
    """What this side sends, within the client's windows (``window`` is the connection's,
    each ``StreamState.send_window`` a stream's) and frame size (``max_frame``). A stream whose
    DATA does not fit waits in its outbox, sliced without copying as the windows open; its
    trailers wait behind it. ``on_drained`` is told when an outbox empties, ``on_local_end`` when a
    stream's last frame went out."""

    __slots__ = (
        "_blocked",
        "_clock",
        "_on_drained",
        "_on_local_end",
        "_write",
        "initial_window",
        "max_frame",
        "table_size",
        "table_update",
        "window",
    )

    def __init__(
        self,
        write: Callable[[bytes], None],
        on_drained: Callable[[StreamState], None],
        on_local_end: Callable[[StreamState], None],
        clock: Callable[[], float],
    ) -> None:
        self._write = write
        self._on_drained = on_drained
        self._on_local_end = on_local_end
        self._clock = clock
        self.window = DEFAULT_WINDOW
        self.initial_window = DEFAULT_WINDOW  # a new stream's (the client's SETTINGS)
        self.max_frame = DEFAULT_FRAME_SIZE
        self._blocked: dict[int, StreamState] = {}  # streams with DATA waiting for the connection's window
        # the HPACK dynamic table size the client's decoder has from us (RFC 7541 4.2); never
        # used (no block inserts), but a client that lowers it must be told, in the next block
        self.table_size = DEFAULT_TABLE_SIZE
        self.table_update = b""

    def decoder_table_size(self, size: int) -> None:
        """The client's SETTINGS_HEADER_TABLE_SIZE: when it is below the size in use, the next
        header block sent begins with a dynamic table size update to 0 (RFC 7541 6.3); 0 is
        below any size the client may set later, so once is enough."""
        if size < self.table_size:
            self.table_size = 0
            self.table_update = table_size_update(0)

    def change_initial_window(self, window: int, streams: list[StreamState]) -> None:
        """The client's SETTINGS_INITIAL_WINDOW_SIZE changed: every open stream's window moves by
        the difference (RFC 9113 6.9.2), and what waited on it goes out."""
        delta = window - self.initial_window
        self.initial_window = window
        for s in streams:
            s.send_window += delta
            if s.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "stream window over 2^31-1")
        for s in streams:
            if s.outbox is not None and s.send_window > 0 and self.window > 0:
                self.flush(s)

    def forget(self, stream_id: int) -> None:
        self._blocked.pop(stream_id, None)

    def clear(self) -> None:
        self._blocked.clear()

    def flush_blocked(self) -> None:
        """The connection's window grew: send what waited on it."""
        for s in list(self._blocked.values()):
            if self.window <= 0:
                return
            self.flush(s)

    def headers(self, s: StreamState, block: bytes, end_stream: bool = False) -> None:
        """A header block (or trailers, with ``end_stream``) for a stream. Queued behind DATA
        that waits for window, so that trailers never overtake the message."""
        if not s.local_open:
            return
        if end_stream:
            s.local_open = False
        if s.outbox is not None:
            s.outbox.append((block, HEADERS | (END_STREAM << 8 if end_stream else 0)))
            return
        self._write(self.header_frames(s.id, block, end_stream))
        if end_stream:
            self._on_local_end(s)

    def header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        """The frames of a header block, written now (a table size update due leads it)."""
        if self.table_update:
            block, self.table_update = self.table_update + block, b""
        flags = END_STREAM if end_stream else 0
        limit = self.max_frame
        if len(block) <= limit:
            return frame_header(HEADERS, flags | END_HEADERS, sid, len(block)) + block
        parts = [block[i : i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, sid, parts[0])]
        out += [frame(CONTINUATION, 0, sid, p) for p in parts[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, sid, parts[-1]))
        return b"".join(out)

    def data(self, s: StreamState, data: bytes) -> bool:
        """Send ``data`` on a stream as far as both windows allow; the rest waits in the stream's
        outbox. Returns whether all of it went out."""
        if not s.local_open:
            return True
        if s.outbox is not None:
            s.outbox.append((memoryview(data), DATA))
            return False
        n = len(data)
        if n <= s.send_window and n <= self.window and n <= self.max_frame:
            s.send_window -= n
            self.window -= n
            self._write(frame_header(DATA, 0, s.id, n))
            self._write(data)  # joined with the header once, with the turn's other writes
            return True
        s.outbox = [(memoryview(data), DATA)]  # sliced as it goes, without copying the rest
        self.flush(s)
        return s.outbox is None

    def reply(self, s: StreamState, headers: bytes, data: bytes, trailers: bytes) -> None:
        """A whole reply: headers, ``data`` (one message, framed) and trailers, in one write when
        the windows take the DATA at once (a unary call's reply, nearly always)."""
        if not s.local_open:
            return
        n = len(data)
        limit = self.max_frame
        if (
            n > s.send_window
            or n > self.window
            or n > limit
            or s.outbox is not None
            or self.table_update
            or len(headers) > limit
            or len(trailers) > limit
        ):
            self.headers(s, headers)
            self.data(s, data)
            self.headers(s, trailers, end_stream=True)
            return
        s.send_window -= n
        self.window -= n
        sid = s.id
        s.local_open = False
        self._write(
            b"".join(
                (
                    frame_header(HEADERS, END_HEADERS, sid, len(headers)),
                    headers,
                    frame_header(DATA, 0, sid, n),
                    data,
                    frame_header(HEADERS, END_HEADERS | END_STREAM, sid, len(trailers)),
                    trailers,
                )
            )
        )
        self._on_local_end(s)

    def flush(self, s: StreamState) -> None:
        """Send what the windows allow of a stream's outbox. A stream left waiting on the
        connection's window is kept in ``_blocked`` (a connection WINDOW_UPDATE flushes those
        only); one waiting on its own window is flushed by its own WINDOW_UPDATE."""
        outbox = s.outbox
        assert outbox is not None
        out: list[bytes | memoryview] = []
        while outbox:
            item, kind = outbox[0]
            if kind == DATA:
                room = min(s.send_window, self.window)
                if room <= 0 and item:
                    break
                chunk_size = min(room, self.max_frame, len(item))
                out += (frame_header(DATA, 0, s.id, chunk_size), item[:chunk_size])
                s.send_window -= chunk_size
                self.window -= chunk_size
                if chunk_size < len(item):
                    outbox[0] = (item[chunk_size:], DATA)
                    continue
            else:
                end_stream = bool(kind >> 8)
                out.append(self.header_frames(s.id, bytes(item), end_stream))
            outbox.pop(0)
        if out:
            self._write(b"".join(out))
            s.progress = self._clock()
        if not outbox:
            s.outbox = None
            self._blocked.pop(s.id, None)
            if not s.local_open:
                self._on_local_end(s)
            self._on_drained(s)
        elif s.send_window <= 0:
            self._blocked.pop(s.id, None)
        else:
            self._blocked[s.id] = s
