"""RFC 9113 section 5 against the sans-IO core: stream states and identifiers, what a frame on
a stream in each state gets (a stream error, a connection error, or nothing), concurrency,
resets, and flow control (5.2, 6.9). Each case's id names its section."""

from __future__ import annotations

import struct

import pytest

from seqserve.api.transport import h2_frames as f
from seqserve.api.transport.h2_events import DataReceived, RequestReceived, StreamEnded, StreamReset
from tests.support.h2_peer import REQUEST, CorePeer, grpc_message

U32 = struct.Struct(">L")


def data(sid: int, payload: bytes = b"x", *, end: bool = False) -> bytes:
    return f.frame(f.DATA, f.END_STREAM if end else 0, sid, payload)


def rst(sid: int, code: int = f.CANCEL) -> bytes:
    return f.frame(f.RST_STREAM, 0, sid, U32.pack(code))


# ------------------------------------------------------------------ 5.1 stream states


def test_rfc9113_5_1_data_after_client_rst_is_stream_closed() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(rst(1))
    peer.send(data(1))
    assert peer.reader.rst(1) == f.STREAM_CLOSED and not peer.conn.closed


def test_rfc9113_5_1_data_after_both_end_streams_is_stream_closed() -> None:
    peer = CorePeer()
    peer.request(1)  # answered at once: closed
    peer.send(data(1))
    assert peer.reader.rst(1) == f.STREAM_CLOSED and not peer.conn.closed


def test_rfc9113_5_1_data_on_half_closed_remote_is_stream_closed() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)  # unary HEADERS with END_STREAM, not answered yet
    peer.send(data(1))
    assert peer.reader.rst(1) == f.STREAM_CLOSED and 1 not in peer.conn.streams
    assert any(isinstance(e, StreamReset) for e in peer.events) and not peer.conn.closed


def test_rfc9113_5_1_headers_on_half_closed_remote_is_stream_closed() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    peer.request(1, [("x-trailer", "1")])
    assert peer.reader.rst(1) == f.STREAM_CLOSED and not peer.conn.closed


def test_rfc9113_5_1_headers_on_closed_stream_is_stream_closed() -> None:
    peer = CorePeer()
    peer.request(1)
    peer.request(1)
    assert peer.reader.rst(1) == f.STREAM_CLOSED and not peer.conn.closed


def test_rfc9113_5_1_1_headers_on_lower_unused_id_is_connection_error() -> None:
    peer = CorePeer()
    peer.request(5)
    peer.request(3)
    assert peer.reader.goaway() == f.PROTOCOL_ERROR


def test_rfc9113_5_1_1_ids_may_skip() -> None:
    peer = CorePeer()
    peer.request(1)
    peer.request(101)
    assert peer.reader.trailers(101) == {"grpc-status": "0"} and peer.conn.last_stream_id == 101


def test_rfc9113_5_1_data_after_our_reset_is_ignored() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.conn.reset(peer.conn.streams[1], f.CANCEL)
    peer.send(b"")
    before = len(peer.reader.frames)
    peer.send(data(1) + data(1, end=True))
    assert len(peer.reader.frames) == before and not peer.conn.closed


def test_rfc9113_5_1_headers_after_our_reset_are_ignored() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.conn.reset(peer.conn.streams[1], f.CANCEL)
    peer.send(b"")
    before = len(peer.reader.frames)
    peer.request(1, [("x-trailer", "1")])
    assert len(peer.reader.frames) == before and not peer.conn.closed


def test_rfc9113_5_1_data_after_an_early_reply_is_ignored() -> None:
    """The server answered before the request ended (RST_STREAM NO_ERROR): DATA in flight is dropped."""
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.conn.send_headers(peer.conn.streams[1], b"\x88", end_stream=True)
    peer.send(b"")
    assert peer.reader.rst(1) == f.NO_ERROR
    assert peer.send(data(1, end=True)) == [] and not peer.conn.closed


def test_rfc9113_5_1_data_on_a_refused_stream_is_ignored() -> None:
    peer = CorePeer(max_streams=1, answer=False)
    peer.request(1, end_stream=False)
    peer.request(3, end_stream=False)
    assert peer.reader.rst(3) == f.REFUSED_STREAM
    before = len(peer.reader.frames)
    peer.send(data(3))
    assert len(peer.reader.frames) == before


def test_rfc9113_5_1_priority_on_closed_stream_is_accepted() -> None:
    peer = CorePeer()
    peer.request(1)
    assert peer.send(f.frame(f.PRIORITY, 0, 1, b"\0\0\0\0\x10")) == [] and not peer.conn.closed


def test_rfc9113_5_1_trailers_end_the_stream() -> None:
    peer = CorePeer()
    peer.request(1, end_stream=False)
    peer.send(data(1, grpc_message(b"x")))
    peer.request(1, [("x-trailer", "1")])
    assert peer.reader.trailers(1) == {"grpc-status": "0"}


def test_rfc9113_8_1_trailers_without_end_stream_are_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.request(1, [("x-trailer", "1")], end_stream=False)
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and not peer.conn.closed


def test_rfc9113_8_1_pseudo_header_in_trailers_is_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.request(1, [(":path", "/x")])
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and not peer.conn.closed


@pytest.mark.parametrize(
    "field",
    [("X-Up", "1"), ("connection", "close"), ("te", "gzip"), ("k", "a\nb")],
    ids=["rfc9113-8.2.1-uppercase", "rfc9113-8.2.2-connection", "rfc9113-8.2.2-te", "rfc9113-8.2.1-lf"],
)
def test_malformed_trailers_are_a_stream_error(field: tuple[str, str]) -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.request(1, [field])
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and not peer.conn.closed


