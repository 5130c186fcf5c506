"""The HTTP/2 rows of issue 25 over loopback against a real ``seqserve serve`` (its default
builtin gRPC server): raw frames from ``LivePeer`` and calls from grpcio (an independent
HTTP/2 and gRPC implementation). Each case's id names its section."""

from __future__ import annotations

import queue
import struct
import threading
from collections.abc import Iterator

import grpc
import pytest

from seqserve.api.transport import h2_frames as f
from tests.support.h2_peer import HELLO, LivePeer, grpc_message, headers_frame, settings, stream_done
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, serving

LIVE = "/inference.GRPCInferenceService/ServerLive"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(DEMO_REPO, log_dir=tmp_path_factory.mktemp("logs")) as s:
        yield s


@pytest.fixture
def peer(srv: ServerProcess) -> Iterator[LivePeer]:
    p = LivePeer(srv.grpc_port)
    p.send(HELLO)
    yield p
    p.close()


def request_fields(path: str = LIVE, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]  # fmt: skip


def live_call(peer: LivePeer, sid: int, *extra: tuple[str, str], huffman: bool = True) -> dict[str, str]:
    peer.send(headers_frame(peer.encoder.block(request_fields(LIVE, *extra), huffman=huffman), sid))
    peer.send(f.frame(f.DATA, f.END_STREAM, sid, grpc_message(b"")))
    return peer.read_until(lambda r: stream_done(r, sid)).trailers(sid)


def test_rfc7541_4_2_live_table_size_update(peer: LivePeer) -> None:
    """Row 1: nghttp2 clients with a header table below 4096."""
    peer.send(settings((f.S_HEADER_TABLE_SIZE, 0)))
    assert live_call(peer, 1) == {"grpc-status": "0"}
    first = next(fr for fr in peer.reader.frames if fr.kind == f.HEADERS)
    assert first.payload[:1] == b"\x20"
    assert live_call(peer, 3) == {"grpc-status": "0"}


def test_rfc9113_8_live_malformed_request_is_a_stream_error(peer: LivePeer) -> None:
    """Row 7: the stream is reset, the connection serves the next call."""
    peer.send(headers_frame(peer.encoder.block([*request_fields(), ("X-Upper", "1")], huffman=False), 1))
    peer.send(f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"")))
    peer.read_until(lambda r: r.rst(1) is not None)
    assert peer.reader.rst(1) == f.PROTOCOL_ERROR
    assert live_call(peer, 3) == {"grpc-status": "0"} and peer.reader.goaway() is None


def test_rfc9113_8_3_1_live_empty_path(peer: LivePeer) -> None:
    """Row 8."""
    peer.send(headers_frame(peer.encoder.block(request_fields("")), 1, end_stream=True))
    assert peer.read_until(lambda r: r.rst(1) is not None).rst(1) == f.PROTOCOL_ERROR


def test_rfc9113_5_1_live_data_after_both_end_streams(peer: LivePeer) -> None:
    """Row 9."""
    live_call(peer, 1)
    peer.send(f.frame(f.DATA, 0, 1, b"x"))
    assert peer.read_until(lambda r: r.rst(1) is not None).rst(1) == f.STREAM_CLOSED
    assert live_call(peer, 3) == {"grpc-status": "0"}


def test_rfc9113_5_1_1_live_lower_unused_stream_id(peer: LivePeer) -> None:
    """Row 11."""
    live_call(peer, 5)
    peer.send(headers_frame(peer.encoder.block(request_fields()), 3, end_stream=True))
    assert peer.read_until(lambda r: r.goaway() is not None).goaway() == f.PROTOCOL_ERROR


def test_rfc9113_6_5_live_settings_of_33_entries(peer: LivePeer) -> None:
    """Row 12."""
    peer.send(settings(*[(f.S_INITIAL_WINDOW_SIZE, 65535)] * 33))
    assert live_call(peer, 1) == {"grpc-status": "0"}
    acks = [fr for fr in peer.reader.frames if fr.kind == f.SETTINGS and fr.flags & f.ACK]
    assert len(acks) == 2 and peer.reader.goaway() is None


