"""The sans-IO HTTP/2 core (api/transport/h2_connection.py) without sockets: bytes in, events
and bytes out, against hand-made frames and against the ``h2`` library's client state machine
(RFC 9113: preface, SETTINGS, flow control, stream states, the limits a hostile client meets)."""

from __future__ import annotations

import struct
from collections.abc import Callable

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from seqserve.api.transport import h2_connection, h2_streams
from seqserve.api.transport import h2_frames as f
from seqserve.api.transport.h2_connection import H2Connection
from seqserve.api.transport.h2_events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    PingAcknowledged,
    RequestReceived,
    SettingsChanged,
    StreamEnded,
    StreamReset,
    StreamWritable,
)
from seqserve.api.transport.h2_hpack import STATUS_200, HeaderDecoder, literal

SETTINGS = f.frame(f.SETTINGS, 0, 0)
HELLO = f.PREFACE + SETTINGS
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/s/m"), (":authority", "x")]


class Core:
    """The core with a clock the test moves, counting its output notifications; requests are
    accepted (or left alone with ``accept=False``) as the events come."""

    def __init__(self, *, accept: bool = True, max_streams: int = 4) -> None:
        self.now = 100.0
        self.notified = 0
        self.accept = accept
        self.conn = H2Connection(
            max_concurrent_streams=max_streams,
            max_header_list_bytes=16384,
            on_output=self._notify,
            clock=lambda: self.now,
        )
        self.conn.initiate()
        self.preface = self.conn.data_to_send()
        self.on_event: Callable[[Event], None] | None = None

    def _notify(self) -> None:
        self.notified += 1

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        self.conn.feed(data)
        while True:  # the adapter's turns, one after the other
            for event in self.conn.events():
                events.append(event)
                if isinstance(event, RequestReceived) and self.accept:
                    self.conn.accept(event.stream_id, event.end_stream)
                if self.on_event is not None:
                    self.on_event(event)
            if not self.conn.backlog:
                return events


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame in ``data``."""
    out = []
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        out.append((data[pos + 3], data[pos + 4], sid, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def goaway_code(data: bytes) -> int | None:
    for kind, _, _, payload in frames(data):
        if kind == f.GOAWAY:
            return int.from_bytes(payload[4:8], "big")
    return None


def client() -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    return c


def test_preface_settings_and_ack() -> None:
    core = Core()
    (settings, window) = frames(core.preface)
    assert settings[0] == f.SETTINGS
    values = dict(struct.unpack(">HL", settings[3][i : i + 6]) for i in range(0, len(settings[3]), 6))
    assert values == {
        f.S_MAX_CONCURRENT_STREAMS: 4,
        f.S_INITIAL_WINDOW_SIZE: f.STREAM_WINDOW,
        f.S_MAX_FRAME_SIZE: f.MAX_FRAME_SIZE,
        f.S_MAX_HEADER_LIST_SIZE: 16384,
        f.S_ENABLE_PUSH: 0,
    }
    assert window[0] == f.WINDOW_UPDATE and struct.unpack(">L", window[3])[0] == f.CONNECTION_WINDOW - f.DEFAULT_WINDOW
    events = core.feed(f.PREFACE + f.frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.S_MAX_FRAME_SIZE, 32768)))
    assert [type(e) for e in events] == [SettingsChanged] and events[0].changes == {f.S_MAX_FRAME_SIZE: 32768}
    assert frames(core.conn.data_to_send()) == [(f.SETTINGS, f.ACK, 0, b"")]
    assert core.conn.outbound.max_frame == 32768 and core.conn.settings_seen


def test_a_call_against_the_h2_client() -> None:
    """A request's headers, DATA (with its flow-controlled length) and end, and a whole reply
    (headers, DATA, trailers) in one write, as h2 reads them."""
    core, c = Core(), client()
    c.receive_data(core.preface)
    c.send_headers(1, [*REQUEST, ("x-k", "v")])
    c.send_data(1, b"hello", end_stream=True, pad_length=3)
    events = core.feed(c.data_to_send())
    kinds = [type(e) for e in events]
    assert kinds == [SettingsChanged, RequestReceived, DataReceived, StreamEnded]
    request, data = events[1], events[2]
    assert isinstance(request, RequestReceived) and isinstance(data, DataReceived)
    assert (b"x-k", b"v") in request.headers and not request.end_stream
    assert (data.data, data.flow_length, data.stream.id) == (b"hello", 9, 1)
    stream = data.stream
    assert not stream.remote_open and stream.local_open
    core.conn.data_to_send()
    before = core.notified
    core.conn.send_reply(stream, STATUS_200, b"reply", literal(b"grpc-status", b"0"))
    assert core.notified == before + 1  # one notification for the turn's writes
    assert 1 not in core.conn.streams and core.conn.idle_since == core.now
    got = c.receive_data(core.conn.data_to_send())
    assert [type(e) for e in got] == [h2.events.ResponseReceived, h2.events.DataReceived, h2.events.TrailersReceived,
                                      h2.events.StreamEnded]  # fmt: skip
    assert got[1].data == b"reply" and dict(got[2].headers) == {"grpc-status": "0"}


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", f.PROTOCOL_ERROR),
        (HELLO + f.frame_header(f.DATA, 0, 1, f.MAX_FRAME_SIZE + 1), f.FRAME_SIZE_ERROR),
        (f.PREFACE + f.frame(f.PING, 0, 0, b"\0" * 8), f.PROTOCOL_ERROR),
        (
            HELLO + f.frame(f.HEADERS, 0, 1, b"\0" * 1000) + f.frame(f.CONTINUATION, 0, 1, b"\0" * 9000) * 20,
            f.ENHANCE_YOUR_CALM,
        ),
        (HELLO + f.frame(f.HEADERS, f.END_HEADERS, 2, b"\x83"), f.PROTOCOL_ERROR),
        (HELLO + f.frame(f.WINDOW_UPDATE, 0, 0, struct.pack(">L", 2**31 - 1)), f.FLOW_CONTROL_ERROR),
        (HELLO + f.frame(f.SETTINGS, 0, 0) * 3000, f.ENHANCE_YOUR_CALM),
        (HELLO + f.frame(f.PRIORITY, 0, 1, b"\0\0\0\0\x10") * 3000, f.ENHANCE_YOUR_CALM),
        (HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x00\x01a\x00" * 40000), f.ENHANCE_YOUR_CALM),
        (HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"), f.COMPRESSION_ERROR),
        (HELLO + f.frame(f.DATA, 0, 1, b"x"), f.PROTOCOL_ERROR),  # DATA on an idle stream
        (HELLO + f.frame(f.PUSH_PROMISE, 0, 1, b"\0" * 4), f.PROTOCOL_ERROR),
        (HELLO + f.frame(f.PING, 0, 0, b"\0" * 7), f.FRAME_SIZE_ERROR),
        (HELLO + f.frame(f.RST_STREAM, 0, 9, b"\0" * 4), f.PROTOCOL_ERROR),  # idle stream
        (HELLO + f.frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.S_INITIAL_WINDOW_SIZE, 2**31)), f.FLOW_CONTROL_ERROR),
    ],
    ids=[
        "not-http2",
        "frame-size",
        "first-not-settings",
        "endless-continuation",
        "even-stream",
        "window-overflow",
        "settings-flood",
        "priority-flood",
        "large-block",
        "hpack",
        "data-idle",
        "push-promise",
        "ping-size",
        "rst-idle",
        "initial-window",
    ],
)
def test_connection_errors(data: bytes, code: int) -> None:
    core = Core()
    core.conn.data_to_send()
    events = core.feed(data)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == code
    assert core.conn.closed and goaway_code(core.conn.data_to_send()) == code
    assert core.feed(HELLO) == []  # nothing more is read


def test_frames_per_turn_leave_a_backlog() -> None:
    core = Core()
    core.feed(HELLO)
    core.conn.data_to_send()
    core.conn.feed(f.frame(f.PING, 0, 0, b"\0" * 8) * (f.FRAMES_PER_TURN + 10))
    list(core.conn.events())
    assert core.conn.backlog and len(frames(core.conn.data_to_send())) == f.FRAMES_PER_TURN
    list(core.conn.events())  # the adapter's next turn
    assert not core.conn.backlog and len(frames(core.conn.data_to_send())) == 10


def _call(sid: int, *, end: bool = True, body: bytes = b"") -> bytes:
    block = b"\x83\x86\x04\x04/s/m"
    out = f.frame(f.HEADERS, f.END_HEADERS | (0 if body or not end else f.END_STREAM), sid, block)
    if body:
        out += f.frame(f.DATA, f.END_STREAM if end else 0, sid, body)
    return out


def test_rapid_reset_is_sent_away_within_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h2_streams, "MAX_RESETS_PER_S", 5)
    core = Core()
    core.feed(HELLO)
    for i in range(10):  # 10 resets spread over 20 s: within the rate
        sid = 2 * i + 1
        events = core.feed(_call(sid, end=False) + f.frame(f.RST_STREAM, 0, sid, b"\0\0\0\x08"))
        assert [type(e) for e in events] == [RequestReceived, StreamReset, StreamWritable]
        core.now += 2.1
    assert not core.conn.closed
    events: list[Event] = []
    for i in range(10, 30):
        sid = 2 * i + 1
        events += core.feed(_call(sid, end=False) + f.frame(f.RST_STREAM, 0, sid, b"\0\0\0\x08"))
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == f.ENHANCE_YOUR_CALM


def test_resets_the_client_causes_count_but_early_replies_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h2_streams, "MAX_RESETS_PER_S", 5)
    core = Core()
    core.feed(HELLO)
    for i in range(30):  # answered before the client finished: RST_STREAM NO_ERROR, not counted
        sid = 2 * i + 1
        core.feed(_call(sid, end=False))
        stream = core.conn.streams[sid]
        core.conn.send_headers(stream, literal(b"grpc-status", b"8"), end_stream=True)
        assert [type(e) for e in core.conn.take_events()] == [StreamReset, StreamWritable]
    assert not core.conn.closed and core.conn.last_stream_id == 59
    out = b"".join(_call(2 * i + 101, body=b"\0\0\0\0\0") + f.frame(f.DATA, 0, 2 * i + 101, b"x") for i in range(30))
    core.on_event = None
    events = core.feed(out)  # DATA after END_STREAM: reset STREAM_CLOSED, counted
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == f.ENHANCE_YOUR_CALM


def test_late_frames_on_a_stream_reset_by_this_side_are_ignored() -> None:
    core = Core()
    core.feed(HELLO)
    core.feed(_call(1, end=False))
    core.conn.reset(core.conn.streams[1], f.CANCEL)
    assert [type(e) for e in core.conn.take_events()] == [StreamReset, StreamWritable]
    assert frames(core.conn.data_to_send())[-1] == (f.RST_STREAM, 0, 1, b"\0\0\0\x08")
    assert core.feed(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, b"\x83")) == []
    assert core.feed(f.frame(f.DATA, 0, 1, b"late")) == [] and not core.conn.closed


def test_refused_beyond_the_concurrent_streams_and_rejected_requests() -> None:
    core = Core(max_streams=2)
    core.feed(HELLO)
    core.conn.data_to_send()
    core.feed(_call(1, end=False) + _call(3, end=False) + _call(5, end=False))
    assert frames(core.conn.data_to_send()) == [(f.RST_STREAM, 0, 5, struct.pack(">L", f.REFUSED_STREAM))]
    core = Core(accept=False)
    core.on_event = lambda e: (
        core.conn.reject(e.stream_id, b"\x8d", e.end_stream) if isinstance(e, RequestReceived) else None
    )
    core.feed(HELLO)
    core.conn.data_to_send()
    core.feed(_call(1, end=False))
    assert frames(core.conn.data_to_send()) == [(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, b"\x8d"),
                                                (f.RST_STREAM, 0, 1, b"\0\0\0\0")]  # fmt: skip
    assert not core.conn.streams


def test_data_beyond_the_window_waits_in_the_outbox_and_trailers_behind_it() -> None:
    core, c = Core(), client()
    c.receive_data(core.preface)
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    c.send_headers(1, REQUEST, end_stream=True)
    core.feed(c.data_to_send())
    stream = core.conn.streams[1]
    core.conn.data_to_send()
    assert not core.conn.send_data(stream, b"0123456789abcdef")  # 16 bytes, 10 of window
    core.conn.send_headers(stream, literal(b"grpc-status", b"0"), end_stream=True)
    sent = frames(core.conn.data_to_send())
    assert [(k, p) for k, _, _, p in sent] == [(f.DATA, b"0123456789")] and stream.outbox is not None
    assert 1 in core.conn.streams  # kept while its trailers wait
    events = core.feed(f.frame(f.WINDOW_UPDATE, 0, 1, struct.pack(">L", 100)))
    assert [type(e) for e in events] == [StreamWritable] and stream.outbox is None
    sent = frames(core.conn.data_to_send())
    assert [(k, fl) for k, fl, _, _ in sent] == [(f.DATA, 0), (f.HEADERS, f.END_HEADERS | f.END_STREAM)]
    assert sent[0][3] == b"abcdef" and 1 not in core.conn.streams


def test_the_connection_window_releases_the_streams_waiting_on_it() -> None:
    core = Core()
    core.feed(f.PREFACE + f.frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.S_INITIAL_WINDOW_SIZE, 1 << 20)))
    core.feed(_call(1) + _call(3))
    big = b"x" * (f.DEFAULT_WINDOW + 100)  # the connection's window, and 100 bytes more
    assert not core.conn.send_data(core.conn.streams[1], big)
    assert not core.conn.send_data(core.conn.streams[3], b"y" * 10)
    core.conn.data_to_send()
    events = core.feed(f.frame(f.WINDOW_UPDATE, 0, 0, struct.pack(">L", 1000)))
    assert [e.stream.id for e in events if isinstance(e, StreamWritable)] == [1, 3]
    payloads = [(sid, len(p)) for k, _, sid, p in frames(core.conn.data_to_send()) if k == f.DATA]
    assert payloads == [(1, 100), (3, 10)]


def test_a_command_given_while_an_event_is_handled_acts_before_the_next_frame() -> None:
    """The events of one read come as each frame is handled: a stream reset while its first
    DATA is handled sees its second DATA dropped, not delivered."""
    core = Core()
    core.feed(HELLO)
    core.feed(_call(1, end=False))
    seen: list[bytes] = []

    def handle(event: Event) -> None:
        if isinstance(event, DataReceived):
            seen.append(event.data)
            core.conn.reset(event.stream, f.CANCEL)

    core.on_event = handle
    events = core.feed(f.frame(f.DATA, 0, 1, b"first") + f.frame(f.DATA, 0, 1, b"second"))
    # what the reset caused comes after the frame (or to ``take_events``, when asked first)
    assert seen == [b"first"] and [type(e) for e in events] == [DataReceived, StreamReset, StreamWritable]


def test_ping_answered_and_acknowledged_and_goaway_closes_when_idle() -> None:
    core = Core()
    core.feed(HELLO)
    core.conn.data_to_send()
    core.feed(f.frame(f.PING, 0, 0, b"12345678"))
    assert frames(core.conn.data_to_send()) == [(f.PING, f.ACK, 0, b"12345678")]
    core.conn.ping(b"abcdefgh")
    events = core.feed(f.frame(f.PING, f.ACK, 0, b"abcdefgh"))
    assert [type(e) for e in events] == [PingAcknowledged] and events[0].payload == b"abcdefgh"
    core.feed(f.frame(f.GOAWAY, 0, 0, b"\0" * 8))
    assert core.conn.closed and goaway_code(core.conn.data_to_send()) == f.NO_ERROR


def test_empty_data_frames_count_as_control_frames() -> None:
    core = Core()
    core.feed(HELLO)
    core.feed(_call(1, end=False))
    events = core.feed(f.frame(f.DATA, 0, 1, b"") * 2001)
    assert isinstance(events[-1], ConnectionTerminated) and events[-1].error_code == f.ENHANCE_YOUR_CALM


def test_connection_lost_ends_every_stream() -> None:
    core = Core()
    core.feed(HELLO)
    core.feed(_call(1, end=False) + _call(3, end=False))
    core.conn.connection_lost()
    events = core.conn.take_events()
    assert [e.stream.id for e in events if isinstance(e, StreamReset)] == [1, 3]
    assert core.conn.closed and not core.conn.streams and core.conn.data_to_send() == b""


def test_decoded_blocks_are_kept_until_the_table_changes() -> None:
    decoder = HeaderDecoder()
    static = b"\x83\x86"
    first = decoder.decode(static)
    assert decoder.decode(static) is first  # a hit: the same list
    insert = b"\x40\x03x-k\x01a"
    assert decoder.decode(insert).headers == [(b"x-k", b"a")]
    indexed = b"\xbe"
    assert decoder.decode(indexed).headers == [(b"x-k", b"a")]
    decoder.decode(b"\x40\x03x-k\x01b")  # (x-k, b) is 62 now
    assert decoder.decode(indexed).headers == [(b"x-k", b"b")]


def test_header_frames_split_into_continuations() -> None:
    core = Core()
    core.feed(HELLO)
    core.feed(_call(1))
    core.conn.data_to_send()
    block = literal(b"x-big", b"v" * 40000)
    core.conn.send_headers(core.conn.streams[1], block)
    sent = frames(core.conn.data_to_send())
    assert [(k, fl) for k, fl, _, _ in sent] == [(f.HEADERS, 0), (f.CONTINUATION, 0), (f.CONTINUATION, f.END_HEADERS)]
    assert b"".join(p for _, _, _, p in sent) == block


def test_the_core_does_no_io() -> None:
    """The HTTP/2 core imports neither asyncio nor socket (the adapter, h2_protocol, does)."""
    import ast
    from pathlib import Path

    folder = Path(h2_connection.__file__).parent
    for name in ("h2_connection", "h2_events", "h2_frames", "h2_hpack", "h2_outbound"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"asyncio", "socket", "selectors", "ssl"}, name
