"""HTTP/2 (RFC 9113) for the builtin gRPC server: one ``asyncio.Protocol`` per connection that
parses frames, keeps both directions' flow control and hands each stream's headers and data to
a stream object of the layer above (``grpc_builtin``).

It implements what a gRPC server needs and nothing else: no server push, no priorities (parsed
and ignored), a reply header block without the dynamic table (so the encoder keeps no state),
HPACK decoding by the ``hpack`` library. Every size is checked before it is kept:

- a frame over ``MAX_FRAME_SIZE`` (advertised) is a FRAME_SIZE_ERROR;
- a header block over ``MAX_HEADER_BLOCK`` (HEADERS plus CONTINUATION, compressed) ends the
  connection, and a decoded one over ``max_header_list_bytes`` fails its stream;
- a stream or the connection sending more than its window is a FLOW_CONTROL_ERROR; windows are
  given back as the layer above consumes what it was sent (``Stream.consumed``);
- streams beyond ``max_concurrent_streams`` are refused (REFUSED_STREAM), and a client that
  resets streams faster than ``MAX_RESETS_PER_S`` gets a GOAWAY (the "rapid reset" attack);
- at most ``FRAMES_PER_TURN`` frames are handled per loop turn, so one read of tiny frames
  cannot hold the event loop; reading pauses while the client does not read what it is sent
  (a flood of PINGs or SETTINGS cannot grow the write buffer).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import hpack
import hpack.exceptions

log = logging.getLogger("seqserve.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# flags
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB
# settings
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
#: the largest frame a client may send (advertised): fewer frames per large tensor
MAX_FRAME_SIZE = 1 << 20
#: each stream's receive window (advertised); the connection's is raised to CONNECTION_WINDOW
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
#: a compressed header block (HEADERS and its CONTINUATIONs) larger than this, or with more
#: than MAX_HEADER_FIELDS fields, ends the connection: hpack copies the rest of the block for
#: every literal it decodes, so its cost grows with fields x bytes (16 ms for 16 KiB of empty
#: literals); the two bounds keep one block under a millisecond
MAX_HEADER_BLOCK = 20 << 10
MAX_HEADER_FIELDS = 128
#: hpack's own bound on a decoded header list, against decompression bombs; the stream's limit
#: (``max_header_list_bytes``) is checked after decoding, so that the HPACK state stays in step
_HPACK_LIST_CAP = 64 << 10
#: frames that carry nothing a gRPC client needs to send often (SETTINGS, PRIORITY, empty DATA)
#: a client may send per second, averaged over CONTROL_WINDOW_S, before it gets a GOAWAY
#: (ENHANCE_YOUR_CALM); a SETTINGS frame that changes the initial window counts once more per
#: 64 open streams (it is applied to each). PING and WINDOW_UPDATE are not counted: grpc core
#: sends them as often as data flows (flow control, bandwidth probes), and each costs a few µs;
#: a flood of them is bounded like any traffic (FRAMES_PER_TURN, reading paused while the
#: client does not read the PING answers)
MAX_CONTROL_FRAMES_PER_S = 1000
CONTROL_WINDOW_S = 2.0
#: entries in one SETTINGS frame (RFC 9113 defines 6; nghttp2 allows 32)
MAX_SETTINGS_ENTRIES = 32
#: streams a client may reset per second (averaged over RESET_WINDOW_S) before it is sent away
MAX_RESETS_PER_S = 200
RESET_WINDOW_S = 2.0
#: decoded header blocks kept per connection (see ``Http2Connection._decode``)
_BLOCK_CACHE = 64
#: after a GOAWAY and close, the longest the socket waits for the client to read what is left
CLOSE_TIMEOUT_S = 5.0
#: frames handled per loop turn before the rest waits for the next turn
FRAMES_PER_TURN = 256

#: the cache reads hpack's table (``header_table.dynamic_entries``, ``maxsize``: hpack 4.x);
#: without them every block is decoded
_CACHE_BLOCKS = all(hasattr(hpack.Decoder().header_table, a) for a in ("dynamic_entries", "maxsize"))

_FRAME_HEADER = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return _FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


# ---------------------------------------------------------------------- HPACK (encoding)


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with ``first`` holding the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding: the encoder
    never touches the dynamic table, so it needs no state and the client's table size is moot."""
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