def test_grpc_compression_live_unknown_encoding(peer: LivePeer) -> None:
    """Row 13."""
    trailers = live_call(peer, 1, ("grpc-encoding", "br"))
    assert trailers["grpc-status"] == "12" and "gzip" in trailers["grpc-accept-encoding"]
    live_call(peer, 3)
    assert "gzip" in peer.reader.blocks[3][0]["grpc-accept-encoding"]


def test_window_update_flood_on_closed_streams_is_sent_away_live(peer: LivePeer, srv: ServerProcess) -> None:
    """Issue 24 item 6: the flood costs its own connection, not the server."""
    live_call(peer, 1)
    peer.send(f.frame(f.WINDOW_UPDATE, 0, 1, struct.pack(">L", 1)) * 5000)
    assert peer.read_until(lambda r: r.goaway() is not None).goaway() == f.ENHANCE_YOUR_CALM
    other = LivePeer(srv.grpc_port)
    other.send(HELLO)
    assert live_call(other, 1) == {"grpc-status": "0"}
    other.close()


class OpenStream:
    """A ModelStreamInfer call left open on a channel (its requests wait on a queue)."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.requests: queue.Queue[bytes | None] = queue.Queue()
        call = channel.stream_stream(STREAM)
        self.replies = call(iter(self.requests.get, None))
        self.done = threading.Event()
        self.error: grpc.RpcError | None = None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        try:
            for _ in self.replies:
                pass
        except grpc.RpcError as e:
            self.error = e
        self.done.set()

    def close(self) -> grpc.StatusCode:
        self.requests.put(None)
        assert self.done.wait(15)
        return grpc.StatusCode.OK if self.error is None else self.error.code()


@pytest.mark.parametrize("entries", [130, 200], ids=lambda n: f"issue25-row2-grpcio-{n}-metadata")
def test_grpcio_many_metadata_entries_served_and_the_channel_lives(srv: ServerProcess, entries: int) -> None:
    """Row 2: grpcio with more than 128 metadata entries (under the advertised 16 KiB)."""
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stream = OpenStream(channel)
        live = channel.unary_unary(LIVE)
        metadata = tuple((f"x-k{i}", "v" * 10) for i in range(entries))
        assert live(b"", metadata=metadata, timeout=15) is not None
        assert not stream.done.is_set()
        assert stream.close() == grpc.StatusCode.OK


@pytest.mark.parametrize("size", [21 << 10, 40 << 10], ids=lambda n: f"issue25-row3-grpcio-{n >> 10}k-value")
def test_grpcio_metadata_over_the_limit_is_resource_exhausted_alone(srv: ServerProcess, size: int) -> None:
    """Row 3: RESOURCE_EXHAUSTED (not UNAVAILABLE, which retry policies retry), channel alive."""
    with grpc.insecure_channel(srv.grpc_url) as channel:
        stream = OpenStream(channel)
        live = channel.unary_unary(LIVE)
        with pytest.raises(grpc.RpcError) as err:
            live(b"", metadata=(("x-big", "v" * size),), timeout=15)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert live(b"", timeout=15) is not None and not stream.done.is_set()
        assert stream.close() == grpc.StatusCode.OK


def test_rfc9113_6_5_2_live_header_list_over_the_advertised_limit(peer: LivePeer) -> None:
    """Row 3 in raw frames (whatever a client library checks on its side)."""
    block = peer.encoder.block(request_fields(LIVE, ("x-big", "v" * (30 << 10))), huffman=False)
    out = headers_frame(block[:16384], 1, end_headers=False)
    out += f.frame(f.CONTINUATION, f.END_HEADERS, 1, block[16384:])
    peer.send(out + f.frame(f.DATA, f.END_STREAM, 1, grpc_message(b"")))
    assert peer.read_until(lambda r: stream_done(r, 1)).trailers(1)["grpc-status"] == "8"
    assert live_call(peer, 3) == {"grpc-status": "0"} and peer.reader.goaway() is None
