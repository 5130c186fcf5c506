"""An HTTP/2 client peer for the conformance suite (tests/conformance/h2): frames written by hand,
header blocks by the ``hpack`` library (an encoder that shares no code with seqserve), and what
the server sends parsed back. ``CorePeer`` drives the sans-IO ``H2Connection`` with a minimal
server above it; ``GrpcPeer`` drives the builtin gRPC server's connection (``H2Protocol`` and
``GrpcConnection``) over a transport kept in memory; ``LivePeer`` a real socket."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import hpack

from seqserve.api.limits import GrpcLimits
from seqserve.api.transport import h2_frames as f
from seqserve.api.transport.grpc_calls import MAX_HEADER_LIST_BYTES, GrpcConnection
from seqserve.api.transport.grpc_context import CallAborted, Method, Status
from seqserve.api.transport.grpc_server import BuiltinGrpcServer
from seqserve.api.transport.h2_connection import H2Connection
from seqserve.api.transport.h2_events import Event, RequestReceived, StreamEnded
from seqserve.api.transport.h2_hpack import literal
from seqserve.api.transport.h2_protocol import H2Protocol

SETTINGS = f.frame(f.SETTINGS, 0, 0)
HELLO = f.PREFACE + SETTINGS
GRPC_PATH = "/conformance.Svc/echo"
REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", GRPC_PATH), (":authority", "x"),
           ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    sid: int
    payload: bytes

    @property
    def code(self) -> int:
        """A RST_STREAM's or GOAWAY's error code."""
        at = 4 if self.kind == f.GOAWAY else 0
        return int.from_bytes(self.payload[at : at + 4], "big")


def parse_frames(data: bytes) -> list[Frame]:
    out = []
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        out.append(Frame(data[pos + 3], data[pos + 4], sid, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def settings(*pairs: tuple[int, int]) -> bytes:
    return f.frame(f.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in pairs))


def grpc_message(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def headers_frame(block: bytes, sid: int, *, end_stream: bool = False, end_headers: bool = True) -> bytes:
    flags = (f.END_STREAM if end_stream else 0) | (f.END_HEADERS if end_headers else 0)
    return f.frame(f.HEADERS, flags, sid, block)


class Encoder:
    """The client's HPACK encoder (the ``hpack`` library), on bytes or str fields as given."""

    def __init__(self) -> None:
        self.hpack = hpack.Encoder()

    def block(self, fields: Iterable[tuple[Any, Any]], *, huffman: bool = True) -> bytes:
        raw = [(_b(n), _b(v)) for n, v in fields]
        return bytes(self.hpack.encode(raw, huffman=huffman))


def _b(x: Any) -> bytes:
    return x if isinstance(x, bytes) else str(x).encode()


class Reader:
    """What the server sent, frame by frame, with its header blocks decoded (``hpack``)."""

    def __init__(self) -> None:
        self.decoder = hpack.Decoder()
        self.frames: list[Frame] = []
        self.blocks: dict[int, list[dict[str, str]]] = {}
        self._block = bytearray()  # a header block whose CONTINUATION frames are still due

    def add(self, data: bytes) -> list[Frame]:
        new = parse_frames(data)
        for fr in new:
            if fr.kind in (f.HEADERS, f.CONTINUATION):
                self._block += fr.payload
                if fr.flags & f.END_HEADERS:
                    fields = self.decoder.decode(bytes(self._block))
                    self._block.clear()
                    self.blocks.setdefault(fr.sid, []).append({str(k): str(v) for k, v in fields})
        self.frames += new
        return new

    def goaway(self) -> int | None:
        return next((fr.code for fr in self.frames if fr.kind == f.GOAWAY), None)

    def rst(self, sid: int) -> int | None:
        return next((fr.code for fr in self.frames if fr.kind == f.RST_STREAM and fr.sid == sid), None)

    def kinds(self, sid: int | None = None) -> list[int]:
        return [fr.kind for fr in self.frames if sid is None or fr.sid == sid]

    def trailers(self, sid: int) -> dict[str, str]:
        """The stream's last header block (its trailers, or a trailers-only reply)."""
        return self.blocks.get(sid, [{}])[-1]


