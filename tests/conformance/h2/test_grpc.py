"""gRPC's PROTOCOL-HTTP2.md against the builtin gRPC server's connection (``H2Protocol`` and
``GrpcConnection`` on a transport kept in memory, no socket): reply shapes (headers, message,
trailers; trailers-only), status and message encoding, timeouts, encodings and
grpc-accept-encoding, message and metadata limits, each limit ending its call alone. Each
case's id names its source ("grpc-http2-..." for PROTOCOL-HTTP2.md, "grpc-compression-..." for
compression.md)."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import AsyncIterator

import pytest

from seqserve.api.transport import h2_frames as f
from tests.support.h2_peer import REQUEST, GrpcPeer, grpc_message, headers_frame, stream_done

ECHO = REQUEST
PATH = dict(REQUEST)[":path"]


def fields(path: str = PATH, **extra: str) -> list[tuple[str, str]]:
    out = [(n, path if n == ":path" else v) for n, v in REQUEST]
    return out + [(k.replace("_", "-"), v) for k, v in extra.items()]


@pytest.fixture
async def peer() -> AsyncIterator[GrpcPeer]:
    p = GrpcPeer()
    yield p
    p.close()


async def test_grpc_http2_unary_reply_shape(peer: GrpcPeer) -> None:
    trailers = await peer.call(1, body=b"hello")
    frames = [fr for fr in peer.reader.frames if fr.sid == 1]
    assert [fr.kind for fr in frames] == [f.HEADERS, f.DATA, f.HEADERS]
    assert frames[2].flags & f.END_STREAM and not frames[0].flags & f.END_STREAM
    headers = peer.reader.blocks[1][0]
    assert headers[":status"] == "200" and headers["content-type"] == "application/grpc"
    assert frames[1].payload == grpc_message(b"hello") and trailers == {"grpc-status": "0"}


async def test_grpc_compression_replies_advertise_grpc_accept_encoding(peer: GrpcPeer) -> None:
    await peer.call(1, body=b"x")
    accepted = peer.reader.blocks[1][0]["grpc-accept-encoding"].split(",")
    assert set(accepted) == {"identity", "deflate", "gzip"}


async def test_grpc_http2_trailers_only_reply_for_an_unknown_method(peer: GrpcPeer) -> None:
    trailers = await peer.call(1, fields("/conformance.Svc/nope"), b"x")
    frames = [fr for fr in peer.reader.frames if fr.sid == 1]
    assert frames[0].kind == f.HEADERS and frames[0].flags & f.END_STREAM  # then RST_STREAM NO_ERROR: DATA was due
    assert trailers["grpc-status"] == "12" and trailers[":status"] == "200" and "nope" in trailers["grpc-message"]
    assert "grpc-accept-encoding" in trailers


async def test_grpc_http2_status_message_is_percent_encoded(peer: GrpcPeer) -> None:
    trailers = await peer.call(1, fields("/conformance.Svc/refuse"), "naïve 100% sure\n".encode())
    assert trailers["grpc-status"] == "3" and trailers["grpc-message"] == "na%C3%AFve 100%25 sure%0A"


@pytest.mark.parametrize(
    ("method", "status"), [("GET", "405"), ("PUT", "405")], ids=["grpc-http2-method-get", "grpc-http2-method-put"]
)
async def test_grpc_http2_method_must_be_post(peer: GrpcPeer, method: str, status: str) -> None:
    rows = [(n, method if n == ":method" else v) for n, v in REQUEST]
    await peer.call(1, rows, None)
    assert peer.reader.blocks[1][0][":status"] == status


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [("application/grpc", True), ("application/grpc+proto", True), ("application/json", False), ("text/plain", False)],
    ids=["grpc-http2-ct-grpc", "grpc-http2-ct-grpc-proto", "grpc-http2-ct-json-415", "grpc-http2-ct-text-415"],
)
async def test_grpc_http2_content_type(peer: GrpcPeer, content_type: str, ok: bool) -> None:
    rows = [(n, content_type if n == "content-type" else v) for n, v in REQUEST]
    trailers = await peer.call(1, rows, b"x")
    if ok:
        assert trailers == {"grpc-status": "0"}
    else:
        assert peer.reader.blocks[1][0][":status"] == "415"


@pytest.mark.parametrize(
    "timeout", ["1m", "50m", "100000u", "20000000n", "1S"],
    ids=["grpc-http2-timeout-ms", "grpc-http2-timeout-50ms", "grpc-http2-timeout-us", "grpc-http2-timeout-ns",
         "grpc-http2-timeout-s"],
)  # fmt: skip
async def test_grpc_http2_timeout_ends_the_call(peer: GrpcPeer, timeout: str) -> None:
    trailers = await peer.call(1, fields("/conformance.Svc/sleep", grpc_timeout=timeout), b"x")
    assert trailers["grpc-status"] == "4"


@pytest.mark.parametrize(
    "timeout", ["", "1", "1x", "123456789S", "-1S"],
    ids=["grpc-http2-timeout-empty", "grpc-http2-timeout-no-unit", "grpc-http2-timeout-bad-unit",
         "grpc-http2-timeout-9-digits", "grpc-http2-timeout-negative"],
)  # fmt: skip
async def test_grpc_http2_malformed_timeout_sets_no_deadline(peer: GrpcPeer, timeout: str) -> None:
    trailers = await peer.call(1, fields(grpc_timeout=timeout), b"x")
    assert trailers == {"grpc-status": "0"}


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("identity", None)],
    ids=["grpc-compression-gzip", "grpc-compression-deflate", "grpc-compression-identity"],
)
async def test_grpc_compression_supported_encodings(peer: GrpcPeer, encoding: str, compress: object) -> None:
    body = b"payload" * 10
    rows = fields(grpc_encoding=encoding)
    peer.send(headers_frame(peer.encoder.block(rows), 1))
    message = grpc_message(compress(body), 1) if callable(compress) else grpc_message(body)
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, message))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1) == {"grpc-status": "0"}
    data = b"".join(fr.payload for fr in peer.reader.frames if fr.kind == f.DATA and fr.sid == 1)
    assert data == grpc_message(body)


@pytest.mark.parametrize("encoding", ["br", "snappy", "x-custom"], ids=lambda e: f"grpc-compression-unknown-{e}")
async def test_grpc_compression_unknown_encoding_is_unimplemented(peer: GrpcPeer, encoding: str) -> None:
    """Issue 25 row 13."""
    trailers = await peer.call(1, fields(grpc_encoding=encoding), b"x")
    assert trailers["grpc-status"] == "12" and set(trailers["grpc-accept-encoding"].split(",")) >= {"gzip"}


async def test_grpc_compression_flag_without_encoding_is_internal(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(ECHO), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x", 1)))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1)["grpc-status"] == "13"


async def test_grpc_compression_corrupt_message_is_internal(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(fields(grpc_encoding="gzip")), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"not gzip", 1)))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1)["grpc-status"] == "13"


async def test_grpc_http2_invalid_compression_flag_is_internal(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(ECHO), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x", 2)))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1)["grpc-status"] == "13"


async def test_grpc_http2_message_over_limit_is_resource_exhausted(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(ECHO), 1))
    peer.send(f.frame(f.DATA, 0, 1, struct.pack(">BI", 0, 1 << 20)))  # its prefix alone
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1)["grpc-status"] == "8"


async def test_grpc_http2_decompressed_over_limit_is_resource_exhausted(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(fields(grpc_encoding="gzip")), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(gzip.compress(b"\0" * (1 << 20)), 1)))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1)["grpc-status"] == "8"


async def test_grpc_http2_missing_message_for_unary(peer: GrpcPeer) -> None:
    trailers = await peer.call(1, ECHO, None)
    assert trailers["grpc-status"] == "12"


async def test_grpc_http2_two_messages_for_unary(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(ECHO), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"a") + grpc_message(b"b")))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1)["grpc-status"] == "12"


async def test_grpc_http2_message_split_over_data_frames(peer: GrpcPeer) -> None:
    message = grpc_message(b"abcdef")
    peer.send(headers_frame(peer.encoder.block(ECHO), 1))
    for i in range(len(message)):
        peer.send(f.frame(f.DATA, f.END_STREAM if i == len(message) - 1 else 0, 1, message[i : i + 1]))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.trailers(1) == {"grpc-status": "0"}


async def test_grpc_http2_metadata_reaches_the_handler(peer: GrpcPeer) -> None:
    rows = fields("/conformance.Svc/metadata", x_k="v", x_data_bin="AAEC", grpc_timeout="10S")
    await peer.call(1, rows, b"x")
    data = b"".join(fr.payload for fr in peer.reader.frames if fr.kind == f.DATA and fr.sid == 1)
    assert b"('x-k', 'v')" in data and b"('x-data-bin', b'\\x00\\x01\\x02')" in data
    assert b"grpc-timeout" not in data and b"content-type" not in data and b"te'" not in data


@pytest.mark.parametrize("count", [120, 130, 250], ids=lambda n: f"issue25-row2-{n}-metadata-entries")
async def test_grpc_http2_many_metadata_entries_are_served(peer: GrpcPeer, count: int) -> None:
    rows = fields("/conformance.Svc/metadata", **{f"x_k{i}": "v" * 20 for i in range(count)})
    trailers = await peer.call(1, rows, b"x")
    assert trailers == {"grpc-status": "0"}


@pytest.mark.parametrize("size", [17 << 10, 21 << 10, 40 << 10], ids=lambda n: f"issue25-row3-metadata-{n >> 10}k")
async def test_grpc_http2_metadata_over_the_advertised_limit_fails_that_call_only(peer: GrpcPeer, size: int) -> None:
    peer.send(headers_frame(peer.encoder.block(fields("/conformance.Svc/sleep")), 1))  # a call in flight
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x")))
    block = peer.encoder.block(fields(x_big="v" * size), huffman=False)
    out = headers_frame(block[:16384], 3, end_headers=False)
    rest = block[16384:]
    while rest:
        part, rest = rest[:16384], rest[16384:]
        out += f.frame(f.CONTINUATION, 0 if rest else f.END_HEADERS, 3, part)
    peer.send(out + f.frame(f.DATA, f.END_STREAM, 3, grpc_message(b"x")))
    await peer.settle(lambda r: stream_done(r, 3))
    assert peer.reader.trailers(3)["grpc-status"] == "8" and peer.reader.goaway() is None
    assert 1 in peer.protocol.h2.streams  # the other call goes on
    assert await peer.call(5, body=b"after") == {"grpc-status": "0"}


async def test_grpc_http2_rst_stream_cancels_the_call(peer: GrpcPeer) -> None:
    peer.send(headers_frame(peer.encoder.block(fields("/conformance.Svc/sleep")), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x")))
    await peer.settle()
    assert 1 in peer.protocol.h2.streams
    peer.send(f.frame(f.RST_STREAM, 0, 1, struct.pack(">L", f.CANCEL)))
    await peer.settle()
    assert 1 not in peer.protocol.h2.streams and peer.reader.goaway() is None


async def test_grpc_http2_malformed_request_is_a_stream_error_not_a_call(peer: GrpcPeer) -> None:
    """Issue 25 row 7: served with grpc-status 0 before; now RST_STREAM PROTOCOL_ERROR."""
    peer.send(headers_frame(peer.encoder.block([*ECHO, ("X-Upper", "1")], huffman=False), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"x")))
    await peer.settle(lambda r: stream_done(r, 1))
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR and 1 not in peer.reader.blocks
    assert await peer.call(3, body=b"after") == {"grpc-status": "0"}


async def test_grpc_http2_empty_path_is_a_stream_error(peer: GrpcPeer) -> None:
    """Issue 25 row 8: UNIMPLEMENTED before; an empty :path is malformed (RFC 9113 8.3.1)."""
    await peer.call(1, fields(""), b"x")
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR


async def test_grpc_http2_table_size_update_before_the_first_reply(peer: GrpcPeer) -> None:
    """Issue 25 row 1, on the gRPC server."""
    peer.send(f.frame(f.SETTINGS, 0, 0, struct.pack(">HL", f.S_HEADER_TABLE_SIZE, 0)))
    await peer.call(1, body=b"x")
    first = next(fr for fr in peer.reader.frames if fr.kind == f.HEADERS)
    assert first.payload[:1] == b"\x20"