STATUS_200 = b"\x88"  # static table index 8


class ConnectionError_(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """A stream as the connection sees it. The layer above subclasses it and implements
    ``on_data``, ``on_end`` and ``on_reset``; it sends with the connection's ``send_*``."""

    __slots__ = (
        "conn",
        "drained",
        "id",
        "local_open",
        "outbox",
        "progress",
        "recv_unacked",
        "recv_window",
        "remote_open",
        "send_window",
    )  # fmt: skip

    def __init__(self, conn: Http2Connection, stream_id: int) -> None:
        self.id = stream_id
        self.conn = conn
        self.send_window = conn.peer_initial_window
        self.recv_window = STREAM_WINDOW  # what the client may still send
        self.recv_unacked = 0  # bytes received and consumed whose window is not yet given back
        self.remote_open = True  # the client may still send
        self.local_open = True  # we may still send
        # (DATA payload or header block, kind) waiting for window
        self.outbox: list[tuple[bytes | memoryview, int]] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.progress = conn.loop.time()  # when its request or its reply last moved

    def on_data(self, data: bytes) -> None:
        raise NotImplementedError

    def on_end(self) -> None:
        """The client half-closed the stream (END_STREAM)."""
        raise NotImplementedError

    def on_reset(self) -> None:
        """The stream ended abnormally: the client reset it or the connection closed."""
        raise NotImplementedError

    def consumed(self, n: int) -> None:
        """The layer above has taken ``n`` bytes of DATA: give the window back in batches."""
        self.recv_unacked += n
        if self.recv_unacked >= STREAM_WINDOW // 4 and self.remote_open and self.id in self.conn.streams:
            self.conn.write(frame(WINDOW_UPDATE, 0, self.id, _U32.pack(self.recv_unacked)))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0


class Http2Connection(asyncio.Protocol):
    """A server-side HTTP/2 connection. Subclasses implement ``open_stream`` (a new request's
    headers) and may override ``connection_lost``."""

    def __init__(
        self,
        *,
        max_concurrent_streams: int,
        max_header_list_bytes: int,
    ) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.max_header_list_bytes = max_header_list_bytes
        self.transport: Any = None  # uvloop's transports are no asyncio.Transport subclasses
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0  # the highest stream id the client opened
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME_SIZE
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.recv_window = CONNECTION_WINDOW
        self.recv_unacked = 0
        self.decoder = hpack.Decoder(max_header_list_size=_HPACK_LIST_CAP)
        self._blocks: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self.closed = False
        self.goaway_sent = False
        self.peer_goaway = False
        self._buf = bytearray()
        self._out: list[bytes] = []  # written this turn of the loop (``write``)
        self._preface = False
        self.settings_seen = False
        self._continuation: tuple[int, int, bytearray] | None = None  # stream id, flags, block
        self._read_paused_by: set[str] = set()
        self._turn_handle: asyncio.Handle | None = None
        self._abort_handle: asyncio.TimerHandle | None = None
        self._resets = 0
        self._reset_window_start = 0.0
        self._controls = 0
        self._control_start = 0.0
        self._reset_by_us: dict[int, None] = {}  # recent stream ids we reset (their late frames are ignored)
        self._blocked: dict[int, Stream] = {}  # streams with DATA waiting for window
        self.write_paused = False
        self.loop = asyncio.get_running_loop()
        self.last_active = self.loop.time()

    # ------------------------------------------------------------------ the layer above

    def open_stream(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> Stream | None:
        """A request's headers: return its stream, or None when it was answered already (and
        ended with ``send_headers(..., end_stream=True)``)."""
        raise NotImplementedError

    def idle_changed(self) -> None:
        """Called when the connection's last stream closes."""

    # ------------------------------------------------------------------------ transport

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        settings = b"".join(
            _SETTING.pack(k, v)
            for k, v in (
                (S_MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
                (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (S_MAX_FRAME_SIZE, MAX_FRAME_SIZE),
                (S_MAX_HEADER_LIST_SIZE, self.max_header_list_bytes),
                (S_ENABLE_PUSH, 0),
            )
        )
        transport.write(
            frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        if self._turn_handle is not None:
            self._turn_handle.cancel()
        if self._abort_handle is not None:
            self._abort_handle.cancel()
        streams, self.streams = self.streams, {}
        self._blocked.clear()
        for s in streams.values():
            s.remote_open = s.local_open = False
            s.on_reset()
            _wake(s)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading("write")

    def resume_writing(self) -> None:
        self.write_paused = False
        self._resume_reading("write")
        for s in list(self.streams.values()):
            if s.outbox is None:
                _wake(s)

    def _pause_reading(self, why: str) -> None:
        if not self._read_paused_by and not self.closed:
            self.transport.pause_reading()
        self._read_paused_by.add(why)

    def _resume_reading(self, why: str) -> None:
        self._read_paused_by.discard(why)
        if not self._read_paused_by and not self.closed:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the socket: what is written during one turn of the loop goes out in
        one ``transport.write`` (one system call) at its end, so a batch's replies on a stream,
        or the replies of unary calls answered together, cost one send, not one each."""
        if self.closed:
            return
        out = self._out
        out.append(data)
        if len(out) == 1:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        out = self._out
        if out and not self.closed:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def close(self, code: int = NO_ERROR, message: str = "") -> None:
        """GOAWAY with ``code``, then close once what is written is sent."""
        if self.closed:
            return
        self.send_goaway(code, message)
        self.flush()
        self.closed = True
        self.transport.close()
        # a client that reads nothing would keep the socket (and its streams) while the
        # transport waits to flush: it gets CLOSE_TIMEOUT_S
        self._abort_handle = self.loop.call_later(CLOSE_TIMEOUT_S, self.abort)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def send_goaway(self, code: int = NO_ERROR, message: str = "") -> None:
        if not self.closed:
            self.goaway_sent = True
            debug = message.encode()[:256]
            self.write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_stream_id, code) + debug))

    # -------------------------------------------------------------------------- reading

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self.last_active = self.loop.time()
        if self._turn_handle is None:
            self._process()

    def _next_turn(self) -> None:
        self._turn_handle = None
        self._resume_reading("turn")
        self._process()

    def _process(self) -> None:
        buf = self._buf
        try:
            pos = 0
            if not self._preface:
                if len(buf) < len(PREFACE):
                    if not PREFACE.startswith(bytes(buf)):
                        raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if bytes(buf[: len(PREFACE)]) != PREFACE:
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._preface = True
                pos = len(PREFACE)
            n = len(buf)
            frames = 0
            while n - pos >= 9 and not self.closed:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > MAX_FRAME_SIZE:
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes over {MAX_FRAME_SIZE}")
                end = pos + 9 + length
                if end > n:
                    break
                if frames == FRAMES_PER_TURN:  # the rest in the next turn of the loop
                    self._pause_reading("turn")
                    self._turn_handle = self.loop.call_soon(self._next_turn)
                    break
                frames += 1
                kind, flags = buf[pos + 3], buf[pos + 4]
                sid = _U32.unpack_from(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = bytes(buf[pos + 9 : end])
                pos = end
                self._frame(kind, flags, sid, payload)
            del buf[:pos]
        except ConnectionError_ as e:
            log.debug("gRPC connection error %d: %s", e.code, e)
            self.close(e.code, str(e))
        except hpack.exceptions.HPACKError as e:
            log.debug("gRPC connection HPACK error: %s", e)
            self.close(COMPRESSION_ERROR, "header block not decodable")
        except Exception:  # a bug: this connection ends, the server goes on
            log.exception("gRPC connection failed")
            self.close(INTERNAL_ERROR, "internal error")

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "header block interrupted")
        if not self.settings_seen and kind != SETTINGS:
            raise ConnectionError_(PROTOCOL_ERROR, "the first frame must be SETTINGS")
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            self._headers(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == PING:
            if sid:
                raise ConnectionError_(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ConnectionError_(FRAME_SIZE_ERROR, "PING of other than 8 bytes")
            if not flags & ACK:
                self.write(frame(PING, ACK, 0, payload))
            else:
                self.on_ping_ack(payload)
        elif kind == SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == RST_STREAM:
            self._rst_stream(sid, payload)
        elif kind == CONTINUATION:
            self._continuation_frame(flags, sid, payload)
        elif kind == PRIORITY:
            if not sid:
                raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "PRIORITY of other than 5 bytes")
            self._control()
        elif kind == GOAWAY:
            if sid:
                raise ConnectionError_(PROTOCOL_ERROR, "GOAWAY on a stream")
            self.peer_goaway = True
            if not self.streams:
                self.close()
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # unknown frame types are ignored (RFC 9113 4.1)

    def on_ping_ack(self, payload: bytes) -> None:
        """A PING we sent was answered (keepalive)."""

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ConnectionError_(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        self._control()
        if len(payload) > 6 * MAX_SETTINGS_ENTRIES:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"SETTINGS of more than {MAX_SETTINGS_ENTRIES} entries")
        self.settings_seen = True
        window = None
        for i in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, i)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "initial window size over 2^31-1")
                window = value  # the last one counts; applied once below
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= 2**24 - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "max frame size out of range")
                self.peer_max_frame = value
            elif key == S_ENABLE_PUSH and value > 1:
                raise ConnectionError_(PROTOCOL_ERROR, "enable push other than 0 or 1")
            # the header table size is moot (the encoder does not index); others are advisory
        if window is not None and window != self.peer_initial_window:
            self._control(1 + len(self.streams) // 64)
            delta = window - self.peer_initial_window
            self.peer_initial_window = window
            for s in self.streams.values():
                s.send_window += delta
                if s.send_window > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "stream window over 2^31-1")
            for s in list(self.streams.values()):
                if s.outbox is not None and s.send_window > 0 and self.send_window > 0:
                    self._flush(s)
        self.write(frame(SETTINGS, ACK, 0))

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "WINDOW_UPDATE of other than 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self._flush_blocked()
            return
        s = self.streams.get(sid)
        if s is None:
            if sid > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # a stream closed since
        if increment == 0:
            self.reset(s, PROTOCOL_ERROR)
            return
        s.send_window += increment
        if s.send_window > MAX_WINDOW:
            self.reset(s, FLOW_CONTROL_ERROR)
            return
        if s.outbox is not None:
            self._flush(s)

    def _rst_stream(self, sid: int, payload: bytes) -> None:
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "RST_STREAM of other than 4 bytes")
        if sid > self.last_stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        s = self.streams.pop(sid, None)
        if s is None:
            return
        s.remote_open = s.local_open = False
        self._blocked.pop(sid, None)
        s.on_reset()
        _wake(s)
        if self._count_reset():
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many streams reset")
        self._after_close()

    def _count_reset(self) -> bool:
        """Count a stream reset (by the client, or by us for what the client did); True past the
        limit. Each frees a stream slot while its handler's work may go on (rapid reset)."""
        now = self.loop.time()
        if now - self._reset_window_start > RESET_WINDOW_S:
            self._reset_window_start, self._resets = now, 0
        self._resets += 1
        return self._resets > MAX_RESETS_PER_S * RESET_WINDOW_S

    def _control(self, n: int = 1) -> None:
        """Count ``n`` control frames against MAX_CONTROL_FRAMES_PER_S."""
        now = self.loop.time()
        if now - self._control_start > CONTROL_WINDOW_S:
            self._control_start, self._controls = now, 0
        self._controls += n
        if self._controls > MAX_CONTROL_FRAMES_PER_S * CONTROL_WINDOW_S:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "too many control frames")

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        # the connection's window is given back as DATA arrives: each stream's own window and
        # the layer above's message limit bound what is held
        self.recv_window -= size
        if self.recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "more DATA than the connection window")
        self.recv_unacked += size
        if self.recv_unacked >= CONNECTION_WINDOW // 4:
            self.write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        if flags & PADDED:
            payload = _unpad(payload)
        s = self.streams.get(sid)
        if s is None or not s.remote_open:
            if sid > self.last_stream_id:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            if s is not None:
                self.reset(s, STREAM_CLOSED)
            return  # a stream reset or answered since: dropped
        s.progress = self.loop.time()
        s.recv_window -= size
        if s.recv_window < 0:
            self.reset(s, FLOW_CONTROL_ERROR)
            return
        if size > len(payload):
            s.consumed(size - len(payload))  # padding: counted against the window, consumed now
        if payload:
            s.on_data(payload)
        elif not flags & END_STREAM:
            self._control()  # an empty DATA frame carries nothing
        if flags & END_STREAM and sid in self.streams:
            s.remote_open = False
            s.on_end()
            if not s.local_open:
                self._discard(s)

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if not sid:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = _unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionError_(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if len(payload) > MAX_HEADER_BLOCK:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if not flags & END_HEADERS:
            self._continuation = (sid, flags, bytearray(payload))
            return
        self._header_block(sid, flags, payload)

    def _continuation_frame(self, flags: int, sid: int, payload: bytes) -> None:
        pending = self._continuation
        if pending is None or pending[0] != sid:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = pending[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._continuation = None
            self._header_block(sid, pending[1], bytes(block))

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        end_stream = bool(flags & END_STREAM)
        s = self.streams.get(sid)
        if s is not None:  # trailers: gRPC clients send none, but they must end the stream
            if not end_stream or not s.remote_open:
                self.reset(s, PROTOCOL_ERROR)
                return
            s.remote_open = False
            s.on_end()
            if not s.local_open:
                self._discard(s)
            return
        if not sid & 1:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on an even stream id")
        if sid <= self.last_stream_id:
            if sid in self._reset_by_us:  # frames in flight when we reset it: ignored (RFC 9113 5.1)
                return
            raise ConnectionError_(STREAM_CLOSED, "HEADERS on a closed stream")
        self.last_stream_id = sid
        if self.goaway_sent or len(self.streams) >= self.max_concurrent_streams:
            self.write(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        self.last_active = self.loop.time()
        stream = self.open_stream(sid, headers, end_stream)
        if stream is None:
            return
        self.streams[sid] = stream
        if end_stream:
            stream.remote_open = False
            stream.on_end()

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """HPACK-decode a header block, every block in order, so that the table keeps in step.
        A client sends the same block call after call once its headers are in the dynamic table
        (only indexed fields and literals the table does not keep): such a block decodes to the
        same list while the table is unchanged, so the list is kept (per connection, at most
        ``_BLOCK_CACHE`` of them) until the table changes. Decoding costs 10-20 µs in
        ``hpack``'s Python; a hit, a dict lookup."""
        hit = self._blocks.get(block)
        if hit is not None:
            return hit
        if _field_count(block) > MAX_HEADER_FIELDS:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"header block of more than {MAX_HEADER_FIELDS} fields")
        if not _CACHE_BLOCKS:
            return self.decoder.decode(block, raw=True)  # type: ignore[return-value]
        table = self.decoder.header_table
        entries = table.dynamic_entries  # hpack's: a new tuple at the front on each insertion
        size, first, maxsize = len(entries), entries[0] if entries else None, table.maxsize
        headers: list[tuple[bytes, bytes]] = self.decoder.decode(block, raw=True)  # type: ignore[assignment]
        if len(entries) != size or (entries[0] if entries else None) is not first or table.maxsize != maxsize:
            self._blocks.clear()  # the table changed: every list kept may be stale
        elif len(block) <= 1024:
            if len(self._blocks) >= _BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[block] = headers
        return headers

    # -------------------------------------------------------------------------- sending

    def send_headers(self, s: Stream, block: bytes, end_stream: bool = False) -> None:
        """A header block (or trailers, with ``end_stream``) for a stream. Queued behind DATA
        that waits for window, so that trailers never overtake the message."""
        if not s.local_open:
            return
        if end_stream:
            s.local_open = False
        if s.outbox is not None:
            s.outbox.append((block, HEADERS | (END_STREAM << 8 if end_stream else 0)))
            return
        self.write(self._header_frames(s.id, block, end_stream))
        if end_stream:
            self._local_end(s)

    def _header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        flags = END_STREAM if end_stream else 0
        limit = self.peer_max_frame
        if len(block) <= limit:
            return frame_header(HEADERS, flags | END_HEADERS, sid, len(block)) + block
        parts = [block[i : i + limit] for i in range(0, len(block), limit)]
        out = [frame(HEADERS, flags, sid, parts[0])]
        out += [frame(CONTINUATION, 0, sid, p) for p in parts[1:-1]]
        out.append(frame(CONTINUATION, END_HEADERS, sid, parts[-1]))
        return b"".join(out)

    def send_data(self, s: Stream, data: bytes) -> bool:
        """Send ``data`` on a stream as far as both windows allow; the rest waits in the stream's
        outbox. Returns whether all of it went to the transport."""
        if not s.local_open:
            return True
        if s.outbox is not None:
            s.outbox.append((memoryview(data), DATA))
            return False
        n = len(data)
        if n <= s.send_window and n <= self.send_window and n <= self.peer_max_frame:
            s.send_window -= n
            self.send_window -= n
            self.write(frame_header(DATA, 0, s.id, n))
            self.write(data)  # joined with the header once, when the turn's writes go out
            return True
        s.outbox = [(memoryview(data), DATA)]  # sliced as it goes, without copying the rest
        self._flush(s)
        return s.outbox is None

    def send_reply(self, s: Stream, headers: bytes, data: bytes, trailers: bytes) -> None:
        """A whole reply: headers, ``data`` (one message, framed) and trailers, in one write when
        the windows take the DATA at once (a unary call's reply, nearly always)."""
        if not s.local_open:
            return
        n = len(data)
        limit = self.peer_max_frame
        if (
            n > s.send_window
            or n > self.send_window
            or n > limit
            or s.outbox is not None
            or len(headers) > limit
            or len(trailers) > limit
        ):
            self.send_headers(s, headers)
            self.send_data(s, data)
            self.send_headers(s, trailers, end_stream=True)
            return
        s.send_window -= n
        self.send_window -= n
        sid = s.id
        s.local_open = False
        self.write(
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
        self._local_end(s)

    def _flush(self, s: Stream) -> None:
        """Send what the windows allow of a stream's outbox. A stream left waiting on the
        connection's window is kept in ``_blocked`` (a connection WINDOW_UPDATE flushes those
        only); one waiting on its own window is flushed by its own WINDOW_UPDATE."""
        outbox = s.outbox
        assert outbox is not None
        out: list[bytes | memoryview] = []
        while outbox:
            item, kind = outbox[0]
            if kind == DATA:
                room = min(s.send_window, self.send_window)
                if room <= 0 and item:
                    break
                chunk_size = min(room, self.peer_max_frame, len(item))
                out += (frame_header(DATA, 0, s.id, chunk_size), item[:chunk_size])
                s.send_window -= chunk_size
                self.send_window -= chunk_size
                if chunk_size < len(item):
                    outbox[0] = (item[chunk_size:], DATA)
                    continue
            else:
                end_stream = bool(kind >> 8)
                out.append(self._header_frames(s.id, bytes(item), end_stream))
            outbox.pop(0)
        if out:
            self.write(b"".join(out))
            s.progress = self.loop.time()
        if not outbox:
            s.outbox = None
            self._blocked.pop(s.id, None)
            if not s.local_open:
                self._local_end(s)
            _wake(s)
        elif s.send_window <= 0:
            self._blocked.pop(s.id, None)
        else:
            self._blocked[s.id] = s

    def _flush_blocked(self) -> None:
        for s in list(self._blocked.values()):
            if self.send_window <= 0:
                return
            self._flush(s)

    def reset(self, s: Stream, code: int) -> None:
        """End a stream with RST_STREAM (from our side)."""
        if self.streams.pop(s.id, None) is None:
            return
        self._blocked.pop(s.id, None)
        was_open = s.local_open or s.remote_open
        s.local_open = s.remote_open = False
        s.outbox = None
        self.write(frame(RST_STREAM, 0, s.id, _U32.pack(code)))
        reset_by_us = self._reset_by_us
        reset_by_us[s.id] = None
        if len(reset_by_us) > 256:
            del reset_by_us[next(iter(reset_by_us))]
        if was_open:
            s.on_reset()
        _wake(s)
        # counted when the client caused it (an error code), not for our own early replies
        # (NO_ERROR: the call is over) nor while the connection is going away
        if code != NO_ERROR and not self.goaway_sent and self._count_reset() and not self.closed:
            self.close(ENHANCE_YOUR_CALM, "too many streams reset")
            return
        self._after_close()

    def _local_end(self, s: Stream) -> None:
        """Our side of the stream ended (its trailers were written)."""
        if s.remote_open:
            # a reply before the client finished sending (an error, a refusal): tell it to stop
            self.reset(s, NO_ERROR)
            return
        self._discard(s)

    def _discard(self, s: Stream) -> None:
        if self.streams.pop(s.id, None) is not None:
            self._after_close()

    def _after_close(self) -> None:
        if not self.streams:
            self.last_active = self.loop.time()
            if self.peer_goaway or self.goaway_sent:
                self.close()
            else:
                self.idle_changed()


def _field_count(block: bytes) -> int:
    """How many header fields an HPACK block holds, counted without decoding (RFC 7541 6): the
    representations are walked and string literals skipped by their lengths. A malformed block
    counts as what was walked; hpack refuses it after."""
    i, n, fields = 0, len(block), 0
    while i < n and fields <= MAX_HEADER_FIELDS:
        b = block[i]
        if b & 0x80:  # indexed field
            i = _skip_int(block, i, 7)
            fields += 1
            continue
        if b & 0xE0 == 0x20:  # dynamic table size update
            i = _skip_int(block, i, 5)
            continue
        prefix = 6 if b & 0x40 else 4  # literal with incremental indexing, or without / never
        new_name = b & ((1 << prefix) - 1) == 0
        i = _skip_int(block, i, prefix)
        if new_name:
            i = _skip_string(block, i)
        i = _skip_string(block, i)
        fields += 1
    return fields


def _int_at(block: bytes, i: int, prefix: int) -> tuple[int, int]:
    """An HPACK integer at ``i``: (value, index after it); at most 5 continuation bytes."""
    limit = (1 << prefix) - 1
    value = block[i] & limit
    i += 1
    if value < limit:
        return value, i
    shift = 0
    while i < len(block) and shift <= 28:
        b = block[i]
        i += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return value, i


def _skip_int(block: bytes, i: int, prefix: int) -> int:
    return _int_at(block, i, prefix)[1]


def _skip_string(block: bytes, i: int) -> int:
    if i >= len(block):
        return i
    length, i = _int_at(block, i, 7)
    return i + length


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise ConnectionError_(PROTOCOL_ERROR, "padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


def _wake(s: Stream) -> None:
    waiter = s.drained
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
