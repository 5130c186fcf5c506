"""gRPC calls on an HTTP/2 connection: ``GrpcConnection`` handles the ``H2Connection``'s events
(a request's headers become a ``GrpcCall``, its DATA the call's messages) and gives the core
its commands; ``GrpcCall`` is one rpc's stream: its messages in (``MessageFramer``) and out,
its deadline and status. The handler runs in a task of ``grpc_runner``, which gives it the
call's ``BuiltinContext``.

gRPC over HTTP/2 as clients expect it: messages up to ``max_receive_message_bytes``
(RESOURCE_EXHAUSTED beyond, before the rest is read), ``grpc-timeout`` deadlines
(DEADLINE_EXCEEDED), gzip and deflate request compression (decoded within the message limit),
cancellation by RST_STREAM, binary (``-bin``) metadata, trailers-only error replies with a
percent-encoded ``grpc-message``.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from seqserve.api.limits import peer_host
from seqserve.api.transport import grpc_runner
from seqserve.api.transport.grpc_context import CallAborted, Metadata, Method, Status
from seqserve.api.transport.grpc_messages import (
    ENCODINGS,
    NOT_METADATA,
    OK_TRAILERS,
    REPLY_HEADERS,
    MessageFramer,
    inflate_message,
    metadata_value,
    parse_timeout,
    status_trailers,
    too_large,
)
from seqserve.api.transport.h2_events import (
    DataReceived,
    Event,
    PingAcknowledged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    StreamWritable,
)
from seqserve.api.transport.h2_frames import CANCEL, ENHANCE_YOUR_CALM, NO_ERROR
from seqserve.api.transport.h2_hpack import literal
from seqserve.api.transport.h2_outbound import StreamState
from seqserve.api.transport.h2_protocol import H2Protocol

if TYPE_CHECKING:
    from seqserve.api.transport.grpc_server import BuiltinGrpcServer

#: the request header list (metadata included, as HTTP/2 counts it: name, value and 32 per
#: field) a call may have: grpc core's default, advertised as SETTINGS_MAX_HEADER_LIST_SIZE;
#: a call over it is RESOURCE_EXHAUSTED, its connection goes on
MAX_HEADER_LIST_BYTES = 16 << 10
#: a connection must send its preface and SETTINGS within this
PREFACE_TIMEOUT_S = 10.0
#: a connection whose client reads nothing of what it is sent for this long is closed
WRITE_STALL_S = 120.0
#: messages of a stream parsed ahead of its handler's reads (the rest waits unparsed)
READ_AHEAD = 64
#: a unary call whose request stops arriving for this long, or a reply the client's window
#: holds back this long, ends (DEADLINE_EXCEEDED / RST_STREAM CANCEL)
STALL_S = 10.0

_UNKNOWN = Method(behaviour=lambda *_: None, streaming=False, deserialize=None, serialize=None)


class GrpcConnection:
    """The calls of one connection (the ``EventHandler`` of its ``H2Protocol``)."""

    def __init__(self, server: BuiltinGrpcServer, protocol: H2Protocol) -> None:
        limits = server.limits
        self.server = server
        self.protocol = protocol
        self.h2 = protocol.h2
        self.loop = protocol.loop
        self.methods = server.methods
        self.max_receive = limits.max_receive_message_bytes
        self.max_send = limits.max_send_message_bytes
        self.peer = ""
        self.peer_host: str | None = None  # admitted from this address (the server's connection caps)
        self.ping_sent: float | None = None
        self.opened_at = self.loop.time()
        self.aged_at: float | None = None  # when --grpc-max-connection-age sent its GOAWAY

    # ------------------------------------------------------------------ events

    def handle(self, events: Iterable[Event]) -> None:
        for event in events:
            if type(event) is DataReceived:
                event.stream.owner.on_data(event.stream, event.data)
            elif type(event) is StreamEnded:
                event.stream.owner.on_end(event.stream)
            elif type(event) is RequestReceived:
                self._request(event)
            elif type(event) is StreamReset:
                event.stream.owner.on_reset()
            elif type(event) is StreamWritable:
                event.stream.owner.wake()
            elif type(event) is PingAcknowledged:
                self.ping_sent = None

    def settle(self) -> None:
        """Handle what the last command caused (a stream reset, an outbox drained)."""
        events = self.h2.take_events()
        if events:
            self.handle(events)

    def connection_made(self, transport: Any) -> None:
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple) and len(address) >= 2:
            host, port = address[0], address[1]
            self.peer = f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
        server = self.server
        host = peer_host(address)
        refused = server.admission.admit(host, stopping=server.stopping)
        if refused is not None:
            self.protocol.close(ENHANCE_YOUR_CALM if refused != "stopping" else NO_ERROR, "too many connections")
            return
        self.peer_host = host
        server.connections.add(self)

    def connection_lost(self) -> None:
        if self in self.server.connections:
            self.server.connections.discard(self)
            self.server.admission.release(self.peer_host)

    def writable(self) -> None:
        for s in list(self.h2.streams.values()):
            if s.outbox is None:
                s.owner.wake()

    # ------------------------------------------------------------------ requests

    def _request(self, event: RequestReceived) -> None:
        """A request's headers: its call starts, or it is answered at once."""
        stream_id, end_stream = event.stream_id, event.end_stream
        path = b""
        http_method = b""
        content_type = b""
        timeout = encoding = None
        metadata: list[tuple[str, str | bytes]] = []
        size = event.header_list_size
        for name, value in event.headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    http_method = value
            elif name in NOT_METADATA:
                if name == b"content-type":
                    content_type = value
                elif name == b"grpc-timeout":
                    timeout = value
                elif name == b"grpc-encoding":
                    encoding = value
            else:
                key = name.decode("latin-1")
                metadata.append((key, metadata_value(key, value)))
        if http_method != b"POST" or not content_type.startswith(b"application/grpc"):
            block = literal(b":status", b"405" if http_method != b"POST" else b"415")
            self.h2.reject(stream_id, block, end_stream)
            return
        method = self.methods.get(path)
        call = GrpcCall(self, self.h2.accept(stream_id, end_stream), method or _UNKNOWN, tuple(metadata))
        if size > MAX_HEADER_LIST_BYTES:  # the limit advertised (SETTINGS_MAX_HEADER_LIST_SIZE): this call only
            call.refuse(
                Status.RESOURCE_EXHAUSTED,
                f"Header list of {size} bytes over the advertised limit of {MAX_HEADER_LIST_BYTES}",
            )
            return
        if method is None:
            call.refuse(Status.UNIMPLEMENTED, f"Method not found: {path[:200].decode('latin-1')}")
            return
        if encoding is not None and encoding != b"identity":
            wbits = ENCODINGS.get(encoding)
            if wbits is None:
                call.refuse(
                    Status.UNIMPLEMENTED,
                    f"Compression algorithm '{encoding[:40].decode('latin-1')}' is not supported",
                )
                return
            call.encoding = wbits
        if timeout is not None:
            seconds = parse_timeout(timeout)
            if seconds is not None:
                call.deadline = self.loop.call_later(seconds, call.expire)
        if method.streaming:
            call.start_stream()

    # ------------------------------------------------------------------ the sweeper's

    def end_stalled(self, now: float) -> None:
        """End the unary calls whose request stopped arriving STALL_S ago (DEADLINE_EXCEEDED),
        and the calls whose reply the client's window has held back as long (RST_STREAM)."""
        stalled = now - STALL_S
        for s in list(self.h2.streams.values()):
            if s.progress > stalled:
                continue
            call = s.owner
            if s.outbox is not None:
                self.reset(s, CANCEL)
            elif s.remote_open and isinstance(call, GrpcCall) and not call.method.streaming:
                call.finish(Status.DEADLINE_EXCEEDED, f"the request did not arrive within {STALL_S:g} s")

    def expired(self, now: float, keepalive_timeout_s: float) -> bool:
        """No preface in time, a client that reads nothing, or a keepalive ping unanswered."""
        paused, ping = self.protocol.write_paused_since, self.ping_sent
        return (
            (not self.h2.settings_seen and now - self.protocol.opened > PREFACE_TIMEOUT_S)
            or (paused is not None and now - paused > WRITE_STALL_S)
            or (ping is not None and now - ping > keepalive_timeout_s)
        )

    def reset(self, s: StreamState, code: int) -> None:
        self.h2.reset(s, code)
        self.settle()


