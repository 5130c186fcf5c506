"""RFC 9113 sections 3-6 against the sans-IO core: the connection preface, frame sizes, and
each frame type's rules (SETTINGS, PING, GOAWAY, RST_STREAM, WINDOW_UPDATE, PRIORITY,
CONTINUATION, unknown types), with the budgets that bound what costs work and carries nothing.
Each case's id names its section."""

from __future__ import annotations

import struct

import pytest

from seqserve.api.transport import h2_frames as f
from seqserve.api.transport.h2_events import ConnectionTerminated, DataReceived, PingAcknowledged, SettingsChanged
from tests.support.h2_peer import HELLO, REQUEST, SETTINGS, CorePeer, headers_frame, settings

U32 = struct.Struct(">L")


def wu(sid: int, increment: int) -> bytes:
    return f.frame(f.WINDOW_UPDATE, 0, sid, U32.pack(increment))


def rst(sid: int, code: int = f.CANCEL) -> bytes:
    return f.frame(f.RST_STREAM, 0, sid, U32.pack(code))


# ------------------------------------------------------------------ connection errors

CONNECTION_ERRORS = [
    ("rfc9113-3.4-not-a-preface", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", f.PROTOCOL_ERROR),
    ("rfc9113-3.4-preface-then-garbage", b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", f.PROTOCOL_ERROR),
    ("rfc9113-3.4-first-frame-ping", f.PREFACE + f.frame(f.PING, 0, 0, b"\0" * 8), f.PROTOCOL_ERROR),
    ("rfc9113-3.4-first-frame-settings-ack", f.PREFACE + f.frame(f.SETTINGS, f.ACK, 0), f.PROTOCOL_ERROR),
    ("rfc9113-3.4-first-frame-headers", f.PREFACE + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x83"), f.PROTOCOL_ERROR),
    ("rfc9113-4.2-frame-over-max", HELLO + f.frame_header(f.DATA, 0, 1, f.MAX_FRAME_SIZE + 1), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.1-data-stream-0", HELLO + f.frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR),
    ("rfc9113-6.1-data-idle-stream", HELLO + f.frame(f.DATA, 0, 1, b"x"), f.PROTOCOL_ERROR),
    ("rfc9113-6.1-data-pad-too-long", None, f.PROTOCOL_ERROR),
    ("rfc9113-6.2-headers-stream-0", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 0, b"\x83"), f.PROTOCOL_ERROR),
    ("rfc9113-6.2-headers-pad-too-long", HELLO + f.frame(f.HEADERS, f.END_HEADERS | f.PADDED, 1, b"\x05\x83"),
     f.PROTOCOL_ERROR),
    ("rfc9113-6.2-headers-priority-short", HELLO + f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\0\0"),
     f.FRAME_SIZE_ERROR),
    ("rfc9113-5.1.1-even-stream-id", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 2, b"\x83"), f.PROTOCOL_ERROR),
    ("rfc9113-6.3-priority-stream-0", HELLO + f.frame(f.PRIORITY, 0, 0, b"\0" * 5), f.PROTOCOL_ERROR),
    ("rfc9113-6.3-priority-length", HELLO + f.frame(f.PRIORITY, 0, 1, b"\0" * 4), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.4-rst-stream-0", HELLO + rst(0), f.PROTOCOL_ERROR),
    ("rfc9113-6.4-rst-idle", HELLO + rst(9), f.PROTOCOL_ERROR),
    ("rfc9113-6.4-rst-length", HELLO + f.frame(f.RST_STREAM, 0, 1, b"\0" * 3), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.5-settings-on-stream", HELLO + f.frame(f.SETTINGS, 0, 1), f.PROTOCOL_ERROR),
    ("rfc9113-6.5-settings-length", HELLO + f.frame(f.SETTINGS, 0, 0, b"\0" * 5), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.5-settings-ack-payload", HELLO + f.frame(f.SETTINGS, f.ACK, 0, b"\0" * 6), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.5.2-enable-push-2", HELLO + settings((f.S_ENABLE_PUSH, 2)), f.PROTOCOL_ERROR),
    ("rfc9113-6.5.2-initial-window-2^31", HELLO + settings((f.S_INITIAL_WINDOW_SIZE, 2**31)), f.FLOW_CONTROL_ERROR),
    ("rfc9113-6.5.2-max-frame-below", HELLO + settings((f.S_MAX_FRAME_SIZE, 16383)), f.PROTOCOL_ERROR),
    ("rfc9113-6.5.2-max-frame-above", HELLO + settings((f.S_MAX_FRAME_SIZE, 2**24)), f.PROTOCOL_ERROR),
    ("rfc8441-3-enable-connect-2", HELLO + settings((f.S_ENABLE_CONNECT_PROTOCOL, 2)), f.PROTOCOL_ERROR),
    ("rfc9113-6.6-push-promise", HELLO + f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\x02"), f.PROTOCOL_ERROR),
    ("rfc9113-6.7-ping-on-stream", HELLO + f.frame(f.PING, 0, 1, b"\0" * 8), f.PROTOCOL_ERROR),
    ("rfc9113-6.7-ping-7-bytes", HELLO + f.frame(f.PING, 0, 0, b"\0" * 7), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.7-ping-9-bytes", HELLO + f.frame(f.PING, 0, 0, b"\0" * 9), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.8-goaway-on-stream", HELLO + f.frame(f.GOAWAY, 0, 1, b"\0" * 8), f.PROTOCOL_ERROR),
    ("rfc9113-6.8-goaway-short", HELLO + f.frame(f.GOAWAY, 0, 0, b"\0" * 7), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.9-window-update-length", HELLO + f.frame(f.WINDOW_UPDATE, 0, 0, b"\0" * 3), f.FRAME_SIZE_ERROR),
    ("rfc9113-6.9-window-update-0-connection", HELLO + wu(0, 0), f.PROTOCOL_ERROR),
    ("rfc9113-6.9-window-update-idle-stream", HELLO + wu(7, 1), f.PROTOCOL_ERROR),
    ("rfc9113-6.9.1-connection-window-overflow", HELLO + wu(0, 2**31 - 1), f.FLOW_CONTROL_ERROR),
    ("rfc9113-6.10-continuation-alone", HELLO + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x83"), f.PROTOCOL_ERROR),
    ("rfc9113-6.10-continuation-other-stream",
     HELLO + f.frame(f.HEADERS, 0, 1, b"\x83") + f.frame(f.CONTINUATION, f.END_HEADERS, 3, b"\x86"), f.PROTOCOL_ERROR),
    ("rfc9113-6.10-interrupted-by-ping",
     HELLO + f.frame(f.HEADERS, 0, 1, b"\x83") + f.frame(f.PING, 0, 0, b"\0" * 8), f.PROTOCOL_ERROR),
    ("rfc9113-6.10-interrupted-by-data",
     HELLO + f.frame(f.HEADERS, 0, 1, b"\x83") + f.frame(f.DATA, 0, 1, b"x"), f.PROTOCOL_ERROR),
    ("rfc9113-6.10-interrupted-by-unknown-type",
     HELLO + f.frame(f.HEADERS, 0, 1, b"\x83") + f.frame(0x20, 0, 1, b"x"), f.PROTOCOL_ERROR),
    ("rfc9113-6.10-block-over-limit",
     HELLO + f.frame(f.HEADERS, 0, 1, b"\0" * 1000) + f.frame(f.CONTINUATION, 0, 1, b"\0" * 16000) * 9,
     f.ENHANCE_YOUR_CALM),
    ("rfc7541-2.3.3-index-out-of-range", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\x80\x01"),
     f.COMPRESSION_ERROR),
    ("rfc7541-5.1-integer-overflow", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\xff\xff\xff\xff\xff\x0f"),
     f.COMPRESSION_ERROR),
    ("rfc7541-4.2-table-size-over-setting", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x3f\xe1\x3f\x83"),
     f.COMPRESSION_ERROR),
    ("rfc7541-4.2-table-size-update-after-field", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x83" * 600 + b"\x20"),
     f.COMPRESSION_ERROR),
    ("rfc7541-5.2-truncated-string", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x00\x05ab"), f.COMPRESSION_ERROR),
    ("rfc7541-5.2-bad-huffman-eos", HELLO + f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x00\x81\x00\x81\xff"),
     f.COMPRESSION_ERROR),
]  # fmt: skip


@pytest.mark.parametrize(("data", "code"), [c[1:] for c in CONNECTION_ERRORS], ids=[c[0] for c in CONNECTION_ERRORS])
def test_connection_error(data: bytes | None, code: int) -> None:
    peer = CorePeer(hello=False, answer=False)
    if data is None:  # a padded DATA frame on an open stream, its pad length over the frame
        peer.send(HELLO)
        peer.request(1, end_stream=False)
        data = f.frame(f.DATA, f.PADDED, 1, b"\x09abc")
    peer.send(data)
    assert peer.reader.goaway() == code
    assert peer.conn.closed and isinstance(peer.events[-1], ConnectionTerminated)
    assert peer.send(HELLO) == []  # nothing is read after the GOAWAY


# ------------------------------------------------------------------ preface and SETTINGS


def test_rfc9113_3_4_server_preface_is_settings_with_its_limits() -> None:
    first = CorePeer(hello=False).server_preface[0]
    assert first.kind == f.SETTINGS and not first.flags & f.ACK
    values = dict(struct.unpack(">HL", first.payload[i : i + 6]) for i in range(0, len(first.payload), 6))
    assert values[f.S_MAX_HEADER_LIST_SIZE] == 16384 and values[f.S_ENABLE_PUSH] == 0
    assert values[f.S_MAX_FRAME_SIZE] == f.MAX_FRAME_SIZE and f.S_MAX_CONCURRENT_STREAMS in values


def test_rfc9113_3_4_preface_in_pieces() -> None:
    peer = CorePeer(hello=False)
    for i in range(len(HELLO)):
        peer.send(HELLO[i : i + 1])
    assert peer.reader.kinds() == [f.SETTINGS, f.WINDOW_UPDATE, f.SETTINGS] and peer.conn.settings_seen


@pytest.mark.parametrize("entries", [0, 1, 6, 32, 33, 100], ids=lambda n: f"rfc9113-6.5-{n}-entries-acked")
def test_settings_of_any_legal_length_are_acked(entries: int) -> None:
    peer = CorePeer()
    got = peer.send(settings(*[(f.S_INITIAL_WINDOW_SIZE, 65535 + i) for i in range(entries)]))
    assert [(fr.kind, fr.flags) for fr in got] == [(f.SETTINGS, f.ACK)] and not peer.conn.closed


@pytest.mark.parametrize(
    ("key", "value"),
    [(f.S_HEADER_TABLE_SIZE, 0), (f.S_ENABLE_PUSH, 0), (f.S_MAX_CONCURRENT_STREAMS, 0),
     (f.S_INITIAL_WINDOW_SIZE, 0), (f.S_INITIAL_WINDOW_SIZE, 2**31 - 1), (f.S_MAX_FRAME_SIZE, 16384),
     (f.S_MAX_FRAME_SIZE, 2**24 - 1), (f.S_MAX_HEADER_LIST_SIZE, 1), (0xFF, 7), (f.S_ENABLE_CONNECT_PROTOCOL, 1)],
    ids=["rfc9113-6.5.2-table-size-0", "rfc9113-6.5.2-push-0", "rfc9113-6.5.2-streams-0", "rfc9113-6.5.2-window-0",
         "rfc9113-6.5.2-window-max", "rfc9113-6.5.2-frame-min", "rfc9113-6.5.2-frame-max",
         "rfc9113-6.5.2-header-list-1", "rfc9113-6.5.2-unknown-ignored", "rfc8441-3-connect-1"],
)  # fmt: skip
def test_legal_setting_values_are_acked(key: int, value: int) -> None:
    peer = CorePeer()
    got = peer.send(settings((key, value)))
    assert [(fr.kind, fr.flags) for fr in got] == [(f.SETTINGS, f.ACK)]
    assert peer.of(SettingsChanged)[-1].changes == {key: value}


def test_rfc9113_6_5_3_settings_ack_from_client_is_accepted() -> None:
    peer = CorePeer()
    assert peer.send(f.frame(f.SETTINGS, f.ACK, 0)) == [] and not peer.conn.closed


def test_rfc9113_6_5_2_max_frame_size_applies_to_replies() -> None:
    peer = CorePeer(answer=False)
    peer.send(settings((f.S_MAX_FRAME_SIZE, 16384)))
    peer.request(1)
    stream = peer.conn.streams[1]
    peer.conn.send_data(stream, b"x" * 40000)
    out = peer.send(b"")
    assert (
        all(len(fr.payload) <= 16384 for fr in out) and sum(len(fr.payload) for fr in out if fr.kind == f.DATA) == 40000
    )


def test_rfc9113_6_9_2_initial_window_change_applies_to_open_streams() -> None:
    peer = CorePeer(answer=False)
    peer.send(settings((f.S_INITIAL_WINDOW_SIZE, 10)))
    peer.request(1)
    stream = peer.conn.streams[1]
    peer.conn.send_data(stream, b"x" * 30)
    assert sum(len(fr.payload) for fr in peer.send(b"") if fr.kind == f.DATA) == 10
    got = peer.send(settings((f.S_INITIAL_WINDOW_SIZE, 30)))  # +20: the rest goes out
    assert sum(len(fr.payload) for fr in got if fr.kind == f.DATA) == 20


def test_rfc9113_6_9_2_initial_window_may_go_negative() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    stream = peer.conn.streams[1]
    peer.conn.send_data(stream, b"x" * 60000)
    peer.send(settings((f.S_INITIAL_WINDOW_SIZE, 1000)))
    assert stream.send_window < 0 and not peer.conn.closed
    got = peer.send(wu(1, 60000))
    assert sum(len(fr.payload) for fr in got if fr.kind == f.DATA) == 0 or stream.send_window >= 0


def test_settings_flood_is_sent_away() -> None:
    peer = CorePeer()
    peer.send(SETTINGS * 3000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_one_huge_settings_frame_counts_by_its_entries() -> None:
    peer = CorePeer()
    peer.send(settings(*[(f.S_ENABLE_PUSH, 0)] * 70000))
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


# ------------------------------------------------------------------ PING, GOAWAY


def test_rfc9113_6_7_ping_answered_with_same_payload() -> None:
    peer = CorePeer()
    got = peer.send(f.frame(f.PING, 0, 0, b"12345678"))
    assert [(fr.kind, fr.flags, fr.payload) for fr in got] == [(f.PING, f.ACK, b"12345678")]


def test_rfc9113_6_7_ping_ack_is_not_answered() -> None:
    peer = CorePeer()
    assert peer.send(f.frame(f.PING, f.ACK, 0, b"12345678")) == []
    assert peer.of(PingAcknowledged)[0].payload == b"12345678"


def test_rfc9113_6_7_ping_flood_is_sent_away() -> None:
    peer = CorePeer()
    peer.send(f.frame(f.PING, 0, 0, b"\0" * 8) * 50000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_rfc9113_6_7_ping_at_a_normal_rate_is_answered() -> None:
    peer = CorePeer()
    for _ in range(20):
        peer.send(f.frame(f.PING, 0, 0, b"\0" * 8) * 1000)
        peer.now += 1.0
    assert peer.reader.goaway() is None and peer.reader.kinds().count(f.PING) == 20000


def test_rfc9113_6_8_goaway_from_client_closes_when_idle() -> None:
    peer = CorePeer()
    peer.send(f.frame(f.GOAWAY, 0, 0, b"\0" * 8))
    assert peer.conn.closed and peer.reader.goaway() == f.NO_ERROR


def test_rfc9113_6_8_goaway_from_client_lets_open_streams_finish() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    peer.send(f.frame(f.GOAWAY, 0, 0, b"\0\0\0\x01\0\0\0\0debug"))
    assert not peer.conn.closed
    stream = peer.conn.streams[1]
    peer.conn.send_headers(stream, b"\x88", end_stream=True)
    assert peer.conn.closed


def test_rfc9113_6_8_streams_after_our_goaway_are_refused() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    peer.conn.send_goaway()
    peer.request(3)
    assert peer.reader.rst(3) == f.REFUSED_STREAM and 1 in peer.conn.streams


# ------------------------------------------------------------------ RST_STREAM, WINDOW_UPDATE, PRIORITY


def test_rfc9113_6_4_client_reset_ends_the_stream() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(rst(1))
    assert 1 not in peer.conn.streams and peer.reader.goaway() is None


def test_rfc9113_5_1_rst_on_closed_stream_is_ignored() -> None:
    peer = CorePeer()
    peer.request(1)
    assert peer.send(rst(1)) == [] and not peer.conn.closed


def test_rfc9113_5_1_window_update_on_closed_stream_is_ignored() -> None:
    peer = CorePeer()
    peer.request(1)
    assert peer.send(wu(1, 100)) == [] and not peer.conn.closed


def test_window_update_flood_on_closed_streams_is_sent_away() -> None:
    """Issue 24: WINDOW_UPDATE on closed streams cost work and were free."""
    peer = CorePeer()
    peer.request(1)
    peer.send(wu(1, 1) * 5000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_rst_flood_on_closed_streams_is_sent_away() -> None:
    peer = CorePeer()
    peer.request(1)
    peer.send(rst(1) * 5000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_window_update_flood_on_the_connection_is_sent_away() -> None:
    peer = CorePeer()
    peer.send(wu(0, 1) * 50000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_rfc9113_6_9_window_update_0_on_stream_is_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    peer.request(3)
    peer.send(wu(1, 0))
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and 3 in peer.conn.streams and not peer.conn.closed


def test_rfc9113_6_9_1_stream_window_overflow_is_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    peer.send(wu(1, 2**31 - 1))
    assert peer.reader.rst(1) == f.FLOW_CONTROL_ERROR and not peer.conn.closed


def test_rfc9113_6_3_priority_on_idle_stream_is_accepted() -> None:
    peer = CorePeer()
    assert peer.send(f.frame(f.PRIORITY, 0, 5, b"\0\0\0\x01\x10")) == []
    peer.request(5)
    assert peer.reader.trailers(5) == {"grpc-status": "0"}


def test_priority_flood_is_sent_away() -> None:
    peer = CorePeer()
    peer.send(f.frame(f.PRIORITY, 0, 1, b"\0\0\0\0\x10") * 3000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


# ------------------------------------------------------------------ unknown frames, CONTINUATION, padding


def test_rfc9113_4_1_unknown_frame_type_is_ignored() -> None:
    peer = CorePeer()
    assert peer.send(f.frame(0x20, 0xFF, 0, b"whatever")) == [] and not peer.conn.closed


def test_rfc9113_4_1_unknown_frame_flood_is_sent_away() -> None:
    peer = CorePeer()
    peer.send(f.frame(0x20, 0, 0, b"") * 3000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_rfc9113_4_1_unknown_flags_are_ignored() -> None:
    peer = CorePeer()
    got = peer.send(f.frame(f.PING, 0xF0, 0, b"\0" * 8))
    assert [(fr.kind, fr.flags) for fr in got] == [(f.PING, f.ACK)]


def test_rfc9113_6_10_headers_then_continuations() -> None:
    peer = CorePeer()
    block = peer.encoder.block(REQUEST)
    peer.send(f.frame(f.HEADERS, f.END_STREAM, 1, block[:3]) + f.frame(f.CONTINUATION, 0, 1, block[3:6])
              + f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[6:]))  # fmt: skip
    assert peer.reader.trailers(1) == {"grpc-status": "0"}


def test_rfc9113_6_10_empty_continuations_are_budgeted() -> None:
    peer = CorePeer()
    block = peer.encoder.block(REQUEST)
    peer.send(f.frame(f.HEADERS, f.END_STREAM, 1, block) + f.frame(f.CONTINUATION, 0, 1, b"") * 3000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_rfc9113_6_2_padded_headers_with_priority() -> None:
    peer = CorePeer()
    block = peer.encoder.block(REQUEST)
    payload = b"\x04" + b"\0\0\0\0\x10" + block + b"\0" * 4
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM | f.PADDED | f.PRIORITY_FLAG, 1, payload))
    assert peer.reader.trailers(1) == {"grpc-status": "0"}


def test_rfc9113_6_1_padded_data_counts_against_the_window() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(f.frame(f.DATA, f.PADDED, 1, b"\x0a" + b"abc" + b"\0" * 10))
    data = peer.of(DataReceived)
    assert data[0].data == b"abc" and data[0].flow_length == 14


def test_empty_data_flood_is_sent_away() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(f.frame(f.DATA, 0, 1, b"") * 3000)
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_frames_per_turn_leave_the_rest_for_the_next_turn() -> None:
    peer = CorePeer()
    peer.conn.feed(f.frame(f.PING, 0, 0, b"\0" * 8) * (f.FRAMES_PER_TURN + 10))
    list(peer.conn.events())
    assert peer.conn.backlog
    list(peer.conn.events())
    assert not peer.conn.backlog


def test_rfc9113_5_4_1_goaway_names_the_last_stream() -> None:
    peer = CorePeer()
    peer.request(1)
    peer.request(5)
    peer.send(f.frame(f.DATA, 0, 0, b"x"))
    goaway = next(fr for fr in peer.reader.frames if fr.kind == f.GOAWAY)
    assert int.from_bytes(goaway.payload[:4], "big") == 5 and goaway.code == f.PROTOCOL_ERROR


def test_headers_frame_helper_sends_end_headers() -> None:
    assert headers_frame(b"\x83", 1)[4] == f.END_HEADERS
