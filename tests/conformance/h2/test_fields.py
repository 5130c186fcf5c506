"""RFC 9113 8.1-8.3 (a request's fields: pseudo-header fields, field names and values,
connection-specific fields, content-length) and RFC 7541 (HPACK: the dynamic table, its size
updates both ways, Huffman, large and many-field blocks) against the sans-IO core. A malformed
request is a stream error PROTOCOL_ERROR: the connection and its other streams go on. Each
case's id names its section."""

from __future__ import annotations

import pytest

from seqserve.api.transport import h2_frames as f
from seqserve.api.transport.h2_events import RequestReceived
from seqserve.api.transport.h2_fields import request_error
from seqserve.api.transport.h2_hpack import literal, walk
from tests.support.h2_peer import REQUEST, CorePeer, grpc_message, headers_frame, settings

BASE = [(n.encode(), v.encode()) for n, v in REQUEST]


def without(name: str) -> list[tuple[bytes, bytes]]:
    return [(n, v) for n, v in BASE if n != name.encode()]


def pseudo(*extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """BASE with fields added after its pseudo-header fields."""
    return BASE[:4] + list(extra) + BASE[4:]


MALFORMED = [
    # the 19 of issue 25's row 7
    ("rfc9113-8.2.1-uppercase-name", [*BASE, (b"X-Upper", b"1")]),
    ("rfc9113-8.2.1-name-with-space", [*BASE, (b"x y", b"1")]),
    ("rfc9113-8.2.1-name-with-colon", [*BASE, (b"x:y", b"1")]),
    ("rfc9113-8.3-unknown-pseudo", pseudo((b":foo", b"1"))),
    ("rfc9113-8.3.2-status-in-request", pseudo((b":status", b"200"))),
    ("rfc9113-8.3-pseudo-after-regular", [*BASE, (b":authority", b"y")]),
    ("rfc9113-8.3.1-duplicate-method", pseudo((b":method", b"POST"))),
    ("rfc9113-8.3.1-duplicate-scheme", pseudo((b":scheme", b"http"))),
    ("rfc9113-8.3.1-duplicate-path", pseudo((b":path", b"/x"))),
    ("rfc9113-8.3.1-missing-scheme", without(":scheme")),
    ("rfc9113-8.2.2-connection", [*BASE, (b"connection", b"keep-alive")]),
    ("rfc9113-8.2.2-transfer-encoding", [*BASE, (b"transfer-encoding", b"chunked")]),
    ("rfc9113-8.2.2-te-gzip", [*without("te"), (b"te", b"gzip")]),
    ("rfc9113-8.2.1-value-cr", [*BASE, (b"x-k", b"a\rb")]),
    ("rfc9113-8.2.1-value-lf", [*BASE, (b"x-k", b"a\nb")]),
    ("rfc9113-8.2.1-value-nul", [*BASE, (b"x-k", b"a\x00b")]),
    ("rfc9113-8.2.1-value-leading-space", [*BASE, (b"x-k", b" a")]),
    ("rfc9113-8.2.1-value-trailing-tab", [*BASE, (b"x-k", b"a\t")]),
    ("rfc9113-8.1.1-content-length-without-data", [*BASE, (b"content-length", b"5")]),
    # row 8 and more of 8.2-8.3
    ("rfc9113-8.3.1-empty-path", [*without(":path")[:2], (b":path", b""), *without(":path")[2:]]),
    ("rfc9113-8.3.1-missing-path", without(":path")),
    ("rfc9113-8.3.1-missing-method", without(":method")),
    ("rfc9113-8.3.1-duplicate-authority", pseudo((b":authority", b"z"))),
    ("rfc9113-8.2.2-keep-alive", [*BASE, (b"keep-alive", b"timeout=5")]),
    ("rfc9113-8.2.2-proxy-connection", [*BASE, (b"proxy-connection", b"close")]),
    ("rfc9113-8.2.2-upgrade", [*BASE, (b"upgrade", b"h2c")]),
    ("rfc9113-8.2.1-empty-name", [*BASE, (b"", b"x")]),
    ("rfc9113-8.2.1-name-with-del", [*BASE, (b"x\x7fy", b"1")]),
    ("rfc9113-8.2.1-name-non-ascii", [*BASE, (b"x\xe9", b"1")]),
    ("rfc9113-8.2.1-uppercase-pseudo", [(b":METHOD", b"POST"), *BASE[1:]]),
    ("rfc9113-8.3-status-and-unknown-pseudo", pseudo((b":status", b"200"), (b":protocol2", b"x"))),
    ("rfc9110-8.6-content-length-not-a-number", [*BASE, (b"content-length", b"abc")]),
    ("rfc9110-8.6-content-length-negative", [*BASE, (b"content-length", b"-1")]),
    ("rfc9110-8.6-content-length-two-values", [*BASE, (b"content-length", b"1"), (b"content-length", b"2")]),
    ("rfc9110-8.6-content-length-list-differs", [*BASE, (b"content-length", b"1, 2")]),
    ("rfc9113-8.5-connect-with-path", [(b":method", b"CONNECT"), (b":authority", b"x:1"), (b":path", b"/")]),
    ("rfc9113-8.5-connect-without-authority", [(b":method", b"CONNECT")]),
    ("rfc8441-4-protocol-without-the-setting", pseudo((b":protocol", b"websocket"))),
]


@pytest.mark.parametrize("fields", [c[1] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_request_is_a_stream_error(fields: list[tuple[bytes, bytes]]) -> None:
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)  # a call in flight on the same connection
    peer.send(headers_frame(peer.encoder.block(fields, huffman=False), 3, end_stream=True))
    assert peer.reader.rst(3) == f.PROTOCOL_ERROR
    assert not peer.conn.closed and 1 in peer.conn.streams and 3 not in peer.conn.streams
    assert [e.stream_id for e in peer.of(RequestReceived)] == [1]
    peer.request(5)  # the connection and its HPACK state go on
    assert 5 in peer.conn.streams


WELL_FORMED = [
    ("rfc9113-8.3.1-no-authority", without(":authority")),
    ("rfc9113-8.2.2-te-trailers", BASE),
    ("rfc9113-8.2.1-value-inner-space", [*BASE, (b"x-k", b"a b")]),
    ("rfc9113-8.2.1-value-empty", [*BASE, (b"x-k", b"")]),
    ("rfc9113-8.2.1-value-obs-text", [*BASE, (b"x-k", b"caf\xe9")]),
    ("rfc9113-8.2.1-name-token-chars", [*BASE, (b"x-!#$%&'*+.^_`|~09", b"1")]),
    ("rfc9113-8.3.1-pseudo-any-order", [BASE[2], BASE[0], BASE[3], BASE[1], *BASE[4:]]),
    ("rfc9113-8.1.1-content-length-matches", [*BASE, (b"content-length", b"7")]),
    ("rfc9110-8.6-content-length-equal-list", [*BASE, (b"content-length", b"7, 7")]),
    ("rfc9113-8.2.3-cookie-split", [*BASE, (b"cookie", b"a=1"), (b"cookie", b"b=2")]),
    ("grpc-http2-binary-metadata", [*BASE, (b"x-bin", b"AAEC")]),
    ("rfc9113-8.3.1-asterisk-path", [*BASE[:2], (b":path", b"*"), *BASE[3:]]),
]


@pytest.mark.parametrize("fields", [c[1] for c in WELL_FORMED], ids=[c[0] for c in WELL_FORMED])
def test_well_formed_request_is_served(fields: list[tuple[bytes, bytes]]) -> None:
    peer = CorePeer()
    peer.send(headers_frame(peer.encoder.block(fields), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"ab")))
    assert peer.reader.rst(1) is None and peer.reader.trailers(1) == {"grpc-status": "0"}


def test_rfc9113_8_1_1_more_data_than_content_length_is_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.send(headers_frame(peer.encoder.block([*BASE, (b"content-length", b"3")]), 1))
    peer.send(f.frame(f.DATA, 0, 1, b"abcd"))
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and not peer.conn.closed


def test_rfc9113_8_1_1_less_data_than_content_length_is_a_stream_error() -> None:
    peer = CorePeer(answer=False)
    peer.send(headers_frame(peer.encoder.block([*BASE, (b"content-length", b"10")]), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, b"abcd"))
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and not peer.conn.closed


def test_rfc9113_8_1_1_content_length_checked_before_trailers() -> None:
    peer = CorePeer(answer=False)
    peer.send(headers_frame(peer.encoder.block([*BASE, (b"content-length", b"10")]), 1))
    peer.send(f.frame(f.DATA, 0, 1, b"abcd"))
    peer.send(headers_frame(peer.encoder.block([(b"x-t", b"1")]), 1, end_stream=True))
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR


def test_rfc9113_8_1_1_padding_is_not_content() -> None:
    peer = CorePeer()
    peer.send(headers_frame(peer.encoder.block([*BASE, (b"content-length", b"7")]), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM | f.PADDED, 1, b"\x03" + grpc_message(b"ab") + b"\0\0\0"))
    assert peer.reader.trailers(1) == {"grpc-status": "0"}


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (BASE, None),
        ([*BASE, (b"X", b"1")], "an uppercase field name"),
        (without(":scheme"), "no :scheme"),
        ([*BASE, (b":path", b"/")], "a pseudo-header field after a regular field"),
    ],
    ids=["rfc9113-8.3-ok", "rfc9113-8.2.1-why-uppercase", "rfc9113-8.3.1-why-scheme", "rfc9113-8.3-why-order"],
)
def test_the_reason_is_named(fields: list[tuple[bytes, bytes]], why: str | None) -> None:
    assert request_error(fields)[0] == why


