"""HTTP/2 (RFC 9113) on the wire: frame types, flags, error codes, settings, the limits the
builtin server enforces, frame headers, padding, and the rate window the flood limits count
in. No connection state: ``h2_connection`` holds it; HPACK is in ``h2_hpack``."""

from __future__ import annotations

import struct

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
S_ENABLE_CONNECT_PROTOCOL = 0x8

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
#: the largest frame a client may send (advertised): fewer frames per large tensor
MAX_FRAME_SIZE = 1 << 20
#: each stream's receive window (advertised); the connection's is raised to CONNECTION_WINDOW
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 16 << 20
#: a compressed header block (HEADERS plus CONTINUATION) larger than this ends the connection
#: (ENHANCE_YOUR_CALM): it is eight times the header list a client is told it may send, and the
#: block must be held whole to keep the HPACK table in step. A block under it whose decoded list
#: is over the advertised SETTINGS_MAX_HEADER_LIST_SIZE fails its own stream only
MAX_HEADER_BLOCK = 128 << 10
#: fields in one header block: hpack decodes one in a few µs, so a block of many 1-byte indexed
#: fields would hold the loop. Past it (64 KiB decoded at the least, four times the advertised
#: list), a block that changes the HPACK table ends the connection (ENHANCE_YOUR_CALM); one that
#: does not is left undecoded and its stream reset (ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED to a
#: gRPC client). Decoded fields count against the frames of a receive turn, 8 to a frame
MAX_HEADER_FIELDS = 2048
FIELDS_PER_FRAME = 8
#: frames that carry nothing a client needs to send often (SETTINGS, PRIORITY, empty DATA or
#: CONTINUATION, unknown frame types, and any frame on a stream already closed: WINDOW_UPDATE,
#: RST_STREAM, DATA, HEADERS) a client may send per second, averaged over CONTROL_WINDOW_S,
#: before it gets a GOAWAY (ENHANCE_YOUR_CALM); a SETTINGS frame counts once more per 32 entries
#: and, when it changes the initial window, per 64 open streams (it is applied to each)
MAX_CONTROL_FRAMES_PER_S = 1000
CONTROL_WINDOW_S = 2.0
#: PING and WINDOW_UPDATE on the connection or an open stream: grpc core sends them as often as
#: data flows (flow control, bandwidth probes), each costs a few µs; beyond this rate (averaged
#: over CONTROL_WINDOW_S) they are a flood, sent away like the others
MAX_FLOW_FRAMES_PER_S = 20000
#: streams a client may reset per second (averaged over RESET_WINDOW_S) before it is sent away;
#: streams this side resets or refuses for what the client did count too
MAX_RESETS_PER_S = 200
RESET_WINDOW_S = 2.0
#: streams this side reset, remembered (late frames on them are ignored; on any other closed
#: stream they are STREAM_CLOSED), and ranges of stream ids a client skipped (HEADERS on one is
#: a connection error); older ones count as closed by the client
CLOSED_STREAMS_KEPT = 1024
SKIPPED_RANGES_KEPT = 64
#: decoded header blocks kept per connection (see ``h2_hpack.HeaderDecoder``)
BLOCK_CACHE = 64
#: frames handled per receive turn before the rest waits for the next turn
FRAMES_PER_TURN = 256

FRAME_HEADER = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id
U32 = struct.Struct(">L")
SETTING = struct.Struct(">HL")
GOAWAY_HEAD = struct.Struct(">LL")


class ProtocolError(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def server_preface(max_concurrent_streams: int, max_header_list_bytes: int) -> bytes:
    """The server's first frames: its SETTINGS, and the connection window raised."""
    settings = b"".join(
        SETTING.pack(k, v)
        for k, v in (
            (S_MAX_CONCURRENT_STREAMS, max_concurrent_streams),
            (S_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
            (S_MAX_FRAME_SIZE, MAX_FRAME_SIZE),
            (S_MAX_HEADER_LIST_SIZE, max_header_list_bytes),
            (S_ENABLE_PUSH, 0),
        )
    )
    return frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))


def settings_entries(payload: bytes) -> dict[int, int]:
    """A SETTINGS frame's entries (the last value of a setting counts), each checked against
    RFC 9113 6.5.2; unknown settings are kept (and ignored by the caller)."""
    changes: dict[int, int] = {}
    for i in range(0, len(payload), 6):
        key, value = SETTING.unpack_from(payload, i)
        if key == S_INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
            raise ProtocolError(FLOW_CONTROL_ERROR, "initial window size over 2^31-1")
        if key == S_MAX_FRAME_SIZE and not DEFAULT_FRAME_SIZE <= value <= 2**24 - 1:
            raise ProtocolError(PROTOCOL_ERROR, "max frame size out of range")
        if key in (S_ENABLE_PUSH, S_ENABLE_CONNECT_PROTOCOL) and value > 1:
            raise ProtocolError(PROTOCOL_ERROR, "a boolean setting other than 0 or 1")
        changes[key] = value
    return changes


def unpad(payload: bytes) -> bytes:
    if not payload:
        raise ProtocolError(PROTOCOL_ERROR, "padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


class RateWindow:
    """Things counted over windows of ``window_s`` seconds: ``add`` says whether more than
    ``per_s`` a second came in the current window."""

    __slots__ = ("_count", "_limit", "_start", "_window_s")

    def __init__(self, per_s: float, window_s: float) -> None:
        self._limit = per_s * window_s
        self._window_s = window_s
        self._start = 0.0
        self._count = 0

    def add(self, now: float, n: int = 1) -> bool:
        if now - self._start > self._window_s:
            self._start, self._count = now, 0
        self._count += n
        return self._count > self._limit