class CorePeer:
    """The sans-IO core with a server above it that accepts every request and answers it with
    a whole reply once the request ended (or ``answer=False``: leaves it open)."""

    def __init__(self, *, max_streams: int = 100, answer: bool = True, hello: bool = True) -> None:
        self.now = 100.0
        self.answer = answer
        self.conn = H2Connection(
            max_concurrent_streams=max_streams,
            max_header_list_bytes=MAX_HEADER_LIST_BYTES,
            on_output=lambda: None,
            clock=lambda: self.now,
        )
        self.encoder = Encoder()
        self.reader = Reader()
        self.events: list[Event] = []
        self.conn.initiate()
        self.server_preface = self.reader.add(self.conn.data_to_send())
        if hello:
            self.send(HELLO)

    def send(self, data: bytes) -> list[Frame]:
        conn = self.conn
        conn.feed(data)
        while True:
            for event in conn.events():
                self.events.append(event)
                if isinstance(event, RequestReceived):
                    conn.accept(event.stream_id, event.end_stream)
                elif isinstance(event, StreamEnded) and self.answer and event.stream.local_open:
                    conn.send_reply(event.stream, b"\x88", grpc_message(b"ok"), literal(b"grpc-status", b"0"))
            self.events += conn.take_events()
            if not conn.backlog:
                break
        return self.reader.add(conn.data_to_send())

    def request(self, sid: int, fields: Iterable[tuple[Any, Any]] = REQUEST, *, end_stream: bool = True) -> list[Frame]:
        return self.send(headers_frame(self.encoder.block(fields), sid, end_stream=end_stream))

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class MemoryTransport:
    """An asyncio transport that keeps what is written (no socket)."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def echo(request: bytes, context: Any) -> bytes:
    return request


async def metadata_echo(request: bytes, context: Any) -> bytes:
    return repr(sorted(context.metadata)).encode()


async def sleepy(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(30)
    return b""


async def refuse(request: bytes, context: Any) -> bytes:
    raise CallAborted(Status.INVALID_ARGUMENT, request.decode("utf-8", "replace"))


def conformance_methods() -> dict[bytes, Method]:
    return {
        b"/conformance.Svc/echo": Method(echo, False, None, None),
        b"/conformance.Svc/metadata": Method(metadata_echo, False, None, None),
        b"/conformance.Svc/sleep": Method(sleepy, False, None, None),
        b"/conformance.Svc/refuse": Method(refuse, False, None, None),
    }


GRPC_LIMITS = GrpcLimits(max_receive_message_bytes=1 << 16, max_send_message_bytes=1 << 20, max_concurrent_streams=8)


class GrpcPeer:
    """The builtin gRPC server's connection on a ``MemoryTransport`` (in a running loop)."""

    def __init__(self, limits: GrpcLimits = GRPC_LIMITS) -> None:
        self.server = BuiltinGrpcServer(conformance_methods(), limits)
        self.protocol = H2Protocol(
            lambda protocol: GrpcConnection(self.server, protocol),
            max_concurrent_streams=limits.max_concurrent_streams,
            max_header_list_bytes=MAX_HEADER_LIST_BYTES,
        )
        self.transport = MemoryTransport()
        self.protocol.connection_made(self.transport)
        self.encoder = Encoder()
        self.reader = Reader()
        self._seen = 0
        self.send(HELLO)

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    async def settle(self, until: Callable[[Reader], bool] | None = None, timeout: float = 10.0) -> Reader:
        """Run the loop until ``until`` holds of what was sent (or a few turns without one)."""
        deadline = time.monotonic() + timeout
        turns = 0
        while True:
            await asyncio.sleep(0)
            turns += 1
            self.protocol.flush()
            written = self.transport.written
            if len(written) > self._seen:
                self.reader.add(bytes(written[self._seen :]))
                self._seen = len(written)
            if until is None and turns >= 20:
                return self.reader
            if until is not None and until(self.reader):
                return self.reader
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not answer")
            if turns > 20:
                await asyncio.sleep(0.005)

    async def call(
        self, sid: int, fields: Iterable[tuple[Any, Any]] = REQUEST, body: bytes | None = b"", *, end: bool = True
    ) -> dict[str, str]:
        """A request (its headers, then ``body`` as one message unless None) and its status trailers."""
        fields = list(fields)
        if body is None:
            self.send(headers_frame(self.encoder.block(fields), sid, end_stream=end))
        else:
            self.send(headers_frame(self.encoder.block(fields), sid))
            self.send(f.frame(f.DATA, f.END_STREAM if end else 0, sid, grpc_message(body)))
        reader = await self.settle(lambda r: stream_done(r, sid))
        return reader.trailers(sid)

    def close(self) -> None:
        self.protocol.connection_lost(None)


def stream_done(reader: Reader, sid: int) -> bool:
    return (
        any(
            fr.sid == sid and (fr.kind == f.RST_STREAM or (fr.kind == f.HEADERS and fr.flags & f.END_STREAM))
            for fr in reader.frames
        )
        or reader.goaway() is not None
    )


class LivePeer:
    """A raw HTTP/2 connection to a real server: frames in, frames out (blocking, with a timeout);
    ``source``: the loopback address it connects from (to be another client)."""

    def __init__(self, port: int, timeout: float = 15.0, *, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.encoder = Encoder()
        self.reader = Reader()
        self.timeout = timeout
        self._buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_until(self, until: Callable[[Reader], bool]) -> Reader:
        deadline = time.monotonic() + self.timeout
        while not until(self.reader):
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not answer")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            self._buf += data
            pos = 0
            while len(self._buf) - pos >= 9:
                length = int.from_bytes(self._buf[pos : pos + 3], "big")
                if len(self._buf) - pos < 9 + length:
                    break
                pos += 9 + length
            self.reader.add(self._buf[:pos])
            self._buf = self._buf[pos:]
        return self.reader

    def close(self) -> None:
        self.sock.close()