# ------------------------------------------------------------------ RFC 7541


def test_rfc7541_4_2_table_size_update_when_the_client_lowers_it() -> None:
    """Issue 25 row 1: nghttp2 (-c 0) and h2load (--header-table-size=0) require it."""
    peer = CorePeer()
    peer.send(settings((f.S_HEADER_TABLE_SIZE, 0)))
    peer.request(1)
    peer.request(3)
    blocks = [fr.payload for fr in peer.reader.frames if fr.kind == f.HEADERS]
    assert blocks[0][:1] == b"\x20"  # a size update to 0 starts the first block after the ACK
    assert all(b[:1] != b"\x20" for b in blocks[1:])  # once
    assert peer.reader.trailers(3) == {"grpc-status": "0"}


@pytest.mark.parametrize("size", [0, 100, 4095], ids=lambda n: f"rfc7541-6.3-lowered-to-{n}")
def test_rfc7541_6_3_any_lower_size_gets_an_update(size: int) -> None:
    peer = CorePeer()
    peer.send(settings((f.S_HEADER_TABLE_SIZE, size)))
    peer.request(1)
    first = next(fr for fr in peer.reader.frames if fr.kind == f.HEADERS)
    assert first.payload[:1] == b"\x20"


@pytest.mark.parametrize("size", [4096, 65536], ids=lambda n: f"rfc7541-4.2-not-lowered-{n}")
def test_rfc7541_4_2_no_update_when_not_lowered(size: int) -> None:
    peer = CorePeer()
    peer.send(settings((f.S_HEADER_TABLE_SIZE, size)))
    peer.request(1)
    first = next(fr for fr in peer.reader.frames if fr.kind == f.HEADERS)
    assert first.payload[:1] != b"\x20"


