"""seqserve's own gRPC server (``--grpc-server builtin``): gRPC over ``http2`` on the event loop,
serving the same servicers as grpc.aio (``grpc.InferenceServicer``, ``grpc.HealthServicer``).

Why a server of our own: grpc.aio runs HTTP/2 on grpc core's threads and hands every call to
the loop and its reply back, with Python objects and a completion-queue round trip per call; a
unary call cost more there than all of Triton's server (bench/README.md, "gRPC: the builtin
server"). Here a call costs one ``data_received`` on the loop's own thread, a task for the
handler and one ``write`` for its reply.

The handlers see a ``_Call`` as their context: ``invocation_metadata()``, ``abort()`` (raises
``grpc.aio.AbortError``), ``read()`` (``grpc.aio.EOF`` at the end) and ``peer()``, which is what
seqserve's servicers use of grpc.aio's context. gRPC over HTTP/2 as clients expect it: messages
up to ``max_receive_message_bytes`` (RESOURCE_EXHAUSTED beyond, before the rest is read),
``grpc-timeout`` deadlines (DEADLINE_EXCEEDED), gzip and deflate request compression (decoded
within the message limit), cancellation by RST_STREAM, binary (``-bin``) metadata, trailers-only
error replies with a percent-encoded ``grpc-message``, and grpc.aio's connection limits (idle
GOAWAY, keepalive pings, concurrent streams).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import logging
import ssl
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory

from seqserve.api import grpc_codec, http2
from seqserve.api.http2 import Http2Connection, Stream, literal
from seqserve.api.limits import GrpcLimits, offload

log = logging.getLogger("seqserve.grpc")

#: metadata (decoded header list, as HTTP/2 counts it) per call: grpc core's default hard limit
MAX_HEADER_LIST_BYTES = 16 << 10
#: a connection must send its preface and SETTINGS within this
PREFACE_TIMEOUT_S = 10.0
#: a connection whose client reads nothing of what it is sent for this long is closed
WRITE_STALL_S = 120.0
#: a compressed message is inflated on the event loop up to this much output, then off it
_INLINE_INFLATE_BYTES = 256 << 10
#: messages of a stream parsed ahead of its handler's reads (the rest waits unparsed)
_READ_AHEAD = 64
#: a unary call whose request stops arriving for this long, or a reply the client's window
#: holds back this long, ends (DEADLINE_EXCEEDED / RST_STREAM CANCEL)
STALL_S = 10.0

#: a status message's encoded length (grpc core's clients drop metadata over 8 KiB)
_MAX_MESSAGE_BYTES = 6 << 10
_EOF = grpc.aio.EOF
_OK = grpc.StatusCode.OK.value[0]
_REPLY_HEADERS = http2.STATUS_200 + literal(b"content-type", b"application/grpc")
_OK_TRAILERS = literal(b"grpc-status", b"0")
#: request headers that are not the call's metadata
_NOT_METADATA = frozenset(
    (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"content-length")
)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_ENCODINGS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS, b"identity": 0}


@dataclass(frozen=True, slots=True)
class Method:
    """A registered rpc: its behaviour and (de)serializer (None: bytes in and out)."""

    behaviour: Callable[..., Any]
    streaming: bool  # bidirectional; otherwise unary
    deserialize: Callable[[bytes], Any] | None
    serialize: Callable[[Any], bytes] | None


class _Aborted(grpc.aio.AbortError):  # type: ignore[misc]
    """``context.abort``: the call ends with this status (grpc.aio raises AbortError too, which
    the servicers' wrappers let through)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def status_trailers(code: int, message: str, *, trailers_only: bool) -> bytes:
    """``grpc-status`` and a percent-encoded ``grpc-message`` (gRPC's HTTP/2 protocol: printable
    ASCII but ``%`` as is, every other byte of its UTF-8 as %XX)."""
    block = literal(b"grpc-status", str(code).encode())
    if message:
        raw = message.encode("utf-8", "replace")
        encoded = bytearray()
        for b in raw:
            if len(encoded) > _MAX_MESSAGE_BYTES:  # grpc core's clients drop metadata over 8 KiB
                encoded += b"..."
                break
            if 0x20 <= b <= 0x7E and b != 0x25:
                encoded.append(b)
            else:
                encoded += b"%%%02X" % b
        block += literal(b"grpc-message", bytes(encoded))
    return (_REPLY_HEADERS + block) if trailers_only else block


def _parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout``: at most 8 digits and a unit; None when malformed (no deadline)."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1:])
    return None if unit is None else int(value[:-1]) * unit


def _metadata_value(name: str, value: bytes) -> str | bytes:
    if name.endswith("-bin"):
        try:
            return base64.b64decode(value + b"=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            return value
    return value.decode("latin-1")


class _Call(Stream):
    """One rpc: the HTTP/2 stream and the context its handler sees."""

    __slots__ = (
        "compressed",
        "deadline",
        "encoding",
        "headers_sent",
        "held",
        "messages",
        "metadata",
        "method",
        "pending",
        "reader",
        "request",
        "task",
    )

    def __init__(self, conn: _GrpcConnection, stream_id: int, method: Method, metadata: tuple[Any, ...]) -> None:
        super().__init__(conn, stream_id)
        self.method = method
        self.metadata = metadata
        self.encoding = 0  # zlib wbits of grpc-encoding, 0: identity
        self.pending: bytearray | None = None  # bytes of a message not yet complete
        self.request: bytes | None = None  # a unary call's message
        self.compressed = False
        self.messages: collections.deque[tuple[bool, bytes]] | None = None  # a stream's, unread
        self.held = 0  # a stream's bytes received whose window is not given back yet
        self.reader: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.headers_sent = False

    # ------------------------------------------------------------------ the context

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(code, details)

    def peer(self) -> str:
        return self.conn.peer  # type: ignore[attr-defined,no-any-return]

    async def read(self) -> bytes | Any:
        """The next request message of a stream, ``grpc.aio.EOF`` once the client half-closed."""
        messages = self.messages
        assert messages is not None
        while not messages:
            if not self.remote_open:
                return _EOF
            self.reader = self.conn.loop.create_future()
            await self.reader
        compressed, message = messages.popleft()
        if not messages:
            if self.pending:
                self._parse()
            self._release()
        if compressed:
            message = await self._decompress(message)
        deserialize = self.method.deserialize
        return message if deserialize is None else deserialize(message)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while (message := await self.read()) is not _EOF:
            yield message

    # ------------------------------------------------------------------ from HTTP/2

    def on_data(self, data: bytes) -> None:
        conn: _GrpcConnection = self.conn  # type: ignore[assignment]
        if self.method.streaming:
            # The window comes back as the handler reads (``_release``), and at most _READ_AHEAD
            # messages are parsed ahead of it: a flood of tiny messages waits unparsed, and its
            # client on its window.
            self.held += len(data)
            if self.pending is None:
                self.pending = bytearray()
            self.pending += data
            self._parse()
            self._release()
            return
        self.consumed(len(data))  # a unary call's one message: bounded by the message limit
        if self.pending is None:
            if len(data) >= 5 and data[0] <= 1 and int.from_bytes(data[1:5], "big") == len(data) - 5:
                if len(data) - 5 > conn.max_receive:
                    self._too_large(len(data) - 5)
                else:
                    self._message(data[0] == 1, data[5:])  # one message in one frame: one copy, no buffer
                return
            self.pending = bytearray()
        self.pending += data
        self._parse()

    def _parse(self) -> None:
        """Take the complete messages out of ``pending`` (a stream's: up to _READ_AHEAD unread)."""
        conn: _GrpcConnection = self.conn  # type: ignore[assignment]
        pending = self.pending
        assert pending is not None
        messages = self.messages
        while len(pending) >= 5 and (messages is None or len(messages) < _READ_AHEAD):
            size = int.from_bytes(pending[1:5], "big")
            if size > conn.max_receive:
                self._too_large(size)
                return
            if len(pending) < 5 + size:
                return
            flag = pending[0]
            message = bytes(pending[5 : 5 + size])
            del pending[: 5 + size]
            if flag > 1:
                self.finish(grpc.StatusCode.INTERNAL, f"invalid message compression flag {flag}")
                return
            self._message(flag == 1, message)
            if not self.local_open:
                return

    def _release(self) -> None:
        """A stream's window back once its handler has read every parsed message: what is held
        then is read, or an incomplete message, which must arrive whole anyway."""
        if not self.messages and self.held:
            held, self.held = self.held, 0
            self.consumed(held)

    def _too_large(self, size: int) -> None:
        conn: _GrpcConnection = self.conn  # type: ignore[assignment]
        self.finish(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {conn.max_receive})"
        )

    def _message(self, compressed: bool, message: bytes) -> None:
        if compressed and not self.encoding:
            self.finish(grpc.StatusCode.INTERNAL, "a compressed message without a grpc-encoding")
            return
        if self.method.streaming:
            messages = self.messages
            assert messages is not None
            messages.append((compressed, message))
            reader = self.reader
            if reader is not None and not reader.done():
                reader.set_result(None)
            return
        if self.request is not None:
            self.finish(grpc.StatusCode.UNIMPLEMENTED, "more than one request message for a unary rpc")
            return
        self.request = message
        self.compressed = compressed

    def on_end(self) -> None:
        if self.method.streaming:
            reader = self.reader
            if reader is not None and not reader.done():
                reader.set_result(None)
            return
        if self.task is not None or not self.local_open:
            return
        if self.request is None:
            self.finish(grpc.StatusCode.UNIMPLEMENTED, "the request message is missing")
            return
        self.task = self.conn.loop.create_task(self._unary())

    def on_reset(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        reader = self.reader
        if reader is not None and not reader.done():
            reader.set_result(None)

    # ------------------------------------------------------------------ running it

    def start_stream(self) -> None:
        self.messages = collections.deque()
        self.task = self.conn.loop.create_task(self._stream())

    async def _unary(self) -> None:
        method = self.method
        try:
            request: Any = self.request
            if self.compressed:
                request = await self._decompress(request)
            if method.deserialize is not None:
                request = method.deserialize(request)
            reply = await method.behaviour(request, self)
            self._send_message(reply, last=True)
        except (Exception, asyncio.CancelledError) as e:
            self._end_by(e)
        finally:
            if self.deadline is not None:
                self.deadline.cancel()

    async def _stream(self) -> None:
        method = self.method
        replies = method.behaviour(self, self)
        try:
            async for reply in replies:
                if not self._send_message(reply, last=False):
                    await self._drained()
                if not self.local_open:
                    break
            self.finish(grpc.StatusCode.OK, "")
        except (Exception, asyncio.CancelledError) as e:
            self._end_by(e)
        finally:
            if self.deadline is not None:
                self.deadline.cancel()
            with contextlib.suppress(BaseException):  # the handler's own cleanup, now, not at GC
                await replies.aclose()

    def _end_by(self, e: BaseException) -> None:
        """End the call for what its handler raised (inside its ``except``)."""
        if isinstance(e, _Aborted):
            self.finish(e.code, e.details)
        elif isinstance(e, asyncio.CancelledError):
            # reset by the client, past its deadline, the server closing (the call has ended:
            # finish does nothing), or cancelled from elsewhere: the client must hear of it
            self.finish(grpc.StatusCode.CANCELLED, "the call was cancelled")
        else:
            log.exception("gRPC %s failed", self.method.behaviour)
            self.finish(grpc.StatusCode.UNKNOWN, f"Unexpected error in RPC handler: {type(e).__name__}")

    def _send_message(self, reply: Any, *, last: bool) -> bool:
        """Send one reply message; ``last``: with the OK trailers. Returns whether it went out
        whole (False: it waits for window, or the transport is full)."""
        conn: _GrpcConnection = self.conn  # type: ignore[assignment]
        data = reply if self.method.serialize is None else self.method.serialize(reply)
        if len(data) > conn.max_send:
            self.finish(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(data)} vs. {conn.max_send})"
            )
            return True
        framed = b"\x00" + len(data).to_bytes(4, "big") + data
        if last:
            conn.send_reply(self, _REPLY_HEADERS, framed, _OK_TRAILERS)
            return True
        if not self.headers_sent:
            self.headers_sent = True
            conn.send_headers(self, _REPLY_HEADERS)
        return conn.send_data(self, framed) and not conn.write_paused

    async def _drained(self) -> None:
        conn = self.conn
        while (self.outbox is not None or conn.write_paused) and self.local_open:
            self.drained = conn.loop.create_future()
            await self.drained

    async def _decompress(self, message: bytes) -> bytes:
        """Inflate within the message limit: on the loop for the first _INLINE_INFLATE_BYTES of
        output, the rest off it (zlib releases the GIL), whatever the compressed size."""
        conn: _GrpcConnection = self.conn  # type: ignore[assignment]
        limit = conn.max_receive
        d = zlib.decompressobj(self.encoding)
        head = _inflate_some(d, message, min(limit, _INLINE_INFLATE_BYTES) + 1)
        if d.eof or len(head) > limit:
            return _inflated(d, head, limit)
        rest = await offload(_inflate_some, d, d.unconsumed_tail, limit + 1 - len(head), background=True)
        return _inflated(d, head + rest, limit)

    def finish(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with a status (trailers, or a trailers-only reply)."""
        if not self.local_open:
            return
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        task = self.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        number = code.value[0]
        block = status_trailers(number, details if number != _OK else "", trailers_only=not self.headers_sent)
        self.conn.send_headers(self, block, end_stream=True)

    def expire(self) -> None:
        self.deadline = None
        self.finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _inflate_some(d: Any, data: bytes, max_length: int) -> bytes:
    try:
        return d.decompress(data, max_length)  # type: ignore[no-any-return]
    except zlib.error as e:
        raise _Aborted(grpc.StatusCode.INTERNAL, f"the message did not decompress: {e}") from None


def _inflated(d: Any, out: bytes, limit: int) -> bytes:
    if len(out) > limit:
        raise _Aborted(
            grpc.StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max (over {limit} decompressed)"
        )
    if not d.eof:
        raise _Aborted(grpc.StatusCode.INTERNAL, "the message did not decompress: it is truncated")
    return out


class _GrpcConnection(Http2Connection):
    def __init__(self, server: BuiltinGrpcServer) -> None:
        limits = server.limits
        super().__init__(
            max_concurrent_streams=limits.max_concurrent_streams, max_header_list_bytes=MAX_HEADER_LIST_BYTES
        )
        self.server = server
        self.methods = server.methods
        self.max_receive = limits.max_receive_message_bytes
        self.max_send = limits.max_send_message_bytes
        self.peer = ""
        self.opened = self.loop.time()
        self.idle_since: float | None = self.opened
        self.ping_sent: float | None = None
        self.write_paused_since: float | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple) and len(address) >= 2:
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
        server = self.server
        if len(server.connections) >= server.limits.max_connections or server.stopping:
            self.close(http2.ENHANCE_YOUR_CALM if not server.stopping else http2.NO_ERROR, "too many connections")
            return
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        super().pause_writing()
        self.write_paused_since = self.loop.time()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        super().resume_writing()

    def idle_changed(self) -> None:
        self.idle_since = self.loop.time()

    def end_stalled(self, now: float) -> None:
        """End the unary calls whose request stopped arriving STALL_S ago (DEADLINE_EXCEEDED),
        and the calls whose reply the client's window has held back as long (RST_STREAM)."""
        stalled = now - STALL_S
        for s in list(self.streams.values()):
            call: _Call = s  # type: ignore[assignment]
            if call.progress > stalled:
                continue
            if call.outbox is not None:
                self.reset(call, http2.CANCEL)
            elif call.remote_open and not call.method.streaming:
                call.finish(grpc.StatusCode.DEADLINE_EXCEEDED, f"the request did not arrive within {STALL_S:g} s")

    def expired(self, now: float, keepalive_timeout_s: float) -> bool:
        """No preface in time, a client that reads nothing, or a keepalive ping unanswered."""
        paused, ping = self.write_paused_since, self.ping_sent
        return (
            (not self.settings_seen and now - self.opened > PREFACE_TIMEOUT_S)
            or (paused is not None and now - paused > WRITE_STALL_S)
            or (ping is not None and now - ping > keepalive_timeout_s)
        )

    def on_ping_ack(self, payload: bytes) -> None:
        self.ping_sent = None

    def open_stream(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> Stream | None:
        path = b""
        http_method = b""
        content_type = b""
        timeout = encoding = None
        metadata: list[tuple[str, str | bytes]] = []
        size = 0
        for name, value in headers:
            size += len(name) + len(value) + 32
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    http_method = value
            elif name in _NOT_METADATA:
                if name == b"content-type":
                    content_type = value
                elif name == b"grpc-timeout":
                    timeout = value
                elif name == b"grpc-encoding":
                    encoding = value
            else:
                key = name.decode("latin-1")
                metadata.append((key, _metadata_value(key, value)))
        if http_method != b"POST" or not content_type.startswith(b"application/grpc"):
            block = literal(b":status", b"405" if http_method != b"POST" else b"415")
            self.write(http2.frame_header(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, stream_id, len(block)))
            self.write(block)
            if not end_stream:
                self.write(http2.frame(http2.RST_STREAM, 0, stream_id, b"\x00\x00\x00\x00"))
            return None
        method = self.methods.get(path)
        call = _Call(self, stream_id, method or _UNKNOWN, tuple(metadata))
        call.remote_open = not end_stream  # a refusal then needs no RST_STREAM
        self.idle_since = None
        if method is None:
            method_name = path[:200].decode("latin-1")
            self._refuse(call, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {method_name}")
            return None
        if size > MAX_HEADER_LIST_BYTES:
            self._refuse(
                call, grpc.StatusCode.RESOURCE_EXHAUSTED, f"metadata of {size} bytes over {MAX_HEADER_LIST_BYTES}"
            )
            return None
        if encoding is not None and encoding != b"identity":
            wbits = _ENCODINGS.get(encoding)
            if wbits is None:
                self._refuse(
                    call,
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"Compression algorithm '{encoding[:40].decode('latin-1')}' is not supported",
                )
                return None
            call.encoding = wbits
        if timeout is not None:
            seconds = _parse_timeout(timeout)
            if seconds is not None:
                call.deadline = self.loop.call_later(seconds, call.expire)
        if method.streaming:
            self.streams[stream_id] = call  # before the task runs: it may send at once
            call.start_stream()
        return call

    def _refuse(self, call: _Call, code: grpc.StatusCode, message: str) -> None:
        self.streams[call.id] = call
        call.finish(code, message)


_UNKNOWN = Method(behaviour=lambda *_: None, streaming=False, deserialize=None, serialize=None)


class BuiltinGrpcServer:
    """Serves ``methods`` (path → Method) on a listening socket; ``stop`` as grpc.aio's."""

    def __init__(
        self, methods: dict[bytes, Method], limits: GrpcLimits, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.methods = methods
        self.limits = limits
        self.ssl_context = ssl_context
        self.connections: set[_GrpcConnection] = set()
        self.stopping = False
        self._listener: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._ping = 0

    async def start(self, sock: Any) -> None:
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: _GrpcConnection(self),
            sock=sock,
            ssl=self.ssl_context,
            backlog=1024,
            ssl_handshake_timeout=PREFACE_TIMEOUT_S if self.ssl_context is not None else None,
        )
        self._sweeper = loop.call_later(1.0, self._sweep)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; GOAWAY to every connection; the calls in flight get ``grace`` seconds
        (None: none) to finish, then are cancelled and the connections closed."""
        self.stopping = True
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            if conn.streams:
                conn.send_goaway()
            else:
                conn.close()
        if grace:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            while any(c.streams for c in self.connections) and loop.time() < deadline:
                await asyncio.sleep(0.02)
        for conn in list(self.connections):
            for s in list(conn.streams.values()):
                conn.reset(s, http2.CANCEL)
            conn.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.0
        while self.connections and loop.time() < deadline:  # what is left to write goes out
            await asyncio.sleep(0.02)
        for conn in list(self.connections):  # a client that reads nothing
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._listener is not None:
            await self._listener.wait_closed()
        # let the cancelled handlers unwind
        await asyncio.sleep(0)

    def _sweep(self) -> None:
        """Once a second: connections that never sent their preface, idle ones (a GOAWAY, as
        grpc's max_connection_idle), keepalive pings and their timeout, and clients that read
        nothing of what they are sent."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        limits = self.limits
        for conn in list(self.connections):
            if conn.closed:
                continue
            if conn.expired(now, limits.keepalive_timeout_s):
                conn.abort()
                continue
            conn.end_stalled(now)
            if (
                limits.max_connection_idle_s > 0
                and conn.idle_since is not None
                and not conn.streams
                and now - conn.idle_since > limits.max_connection_idle_s
            ):
                conn.close(http2.NO_ERROR, "max_idle")
            elif conn.ping_sent is None and now - conn.last_active > limits.keepalive_s:
                self._ping += 1
                conn.ping_sent = now
                conn.write(http2.frame(http2.PING, 0, 0, self._ping.to_bytes(8, "big")))
        self._sweeper = loop.call_later(1.0, self._sweep)


def methods_of(servicer: Any, service: Any, methods: dict[bytes, Method], raw: Iterable[str]) -> None:
    """Add ``servicer``'s rpcs of ``service`` (a ServiceDescriptor) to ``methods``; ``raw``: the
    rpcs that take and return bytes."""
    raw = set(raw)
    for m in service.methods:
        if m.name in raw:
            deserialize = serialize = None
        else:
            deserialize = grpc_codec.safe_deserializer(message_factory.GetMessageClass(m.input_type))
            serialize = message_factory.GetMessageClass(m.output_type).SerializeToString
        if m.client_streaming != m.server_streaming:
            raise TypeError(f"{service.full_name}/{m.name}: only unary and bidirectional rpcs are served")
        path = f"/{service.full_name}/{m.name}".encode()
        methods[path] = Method(getattr(servicer, m.name), m.client_streaming, deserialize, serialize)