class GrpcCall:
    """One rpc on its HTTP/2 stream: the request messages in, the replies and status out."""

    __slots__ = (
        "compressed",
        "conn",
        "deadline",
        "drained",
        "encoding",
        "framer",
        "headers_sent",
        "held",
        "messages",
        "metadata",
        "method",
        "reader",
        "request",
        "state",
        "task",
    )

    def __init__(self, conn: GrpcConnection, state: StreamState, method: Method, metadata: Metadata) -> None:
        self.conn = conn
        self.state = state
        state.owner = self  # until the call's task ends (``release``)
        self.method = method
        self.metadata = metadata
        self.encoding = 0  # zlib wbits of grpc-encoding, 0: identity
        self.framer: MessageFramer | None = None  # bytes of a message not yet complete
        self.request: bytes | None = None  # a unary call's message
        self.compressed = False
        self.messages: collections.deque[tuple[bool, bytes]] | None = None  # a stream's, unread
        self.held = 0  # a stream's bytes received whose window is not given back yet
        self.reader: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.headers_sent = False

    def release(self) -> None:
        """The call's task has ended: what its stream still gets (a window that opens for its
        queued trailers, a late reset) concerns nobody, and the stream no longer keeps the call
        (nor the call, through the stream, itself) alive."""
        self.state.owner = ENDED

    # ------------------------------------------------------------------ from HTTP/2

    def on_data(self, state: StreamState, data: bytes) -> None:
        conn = self.conn
        if self.method.streaming:
            # The window comes back as the handler reads (``_release``), and at most READ_AHEAD
            # messages are parsed ahead of it: a flood of tiny messages waits unparsed, and its
            # client on its window.
            self.held += len(data)
            if self.framer is None:
                self.framer = MessageFramer(conn.max_receive)
            self.framer.feed(data)
            self._parse()
            self._release()
            return
        conn.h2.consumed(state, len(data))  # a unary call's one message: bounded by the message limit
        if self.framer is None:
            size = len(data) - 5
            if size >= 0 and data[0] <= 1 and int.from_bytes(data[1:5], "big") == size:
                if size > conn.max_receive:
                    error = too_large(size, conn.max_receive)
                    self.finish(error.status, error.details)
                else:
                    self._message(data[0] == 1, data[5:])  # one message in one frame: one copy, no buffer
                return
            self.framer = MessageFramer(conn.max_receive)
        self.framer.feed(data)
        self._parse()

    def _parse(self) -> None:
        """Take the complete messages out of the framer (a stream's: up to READ_AHEAD unread)."""
        framer = self.framer
        assert framer is not None
        messages = self.messages
        try:
            while messages is None or len(messages) < READ_AHEAD:
                message = framer.next()
                if message is None:
                    return
                self._message(*message)
                if not self.state.local_open:
                    return
        except CallAborted as e:
            self.finish(e.status, e.details)

    def _release(self) -> None:
        """A stream's window back once its handler has read every parsed message: what is held
        then is read, or an incomplete message, which must arrive whole anyway."""
        if not self.messages and self.held:
            held, self.held = self.held, 0
            self.conn.h2.consumed(self.state, held)

    def _message(self, compressed: bool, message: bytes) -> None:
        if compressed and not self.encoding:
            self.finish(Status.INTERNAL, "a compressed message without a grpc-encoding")
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
            self.finish(Status.UNIMPLEMENTED, "more than one request message for a unary rpc")
            return
        self.request = message
        self.compressed = compressed

    def on_end(self, state: StreamState) -> None:
        if self.method.streaming:
            reader = self.reader
            if reader is not None and not reader.done():
                reader.set_result(None)
            return
        if self.task is not None or not state.local_open:
            return
        if self.request is None:
            self.finish(Status.UNIMPLEMENTED, "the request message is missing")
            return
        self.task = self.conn.loop.create_task(grpc_runner.run_unary(self))

    def on_reset(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        reader = self.reader
        if reader is not None and not reader.done():
            reader.set_result(None)
        if task is None:  # no handler runs (a task releases the call when it ends)
            self.release()

    def wake(self) -> None:
        waiter = self.drained
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------ the handler's side

    def start_stream(self) -> None:
        self.messages = collections.deque()
        self.task = self.conn.loop.create_task(grpc_runner.run_stream(self))

    async def read(self) -> Any:
        """The next request message of a stream, None once the client half-closed."""
        messages = self.messages
        assert messages is not None
        while not messages:
            if not self.state.remote_open:
                return None
            self.reader = self.conn.loop.create_future()
            await self.reader
        compressed, message = messages.popleft()
        if not messages:
            if self.framer is not None and self.framer.pending:
                self._parse()
            self._release()
        if compressed:
            message = await inflate_message(message, self.encoding, self.conn.max_receive)
        deserialize = self.method.deserialize
        return message if deserialize is None else deserialize(message)

    def send_message(self, reply: Any, *, last: bool) -> bool:
        """Send one reply message; ``last``: with the OK trailers. Returns whether it went out
        whole (False: it waits for window, or the transport is full)."""
        conn = self.conn
        data = reply if self.method.serialize is None else self.method.serialize(reply)
        if len(data) > conn.max_send:
            self.finish(Status.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(data)} vs. {conn.max_send})")
            return True
        framed = b"\x00" + len(data).to_bytes(4, "big") + data
        h2 = conn.h2
        state = self.state
        if last:
            h2.send_reply(state, REPLY_HEADERS, framed, OK_TRAILERS)
            events = h2.take_events()
            if events:  # the client had not finished sending: its stream was reset
                conn.handle(events)
            return True
        if not self.headers_sent:
            self.headers_sent = True
            h2.send_headers(state, REPLY_HEADERS)
        sent = h2.send_data(state, framed)
        conn.settle()
        return sent and not conn.protocol.write_paused

    async def until_drained(self) -> None:
        """Until the stream's outbox is sent and the transport takes writes (or the call ended)."""
        conn = self.conn
        state = self.state
        while (state.outbox is not None or conn.protocol.write_paused) and state.local_open:
            self.drained = conn.loop.create_future()
            await self.drained

    def finish(self, status: Status, details: str) -> None:
        """End the call with a status (trailers, or a trailers-only reply)."""
        state = self.state
        if not state.local_open:
            return
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        task = self.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        block = status_trailers(
            int(status), details if status != Status.OK else "", trailers_only=not self.headers_sent
        )
        self.conn.h2.send_headers(state, block, end_stream=True)
        self.conn.settle()

    def refuse(self, status: Status, details: str) -> None:
        """End the call before its handler runs (it never will)."""
        self.finish(status, details)
        self.release()

    def expire(self) -> None:
        self.deadline = None
        self.finish(Status.DEADLINE_EXCEEDED, "Deadline Exceeded")


class EndedCall:
    """The owner of a stream whose call has ended: the events that still come are dropped."""

    __slots__ = ()

    def on_data(self, state: StreamState, data: bytes) -> None:
        pass

    def on_end(self, state: StreamState) -> None:
        pass

    def on_reset(self) -> None:
        pass

    def wake(self) -> None:
        pass


ENDED = EndedCall()