def test_rfc7541_4_2_update_leads_a_rejected_request_too() -> None:
    peer = CorePeer(answer=False)
    peer.send(settings((f.S_HEADER_TABLE_SIZE, 0)))
    peer.request(1)
    peer.conn.reject(3, b"\x8d", True)  # :status 404
    peer.conn.send_headers(peer.conn.streams[1], b"\x88", end_stream=True)
    blocks = [fr.payload for fr in peer.send(b"") if fr.kind == f.HEADERS]
    assert blocks[0][:1] == b"\x20" and blocks[1][:1] != b"\x20"


def test_rfc7541_4_2_update_in_a_reply_split_over_continuations() -> None:
    peer = CorePeer(answer=False)
    peer.send(settings((f.S_HEADER_TABLE_SIZE, 0)))
    peer.request(1)
    big = literal(b"x-big", b"v" * 30000)
    peer.conn.send_headers(peer.conn.streams[1], big, end_stream=True)
    out = peer.send(b"")
    assert out[0].kind == f.HEADERS and out[0].payload[:1] == b"\x20" and out[-1].kind == f.CONTINUATION


def test_rfc7541_2_3_dynamic_table_across_requests() -> None:
    peer = CorePeer()
    for sid in (1, 3, 5):  # the hpack encoder indexes and then refers to its table
        peer.request(sid, [*REQUEST, ("x-k", "same")])
    headers = [dict(e.headers) for e in peer.of(RequestReceived)]
    assert all(h[b"x-k"] == b"same" for h in headers) and len(headers) == 3