def test_a_stream_error_leaves_other_streams_running() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.request(3, [*REQUEST, ("Bad", "1")])
    assert peer.reader.rst(3) == f.PROTOCOL_ERROR
    peer.send(data(1, grpc_message(b"x"), end=True))
    assert 1 in peer.conn.streams and not peer.conn.streams[1].remote_open


# ------------------------------------------------------------------ 5.1.2 concurrency, resets


def test_rfc9113_5_1_2_streams_over_the_limit_are_refused() -> None:
    peer = CorePeer(max_streams=2, answer=False)
    for sid in (1, 3, 5):
        peer.request(sid)
    assert peer.reader.rst(5) == f.REFUSED_STREAM and set(peer.conn.streams) == {1, 3}


def test_rfc9113_5_1_2_a_closed_stream_frees_its_slot() -> None:
    peer = CorePeer(max_streams=1)
    for sid in (1, 3, 5):
        peer.request(sid)
    assert [peer.reader.trailers(s) for s in (1, 3, 5)] == [{"grpc-status": "0"}] * 3


def test_rapid_reset_is_sent_away() -> None:
    peer = CorePeer(answer=False)
    for i in range(600):
        sid = 2 * i + 1
        out = f.frame(f.HEADERS, f.END_HEADERS, sid, peer.encoder.block(REQUEST)) + rst(sid)
        peer.send(out)
        if peer.conn.closed:
            break
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_malformed_requests_count_as_resets() -> None:
    peer = CorePeer(answer=False)
    for i in range(600):
        peer.request(2 * i + 1, [*REQUEST, ("Bad", "1")])
        if peer.conn.closed:
            break
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_resets_at_a_slow_rate_are_fine() -> None:
    peer = CorePeer(answer=False)
    for i in range(50):
        sid = 2 * i + 1
        peer.request(sid, end_stream=False)
        peer.send(rst(sid))
        peer.now += 0.1
    assert peer.reader.goaway() is None


# ------------------------------------------------------------------ 5.2, 6.9 flow control


def test_rfc9113_6_9_1_stream_window_exceeded_is_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.request(3, end_stream=False)
    peer.send(data(1, b"x" * f.MAX_FRAME_SIZE) + data(1, b"x"))
    assert peer.reader.rst(1) == f.FLOW_CONTROL_ERROR and 3 in peer.conn.streams and not peer.conn.closed


def test_rfc9113_6_9_connection_window_is_given_back_as_data_arrives() -> None:
    peer = CorePeer(answer=False)
    for i in range(5):
        peer.request(2 * i + 1, end_stream=False)
        peer.send(data(2 * i + 1, b"x" * (1 << 20)))
    updates = [fr for fr in peer.reader.frames if fr.kind == f.WINDOW_UPDATE and fr.sid == 0]
    assert updates and not peer.conn.closed


def test_rfc9113_6_9_stream_window_is_given_back_when_consumed() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(data(1, b"x" * (600 << 10)))
    stream = peer.conn.streams[1]
    peer.conn.consumed(stream, 600 << 10)
    got = peer.send(b"")
    assert any(fr.kind == f.WINDOW_UPDATE and fr.sid == 1 for fr in got)


def test_rfc9113_6_9_reply_waits_for_the_window_and_trailers_wait_behind_it() -> None:
    peer = CorePeer(answer=False)
    peer.send(f.frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.S_INITIAL_WINDOW_SIZE, 5)))
    peer.request(1)
    stream = peer.conn.streams[1]
    peer.conn.send_reply(stream, b"\x88", grpc_message(b"0123456789"), b"\x00\x0bgrpc-status\x010")
    first = peer.send(b"")
    assert [fr.kind for fr in first] == [f.HEADERS, f.DATA] and len(first[1].payload) == 5
    rest = peer.send(f.frame(f.WINDOW_UPDATE, 0, 1, U32.pack(100)))
    assert [fr.kind for fr in rest] == [f.DATA, f.HEADERS] and rest[1].flags & f.END_STREAM


def test_rfc9113_6_9_connection_window_update_releases_streams() -> None:
    peer = CorePeer(answer=False)
    peer.send(f.frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.S_INITIAL_WINDOW_SIZE, 1 << 20)))
    peer.request(1)
    stream = peer.conn.streams[1]
    peer.conn.send_data(stream, b"x" * 70000)  # over the connection's 65535
    sent = sum(len(fr.payload) for fr in peer.send(b"") if fr.kind == f.DATA)
    assert sent == 65535
    got = peer.send(f.frame(f.WINDOW_UPDATE, 0, 0, U32.pack(10000)))
    assert sum(len(fr.payload) for fr in got if fr.kind == f.DATA) == 70000 - 65535


def test_rfc9113_8_1_request_data_delivered_in_order() -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(data(1, b"ab") + data(1, b"cd") + data(1, b"", end=True))
    assert b"".join(e.data for e in peer.of(DataReceived)) == b"abcd" and peer.of(StreamEnded)


def test_request_received_carries_the_header_list_size() -> None:
    peer = CorePeer(answer=False)
    peer.request(1)
    event = peer.of(RequestReceived)[0]
    assert event.header_list_size == sum(len(n) + len(v) + 32 for n, v in event.headers)
