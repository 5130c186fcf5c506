"""The builtin gRPC server (api/transport: grpc_server, grpc_calls over h2_protocol and the
sans-IO h2_connection), driven over a socket frame by frame by a client made with the ``h2``
library: gRPC's framing, statuses, deadlines, compression and cancellation, HTTP/2 flow
control, and the limits a hostile client meets. The servicers' own
behaviour runs against this server in every integration test (it is the default)."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from seqserve.api.limits import GrpcLimits
from seqserve.api.transport import grpc_calls, h2_streams
from seqserve.api.transport import h2_frames as http2
from seqserve.api.transport.grpc_context import CallAborted, Method, Status
from seqserve.api.transport.grpc_server import BuiltinGrpcServer

SVC = "/test.Svc/"


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.metadata: tuple[Any, ...] = ()

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.metadata = context.metadata
        return request

    async def meta(self, request: bytes, context: Any) -> bytes:
        return str(dict(context.metadata).get("x-k")).encode()

    async def big(self, request: bytes, context: Any) -> bytes:
        return b"x" * int(request)

    async def slow(self, request: bytes, context: Any) -> bytes:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def fail(self, request: bytes, context: Any) -> bytes:
        raise CallAborted(Status.INVALID_ARGUMENT, request.decode())

    async def crash(self, request: bytes, context: Any) -> bytes:
        raise RuntimeError("secret detail")

    async def stream(self, requests: Any, context: Any) -> AsyncIterator[bytes]:
        while (m := await context.read()) is not None:
            yield m.upper()


def methods(h: Handlers) -> dict[bytes, Method]:
    out = {}
    for name in ("echo", "meta", "big", "slow", "fail", "crash"):
        out[f"{SVC}{name}".encode()] = Method(getattr(h, name), False, None, None)
    out[f"{SVC}stream".encode()] = Method(h.stream, True, None, None)
    return out


LIMITS = GrpcLimits(max_receive_message_bytes=1 << 16, max_send_message_bytes=1 << 20, max_concurrent_streams=4)


@pytest.fixture
async def served() -> AsyncIterator[tuple[BuiltinGrpcServer, Handlers, int]]:
    h = Handlers()
    server = BuiltinGrpcServer(methods(h), LIMITS)
    sock = socket.create_server(("127.0.0.1", 0))
    await server.start(sock)
    yield server, h, sock.getsockname()[1]
    await server.stop(None)


class Client:
    """A raw HTTP/2 client: h2's state machine over an asyncio stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, **settings: int) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.events: list[Any] = []
        self.flush()

    @classmethod
    async def open(cls, port: int, **settings: int) -> Client:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        return cls(r, w, **settings)

    def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def request(self, method: str, body: bytes | None, *, extra: list[tuple[str, str]] | None = None) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [*_headers(method), ("te", "trailers"), *(extra or [])]
        self.conn.send_headers(sid, headers, end_stream=body is None)
        if body is not None:
            self.conn.send_data(sid, body, end_stream=True)
        self.flush()
        return sid

    async def pump(self, until: Any, timeout: float = 5.0) -> list[Any]:
        async def loop() -> None:
            while not until(self.events):
                data = await self.reader.read(65536)
                if not data:
                    self.events.append("EOF")
                    return
                for ev in self.conn.receive_data(data):
                    if isinstance(ev, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    self.events.append(ev)
                self.flush()

        await asyncio.wait_for(loop(), timeout)
        return self.events

    async def call(self, method: str, body: bytes | None, **kw: Any) -> tuple[dict[str, str], bytes, dict[str, str]]:
        sid = self.request(method, body, **kw)
        await self.pump(lambda evs: _ended(evs, sid))
        return reply_of(self.events, sid)

    def close(self) -> None:
        self.writer.close()


def _headers(method: str, *, http_method: str = "POST", content_type: str = "application/grpc") -> list[Any]:
    return [
        (":method", http_method), (":scheme", "http"), (":path", SVC + method), (":authority", "x"),
        ("content-type", content_type),
    ]  # fmt: skip


def _ended(events: list[Any], sid: int) -> bool:
    return "EOF" in events or any(
        isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == sid for e in events
    )


def reply_of(events: list[Any], sid: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
    headers: dict[str, str] = {}
    trailers: dict[str, str] = {}
    data = b""
    for e in events:
        if getattr(e, "stream_id", None) != sid:
            continue
        if isinstance(e, h2.events.ResponseReceived):
            headers = dict(e.headers)
        elif isinstance(e, h2.events.TrailersReceived):
            trailers = dict(e.headers)
        elif isinstance(e, h2.events.DataReceived):
            data += e.data
    if "grpc-status" in headers:  # trailers-only
        trailers = headers
    return headers, data, trailers


def msg(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def unframe(data: bytes) -> list[bytes]:
    out = []
    while data:
        n = struct.unpack(">I", data[1:5])[0]
        out.append(data[5 : 5 + n])
        data = data[5 + n :]
    return out


async def test_unary_echo_and_metadata(served: Any) -> None:
    _, h, port = served
    c = await Client.open(port)
    headers, data, trailers = await c.call(
        "echo", msg(b"hello"), extra=[("x-key", "v1"), ("x-bin", "AAEC"), ("grpc-timeout", "5S")]
    )
    assert headers[":status"] == "200" and headers["content-type"] == "application/grpc"
    assert unframe(data) == [b"hello"] and trailers["grpc-status"] == "0"
    md = dict(h.metadata)
    assert md["x-key"] == "v1" and md["x-bin"] == b"\x00\x01\x02" and "grpc-timeout" not in md
    c.close()


async def test_many_calls_on_one_connection(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    sids = [c.request("echo", msg(str(i).encode())) for i in range(3)]
    await c.pump(lambda evs: all(_ended(evs, s) for s in sids))
    assert [unframe(reply_of(c.events, s)[1]) for s in sids] == [[b"0"], [b"1"], [b"2"]]
    c.close()


async def test_unknown_method_and_content_type(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    _, _, trailers = await c.call("nope", msg(b""))
    assert trailers["grpc-status"] == "12" and "Method not found" in trailers["grpc-message"]
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, _headers("echo", content_type="text/plain"), end_stream=True)
    c.flush()
    await c.pump(lambda evs: _ended(evs, sid))
    assert reply_of(c.events, sid)[0][":status"] == "415"
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, _headers("echo", http_method="GET"), end_stream=True)
    c.flush()
    await c.pump(lambda evs: _ended(evs, sid))
    assert reply_of(c.events, sid)[0][":status"] == "405"
    c.close()


async def test_abort_message_is_percent_encoded_and_crash_hides_detail(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    _, _, trailers = await c.call("fail", msg("bad ü 100%\n".encode()))
    assert trailers["grpc-status"] == str(grpc.StatusCode.INVALID_ARGUMENT.value[0])
    assert urllib.parse.unquote(trailers["grpc-message"]) == "bad ü 100%\n"
    _, _, trailers = await c.call("crash", msg(b""))
    assert trailers["grpc-status"] == "2" and "secret" not in trailers.get("grpc-message", "")
    c.close()


async def test_message_over_limit_is_refused_before_it_is_read(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, _headers("echo"))
    c.conn.send_data(sid, struct.pack(">BI", 0, 10 << 20) + b"x" * 100)  # claims 10 MiB, sends 100 B
    c.flush()
    await c.pump(lambda evs: _ended(evs, sid))
    trailers = reply_of(c.events, sid)[2]
    assert trailers["grpc-status"] == "8" and "larger than max" in trailers["grpc-message"]
    _, data, _ = await c.call("echo", msg(b"still fine"))  # the connection goes on
    assert unframe(data) == [b"still fine"]
    c.close()


async def test_compression(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    _, data, trailers = await c.call("echo", msg(gzip.compress(b"z" * 1000), 1), extra=[("grpc-encoding", "gzip")])
    assert trailers["grpc-status"] == "0" and unframe(data) == [b"z" * 1000]
    _, _, trailers = await c.call("echo", msg(b"abc", 1))
    assert trailers["grpc-status"] == "13"  # compressed without an encoding
    _, _, trailers = await c.call("echo", msg(b"abc"), extra=[("grpc-encoding", "snappy")])
    assert trailers["grpc-status"] == "12"
    bomb = gzip.compress(b"\0" * (1 << 20))  # 1 KiB that inflates past the 64 KiB limit
    _, _, trailers = await c.call("echo", msg(bomb, 1), extra=[("grpc-encoding", "gzip")])
    assert trailers["grpc-status"] == "8"
    c.close()


async def test_deadline_cancels_the_handler(served: Any) -> None:
    _, h, port = served
    c = await Client.open(port)
    _, _, trailers = await c.call("slow", msg(b""), extra=[("grpc-timeout", "100m")])
    assert trailers["grpc-status"] == "4" and trailers["grpc-message"] == "Deadline Exceeded"
    await asyncio.wait_for(h.cancelled.wait(), 2)
    c.close()


async def test_reset_cancels_the_handler(served: Any) -> None:
    _, h, port = served
    c = await Client.open(port)
    sid = c.request("slow", msg(b""))
    await asyncio.sleep(0.1)
    c.conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    c.flush()
    await asyncio.wait_for(h.cancelled.wait(), 2)
    _, data, _ = await c.call("echo", msg(b"after"))
    assert unframe(data) == [b"after"]
    c.close()


async def test_streams_beyond_the_limit_are_refused(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    await c.pump(lambda evs: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in evs))
    c.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 100  # let h2 send them
    c.conn.remote_settings.acknowledge()
    sids = [c.request("slow", msg(b"")) for _ in range(5)]
    await c.pump(lambda evs: _ended(evs, sids[-1]))
    reset = [e for e in c.events if isinstance(e, h2.events.StreamReset)]
    assert [e.stream_id for e in reset] == [sids[-1]] and reset[0].error_code == http2.REFUSED_STREAM
    c.close()


async def test_reply_larger_than_the_clients_window(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    _, data, trailers = await c.call("big", msg(b"300000"))
    assert trailers["grpc-status"] == "0" and unframe(data) == [b"x" * 300000]
    c.close()


async def test_bidirectional_stream(served: Any) -> None:
    _, _, port = served
    c = await Client.open(port)
    sid = c.request("stream", b"")  # no messages: replies nothing, ends OK
    await c.pump(lambda evs: _ended(evs, sid))
    assert reply_of(c.events, sid)[2]["grpc-status"] == "0"
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, _headers("stream"))
    c.conn.send_data(sid, msg(b"a") + msg(b"b"))
    c.flush()
    await c.pump(lambda evs: len(unframe(reply_of(evs, sid)[1])) == 2)
    c.conn.send_data(sid, msg(b"c"), end_stream=True)
    c.flush()
    await c.pump(lambda evs: _ended(evs, sid))
    _, data, trailers = reply_of(c.events, sid)
    assert unframe(data) == [b"A", b"B", b"C"] and trailers["grpc-status"] == "0"
    c.close()


async def _raw(port: int, data: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    out = b""
    try:
        while chunk := await asyncio.wait_for(r.read(65536), 5):
            out += chunk
    except ConnectionError:
        pass
    w.close()
    return out


def _goaway_code(data: bytes) -> int | None:
    """The error code of the first GOAWAY among the server's frames (after its preface)."""
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if data[pos + 3] == http2.GOAWAY:
            return int.from_bytes(data[pos + 13 : pos + 17], "big")
        pos += 9 + length
    return None


_SETTINGS = http2.frame(http2.SETTINGS, 0, 0)


async def test_connection_errors(served: Any) -> None:
    _, _, port = served
    assert _goaway_code(await _raw(port, b"GET / HTTP/1.1\r\n\r\n")) == http2.PROTOCOL_ERROR
    huge = http2.frame_header(http2.DATA, 0, 1, http2.MAX_FRAME_SIZE + 1)
    assert _goaway_code(await _raw(port, http2.PREFACE + _SETTINGS + huge)) == http2.FRAME_SIZE_ERROR
    first_not_settings = http2.frame(http2.PING, 0, 0, b"\0" * 8)
    assert _goaway_code(await _raw(port, http2.PREFACE + first_not_settings)) == http2.PROTOCOL_ERROR
    continuation = http2.frame(http2.CONTINUATION, 0, 1, b"\0" * 16000)
    endless = http2.frame(http2.HEADERS, 0, 1, b"\x00" * 1000) + continuation * 10
    assert _goaway_code(await _raw(port, http2.PREFACE + _SETTINGS + endless)) == http2.ENHANCE_YOUR_CALM
    even = http2.frame(http2.HEADERS, http2.END_HEADERS, 2, b"\x83")
    assert _goaway_code(await _raw(port, http2.PREFACE + _SETTINGS + even)) == http2.PROTOCOL_ERROR
    overflow = http2.frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">L", 2**31 - 1))
    assert _goaway_code(await _raw(port, http2.PREFACE + _SETTINGS + overflow)) == http2.FLOW_CONTROL_ERROR


async def test_rapid_reset_is_sent_away(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, port = served
    monkeypatch.setattr(h2_streams, "MAX_RESETS_PER_S", 5)
    c = await Client.open(port)
    for _ in range(30):
        sid = c.request("slow", msg(b""))
        c.conn.reset_stream(sid)
    c.flush()
    await c.pump(lambda evs: "EOF" in evs or any(isinstance(e, h2.events.ConnectionTerminated) for e in evs))
    ended = [e for e in c.events if isinstance(e, h2.events.ConnectionTerminated)]
    assert ended and ended[0].error_code == http2.ENHANCE_YOUR_CALM
    c.close()


async def test_a_flood_of_frames_does_not_hold_the_loop(served: Any) -> None:
    """50,000 tiny frames in one write: the server takes them in turns of FRAMES_PER_TURN, and
    a call on another connection is answered meanwhile."""
    _, _, port = served
    _, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(http2.PREFACE + _SETTINGS + http2.frame(http2.PING, 0, 0, b"\0" * 8) * 50000)
    other = await Client.open(port)
    _, data, _ = await asyncio.wait_for(other.call("echo", msg(b"served")), 5)
    assert unframe(data) == [b"served"]
    w.close()
    other.close()


@pytest.mark.parametrize(
    "frames",
    [
        http2.frame(http2.SETTINGS, 0, 0) * 3000,
        http2.frame(http2.PRIORITY, 0, 1, b"\0\0\0\0\x10") * 3000,
        http2.frame(http2.HEADERS, http2.END_HEADERS, 1, b"\x00\x01a\x00" * 40000),  # one 160 KiB block
        http2.frame(http2.WINDOW_UPDATE, 0, 0, b"\0\0\0\x01") * 50000,
    ],
    ids=["settings", "priority", "large-block", "window-update"],
)
async def test_floods_are_sent_away(served: Any, frames: bytes) -> None:
    _, _, port = served
    assert _goaway_code(await _raw(port, http2.PREFACE + _SETTINGS + frames)) == http2.ENHANCE_YOUR_CALM


def _call_frames(sid: int, method: str, body: bytes, *, end: bool = True) -> bytes:
    block = (
        b"\x83\x86"  # :method POST, :scheme http
        + b"\x04" + bytes([len(SVC + method)]) + (SVC + method).encode()
        + b"\x0f\x10" + bytes([16]) + b"application/grpc"
    )  # fmt: skip
    out = http2.frame(http2.HEADERS, http2.END_HEADERS, sid, block)
    if body or end:
        out += http2.frame(http2.DATA, http2.END_STREAM if end else 0, sid, body)
    return out


async def test_resets_the_client_provokes_count_as_resets(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """DATA after END_STREAM makes the server reset the stream (STREAM_CLOSED) and cancel its
    handler: as costly as a reset by the client, and counted with them."""
    _, _, port = served
    monkeypatch.setattr(h2_streams, "MAX_RESETS_PER_S", 5)
    out = http2.PREFACE + _SETTINGS
    for i in range(30):
        sid = 2 * i + 1
        out += _call_frames(sid, "slow", msg(b"")) + http2.frame(http2.DATA, 0, sid, b"x")
    assert _goaway_code(await _raw(port, out)) == http2.ENHANCE_YOUR_CALM


async def test_early_replies_are_not_resets(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls the server answers before their client has sent everything (a message over the
    limit) end with RST_STREAM NO_ERROR: the calls are over, so these do not count as resets."""
    _, _, port = served
    monkeypatch.setattr(h2_streams, "MAX_RESETS_PER_S", 5)
    c = await Client.open(port)
    for _ in range(30):
        sid = c.conn.get_next_available_stream_id()
        c.conn.send_headers(sid, _headers("echo"))
        c.conn.send_data(sid, struct.pack(">BI", 0, 10 << 20))
        c.flush()
        await c.pump(lambda evs, sid=sid: _ended(evs, sid))
        assert reply_of(c.events, sid)[2]["grpc-status"] == "8"
    _, data, _ = await c.call("echo", msg(b"still here"))
    assert unframe(data) == [b"still here"]
    c.close()


async def test_late_frames_on_a_stream_the_server_reset_are_ignored(served: Any) -> None:
    """A message over the limit is answered at once and the stream reset; the client's frames
    already on their way (its trailers here) must not end the connection."""
    _, _, port = served
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(http2.PREFACE + _SETTINGS + _call_frames(1, "echo", struct.pack(">BI", 0, 10 << 20), end=False))
    got = b""
    while b"grpc-status" not in got:
        got += await asyncio.wait_for(r.read(65536), 5)
    w.write(http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, b"\x00\x01a\x01b"))
    w.write(_call_frames(3, "echo", msg(b"after")))
    while 3 not in _data_by_stream(got):
        chunk = await asyncio.wait_for(r.read(65536), 5)
        assert chunk, got
        got += chunk
    assert unframe(_data_by_stream(got)[3]) == [b"after"] and _goaway_code(got) is None
    w.close()


async def test_a_request_that_stops_arriving_ends(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, port = served
    monkeypatch.setattr(grpc_calls, "STALL_S", 0.3)
    c = await Client.open(port)
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, _headers("echo"))
    c.conn.send_data(sid, struct.pack(">BI", 0, 100) + b"x" * 10)  # 10 of 100 bytes, then nothing
    c.flush()
    await c.pump(lambda evs: _ended(evs, sid))
    trailers = reply_of(c.events, sid)[2]
    assert trailers["grpc-status"] == "4" and "did not arrive" in trailers["grpc-message"]
    c.close()


async def test_many_small_messages_on_a_stream(served: Any) -> None:
    """2,000 messages in one write: parsed a few at a time as the handler reads, all answered."""
    _, _, port = served
    c = await Client.open(port)
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, _headers("stream"))
    c.conn.send_data(sid, b"".join(msg(str(i % 10).encode()) for i in range(2000)), end_stream=True)
    c.flush()
    await c.pump(lambda evs: _ended(evs, sid), timeout=20)
    _, data, trailers = reply_of(c.events, sid)
    assert trailers["grpc-status"] == "0" and unframe(data) == [str(i % 10).encode() for i in range(2000)]
    c.close()


async def test_large_compressed_messages_inflate_off_the_loop() -> None:
    server = BuiltinGrpcServer(methods(Handlers()), GrpcLimits(max_receive_message_bytes=4 << 20))
    sock = socket.create_server(("127.0.0.1", 0))
    await server.start(sock)
    try:
        c = await Client.open(sock.getsockname()[1])
        body = bytes(range(256)) * 4096  # 1 MiB: past what is inflated on the loop
        _, data, trailers = await c.call("echo", msg(gzip.compress(body), 1), extra=[("grpc-encoding", "gzip")])
        assert trailers["grpc-status"] == "0" and unframe(data) == [body]
        truncated = gzip.compress(body)[:-100]
        _, _, trailers = await c.call("echo", msg(truncated, 1), extra=[("grpc-encoding", "gzip")])
        assert trailers["grpc-status"] == "13" and "truncated" in urllib.parse.unquote(trailers["grpc-message"])
        c.close()
    finally:
        await server.stop(None)


async def test_idle_connection_gets_goaway(monkeypatch: pytest.MonkeyPatch) -> None:
    server = BuiltinGrpcServer(methods(Handlers()), GrpcLimits(max_connection_idle_s=0.5))
    sock = socket.create_server(("127.0.0.1", 0))
    await server.start(sock)
    try:
        c = await Client.open(sock.getsockname()[1])
        await c.call("echo", msg(b"x"))
        await c.pump(lambda evs: any(isinstance(e, h2.events.ConnectionTerminated) for e in evs), timeout=5)
    finally:
        await server.stop(None)


async def test_stop_lets_calls_finish_and_refuses_new_ones(served: Any) -> None:
    """A real grpcio client: the call in flight at the GOAWAY is answered, then the port is closed."""
    server, _, port = served
    server.methods[(SVC + "slow").encode()] = Method(_short, False, None, None)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(SVC + "slow")(b"done")
        await asyncio.sleep(0.1)
        stopping = asyncio.create_task(server.stop(2.0))
        assert await call == b"done"
        await stopping
    with pytest.raises((ConnectionError, OSError)):
        await asyncio.open_connection("127.0.0.1", port)


async def test_grpcio_client(served: Any) -> None:
    """grpcio's own client: statuses and details as a Python client sees them."""
    _, _, port = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert await channel.unary_unary(SVC + "echo")(b"abc", metadata=(("k", "v"),)) == b"abc"
        assert await channel.unary_unary(SVC + "big")(b"200000") == b"x" * 200000
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await channel.unary_unary(SVC + "fail")("nö".encode())
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and e.value.details() == "nö"
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await channel.unary_unary(SVC + "slow")(b"", timeout=0.2)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        stream = channel.stream_stream(SVC + "stream")()
        for m in (b"a", b"b"):
            await stream.write(m)
            assert await stream.read() == m.upper()
        await stream.done_writing()
        assert await stream.read() is grpc.aio.EOF
        assert await stream.code() == grpc.StatusCode.OK


async def _short(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(0.3)
    return request


async def test_connection_cap() -> None:
    server = BuiltinGrpcServer(methods(Handlers()), GrpcLimits(max_connections=1))
    sock = socket.create_server(("127.0.0.1", 0))
    await server.start(sock)
    port = sock.getsockname()[1]
    try:
        first = await Client.open(port)
        await first.call("echo", msg(b"x"))
        assert _goaway_code(await _raw(port, http2.PREFACE + _SETTINGS)) == http2.ENHANCE_YOUR_CALM
        _, data, _ = await first.call("echo", msg(b"y"))  # the first one is served on
        assert unframe(data) == [b"y"]
        first.close()
    finally:
        await server.stop(None)


async def test_repeated_header_blocks_follow_the_hpack_table(served: Any) -> None:
    """Header blocks the client repeats are decoded once (``h2_hpack.HeaderDecoder``); a block
    whose meaning changed with the table (insertions, evictions) must not be taken from before."""
    _, h, port = served
    c = await Client.open(port)
    for i in range(40):
        value = ("y" * 900 + str(i % 7)) if i % 3 else f"v{i % 2}"  # large values evict the others
        await c.call("echo", msg(b""), extra=[("x-k", value), ("x-same", "s")])
        md = dict(h.metadata)
        assert md["x-k"] == value and md["x-same"] == "s", i
    c.close()


def _data_by_stream(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big")
        if data[pos + 3] == http2.DATA:
            out[sid] = out.get(sid, b"") + data[pos + 9 : pos + 9 + length]
        pos += 9 + length
    return out


async def test_a_repeated_block_whose_index_moved_is_decoded_again(served: Any) -> None:
    """The same header block bytes mean another header once the table has changed: "index 62"
    is (x-k, a), then (x-k, b) after an insertion. Hand-made blocks, as no encoder would."""
    _, _, port = served
    base = (
        b"\x83\x86"  # :method POST, :scheme http (static)
        + b"\x04" + bytes([len(SVC) + 4]) + (SVC + "meta").encode()  # :path, literal, not indexed
        + b"\x0f\x10" + bytes([16]) + b"application/grpc"
    )  # fmt: skip
    insert_a = base + b"\x40\x03x-k\x01a"  # literal with incremental indexing: index 62
    insert_b = base + b"\x40\x03x-k\x01b"  # now (x-k, b) is 62 and (x-k, a) 63
    indexed = base + b"\xbe"  # index 62
    blocks = [insert_a, indexed, indexed, insert_b, indexed, indexed]
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(http2.PREFACE + _SETTINGS)
    got = b""
    for i, block in enumerate(blocks):  # one call at a time (the fixture allows 4 at once)
        sid = 2 * i + 1
        w.write(http2.frame(http2.HEADERS, http2.END_HEADERS, sid, block))
        w.write(http2.frame(http2.DATA, http2.END_STREAM, sid, msg(b"")))
        while sid not in _data_by_stream(got):
            chunk = await asyncio.wait_for(r.read(65536), 5)
            assert chunk
            got += chunk
    w.close()
    replies = _data_by_stream(got)
    assert [unframe(replies[2 * i + 1]) for i in range(len(blocks))] == [[b"a"], [b"a"], [b"a"], [b"b"], [b"b"], [b"b"]]