def test_rfc7541_6_3_client_table_size_update_in_a_request() -> None:
    peer = CorePeer()
    peer.request(1, [*REQUEST, ("x-k", "v")])
    peer.encoder.hpack.header_table_size = 0
    peer.request(3, [*REQUEST, ("x-k", "w")])
    assert [dict(e.headers)[b"x-k"] for e in peer.of(RequestReceived)] == [b"v", b"w"]


def test_rfc7541_5_2_huffman_and_raw_strings() -> None:
    peer = CorePeer()
    peer.send(headers_frame(peer.encoder.block([*REQUEST, ("x-k", "huffman")], huffman=True), 1, end_stream=True))
    peer.send(headers_frame(peer.encoder.block([*REQUEST, ("x-k", "raw")], huffman=False), 3, end_stream=True))
    assert [dict(e.headers)[b"x-k"] for e in peer.of(RequestReceived)] == [b"huffman", b"raw"]


@pytest.mark.parametrize("fields", [129, 200, 500], ids=lambda n: f"issue25-row2-{n}-fields")
def test_many_header_fields_are_served(fields: int) -> None:
    """Issue 25 row 2: more than 128 fields is no connection error."""
    peer = CorePeer()
    peer.request(1, [*REQUEST, *[(f"x-k{i}", "v") for i in range(fields)]])
    assert peer.reader.trailers(1) == {"grpc-status": "0"} and not peer.conn.closed


@pytest.mark.parametrize("size", [21 << 10, 40 << 10, 100 << 10], ids=lambda n: f"rfc9113-6.5.2-value-{n >> 10}k")
def test_a_large_header_list_reaches_the_layer_above_with_its_size(size: int) -> None:
    """Issue 25 row 3: over the advertised list size, its stream fails (above), not the connection."""
    peer = CorePeer(answer=False)
    block = peer.encoder.block([*REQUEST, ("x-big", "v" * size)], huffman=False)
    frames = headers_frame(block[:16384], 1, end_headers=False)
    rest = block[16384:]
    while rest:
        part, rest = rest[:16384], rest[16384:]
        frames += f.frame(f.CONTINUATION, 0 if rest else f.END_HEADERS, 1, part)
    peer.send(frames)
    event = peer.of(RequestReceived)[0]
    assert event.header_list_size > 16384 and not peer.conn.closed
    peer.request(3)  # the HPACK table stayed in step
    assert 3 in peer.conn.streams


def test_many_fields_decode_in_linear_pieces() -> None:
    block = b"\x00\x01a\x01b" * 3000
    pieces = walk(block).pieces
    assert b"".join(pieces) == block and max(len(p) for p in pieces) < 1100 and len(pieces) > 10


def test_a_block_of_too_many_fields_that_leaves_the_table_alone_fails_its_stream() -> None:
    """Over MAX_HEADER_FIELDS (at least 64 KiB decoded): not decoded, its stream reset with
    ENHANCE_YOUR_CALM (RESOURCE_EXHAUSTED to a gRPC client); the connection goes on."""
    peer = CorePeer(answer=False)
    peer.request(1, end_stream=False)
    peer.send(headers_frame(b"\x82" * (f.MAX_HEADER_FIELDS + 1), 3, end_stream=True))
    assert peer.reader.rst(3) == f.ENHANCE_YOUR_CALM and not peer.conn.closed and 1 in peer.conn.streams
    peer.request(5)
    assert 5 in peer.conn.streams


def test_a_block_of_too_many_fields_that_changes_the_table_ends_the_connection() -> None:
    peer = CorePeer(answer=False)
    block = b"\x40\x01a\x01b" + b"\x82" * (f.MAX_HEADER_FIELDS + 1)  # one literal with indexing first
    peer.send(headers_frame(block, 1, end_stream=True))
    assert peer.reader.goaway() == f.ENHANCE_YOUR_CALM


def test_decoded_fields_count_against_the_receive_turn() -> None:
    peer = CorePeer(answer=False)
    block = peer.encoder.block([*REQUEST, *[(f"x-k{i}", "v") for i in range(1500)]], huffman=False)
    peer.conn.feed(headers_frame(block, 1) + f.frame(f.PING, 0, 0, b"\0" * 8) * 100)
    list(peer.conn.events())
    assert peer.conn.backlog  # 1500 fields weigh like 187 frames: the PINGs wait for the next turn
