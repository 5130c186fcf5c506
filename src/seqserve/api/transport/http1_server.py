"""seqserve's own HTTP/1.1 server (``--http-server builtin``): the asyncio side of the
connection state machine in ``http1`` (transport, timers, flow control, tasks), calling a
``Handler`` (api/transport/exchange.py) for each request.

Why a server of our own: granian's embedded server runs its HTTP stack on Rust threads and
hands every request to the loop and every reply back (two thread hops and the GIL each way),
and hypercorn parses HTTP in Python. Here a request costs one ``data_received`` on the loop's
own thread, a task for the handler, and one ``write`` for the reply; bench/docs/front-ends.md
("HTTP: the builtin server") has the measurements.

Its limits beyond those of the connection (``http1``'s docstring):

- one timer (``idle_s``) for a connection's wait for the next request and for its headers
  (slow-header clients), checked by one sweep for all connections rather than a timer each;
  the body's deadline is the handler's (``api.http.body.BodyWatch``);
- ``max_connections`` in total and ``max_connections_per_peer`` from one address
  (``ConnectionAdmission``): a connection beyond gets 503 with a JSON error and is closed;
- a reply waits while the transport's write buffer is full; a client that reads nothing for
  ``body_timeout_s`` is cut off;
- TLS (and client certificates) through the loop's own TLS transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import Any

from seqserve.api.limits import ConnectionAdmission, HttpLimits, peer_host
from seqserve.api.transport.exchange import Handler, HttpReply, HttpRequest
from seqserve.api.transport.http1 import (
    DEFAULT_MAX_HEAD_BYTES,
    JSON_HEADERS,
    BodyChanged,
    CloseAction,
    Event,
    Exchange,
    Http1Connection,
    error_body,
    error_reply,
)
from seqserve.api.transport.listener import accept_queued
from seqserve.api.transport.read_gate import ReadGate

log = logging.getLogger("seqserve.http")

#: after a reply that leaves request bytes unread (a refusal, a body not read), the connection
#: reads and drops what still arrives, for up to this long, before it closes: a close with unread
#: data resets the connection, and the client could lose the reply it has not read yet
LINGER_S = 2.0
#: at stop, how long the listener and the idle connections are still read, so that a request
#: already on its way (in flight, or in the socket's buffer while the loop was busy) gets 503 with
#: ``Connection: close`` instead of a reset
LAST_CALL_S = 0.25
#: at stop, how long a request whose handler runs may take to be answered before its connection
#: is cut (the engine has drained by then: such a request is answered 503 at once)
REPLY_GRACE_S = 5.0
#: at stop, once new handshakes are dropped, the longest the loop gets to accept those queued
QUEUE_DRAIN_S = 1.0


class Http1Server:
    """Serves ``handler`` on a listening socket until ``stop()``; ``serve()`` returns once every
    connection has closed (in-flight requests get ``grace_s`` to finish)."""

    def __init__(
        self,
        handler: Handler,
        limits: HttpLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
        grace_s: float = 1.0,
        admission: ConnectionAdmission | None = None,
        read_gate: ReadGate | None = None,
    ) -> None:
        """``admission``: the connection caps (one of ``limits``' caps when None), given to
        share its counts with the metrics; ``read_gate``: a worker process's (see read_gate.py)."""
        self.handler = handler
        self.limits = limits
        self.idle_s = limits.idle_s
        self.keep_alive = limits.keepalive_s > 0
        self.ssl_context = ssl_context
        self.max_head_bytes = max_head_bytes
        self.grace_s = grace_s
        self.read_gate = read_gate
        self.connections: set[Connection] = set()
        # refused at accept and reading what the client still sends: a stop waits for them too,
        # since closing them with the request unread would reset the 503 the client has not read
        self.refused: set[Connection] = set()
        self.admission = admission or ConnectionAdmission(limits.max_connections, limits.max_connections_per_peer)
        self.stopping = False
        self._stop = asyncio.Event()
        self._listener: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, sock: Any) -> None:
        """Listen on ``sock`` (bound and listening)."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: Connection(self),
            sock=sock,
            ssl=self.ssl_context,
            backlog=1024,
            # a TLS handshake that does not finish holds a socket outside the connection cap
            ssl_handshake_timeout=self.idle_s if self.ssl_context is not None else None,
        )
        self._sweep_later()

    def stop(self) -> None:
        """Stop taking requests: every connection closes after its reply (see ``serve``)."""
        self.stopping = True
        for conn in self.connections:
            conn.core.stopping = True
        self._stop.set()

    async def serve(self) -> None:
        """Serve until ``stop``, then close without resetting a request the client has sent:
        for LAST_CALL_S the listener still accepts (a new connection gets 503 and is read until
        the client closes) and idle connections are still read (a request that arrives is
        answered with ``Connection: close``; the engine has drained, so an inference gets 503);
        then idle connections end their writing side and read and drop what still comes
        (``Connection.close_idle``), requests in progress get their replies (up to
        REPLY_GRACE_S), and what is left after ``grace_s`` is cut."""
        await self._stop.wait()
        # stop() marked every connection stopping: a request read from now on is answered (the
        # engine has drained: 503) with Connection: close
        await asyncio.sleep(LAST_CALL_S)
        if self._listener is not None:
            # Closing a listener resets the connections queued on it: new handshakes are dropped
            # first, and those queued are accepted (and answered 503) before it closes.
            await accept_queued(self._listener, QUEUE_DRAIN_S)
            self._listener.close()
        for conn in list(self.connections):
            conn.close_idle()
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline, reply_deadline = now + self.grace_s, now + REPLY_GRACE_S
        while self.connections or self.refused:
            now = loop.time()
            if now >= reply_deadline or (now >= deadline and not any(c.answering for c in self.connections)):
                break
            await asyncio.sleep(0.02)
        for conn in [*self.connections, *self.refused]:
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._listener is not None:
            await self._listener.wait_closed()

    def _sweep_later(self) -> None:
        tick = min(1.0, max(self.idle_s / 4, 0.05))
        self._sweeper = asyncio.get_running_loop().call_later(tick, self._sweep)

    def _sweep(self) -> None:
        """Close the connections that waited for a request (or its headers) past ``idle_s``, and
        those whose client has not read their reply for ``body_timeout_s`` (the write buffer
        full all that time)."""
        now = asyncio.get_running_loop().time()
        expired, stalled = now - self.idle_s, now - self.limits.body_timeout_s
        for conn in list(self.connections):
            idle, paused = conn.idle_since, conn.write_paused_since
            if paused is not None and paused < stalled:
                conn.abort()
            elif idle is not None and idle < expired and not conn.held:  # held: unread by us
                # not an abort: a request the client sent meanwhile would be reset
                conn.close_idle()
        self._sweep_later()


class RequestBody:
    """An exchange's body as the handler reads it (a ``BodySource``)."""

    __slots__ = ("conn", "exchange", "waiter")

    def __init__(self, conn: Connection, exchange: Exchange) -> None:
        self.conn = conn
        self.exchange = exchange
        self.waiter: asyncio.Future[None] | None = None  # receive() waiting for body or disconnect

    @property
    def held(self) -> bool:
        """Whether the server stopped reading the connection (a worker's read gate is closed)."""
        return self.conn.held

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    async def receive(self) -> tuple[bytes, bool] | None:
        conn = self.conn
        while True:
            got = conn.core.take_body(self.exchange)
            conn.flush()
            if got is False:
                return None
            if got is not True:
                return got
            self.waiter = conn.loop.create_future()
            await self.waiter

    async def wait_disconnect(self) -> None:
        ex = self.exchange
        while not (ex.disconnected or ex.finished or ex.broken):
            self.waiter = self.conn.loop.create_future()
            await self.waiter


class Connection(asyncio.Protocol):
    """One client connection: drives its ``Http1Connection`` with the transport's events."""

    __slots__ = (
        "core",
        "held",
        "idle_since",
        "lingering",
        "local",
        "loop",
        "peer",
        "reading",
        "scheme",
        "server",
        "transport",
        "writable",
        "write_paused_since",
    )

    def __init__(self, server: Http1Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.core = Http1Connection(keep_alive=server.keep_alive, max_head_bytes=server.max_head_bytes)
        self.transport: Any = None
        self.idle_since: float | None = self.loop.time()  # waiting for a request or its head since
        self.reading = True
        self.held = False  # by the server's read gate (a worker's ring is full)
        self.writable: asyncio.Future[None] | None = None  # while the write buffer is full
        self.write_paused_since: float | None = None
        self.local: tuple[str, int] | None = None
        self.scheme = "http"
        self.lingering: asyncio.TimerHandle | None = None
        self.peer: str | None = None  # the client's address, once admitted

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self.transport = transport
        srv = self.server
        peer = peer_host(transport.get_extra_info("peername"))
        refused = srv.admission.admit(peer, stopping=srv.stopping)
        if refused is not None:
            transport.write(error_reply(503, srv.admission.refusal_message(refused)))
            srv.refused.add(self)
            self.idle_since = None
            self.core.closing = True
            self._close(linger=True)  # the client may be sending its request
            return
        self.peer = peer
        srv.connections.add(self)
        self.local = _address(transport.get_extra_info("sockname"))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"
        if srv.read_gate is not None:
            srv.read_gate.register(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.refused.discard(self)
        if self in self.server.connections:
            self.server.connections.discard(self)
            self.server.admission.release(self.peer)
            if self.server.read_gate is not None:
                self.server.read_gate.unregister(self)
        if self.lingering is not None:
            self.lingering.cancel()
        self.idle_since = None
        for ex in self.core.connection_lost():
            _wake(ex)
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        self.writable = self.loop.create_future()
        self.write_paused_since = self.loop.time()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None
        self.write_paused_since = None

    def gate_closed(self) -> None:
        self.held = True
        self._read_as_decided()

    def gate_opened(self) -> None:
        self.held = False
        self._read_as_decided()

    def eof_received(self) -> bool:
        """The client ended its side: taken as gone (as most HTTP servers do), so the requests it
        left cancel (the disconnect watch of api/http/routes.py); a client cannot half-close and
        still read its reply."""
        return False

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            return  # dropped: the last reply is written
        self._handle(self.core.receive_data(data))

    # ------------------------------------------------------------------ driving the core

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            ex = event.exchange
            if isinstance(event, BodyChanged):
                _wake(ex)
            else:
                ex.user = RequestBody(self, ex)
                self.loop.create_task(self._run(ex))  # its first step comes after this read is parsed
        self.flush()

    def flush(self) -> None:
        """Apply what the core decided: write its output, pause or resume reading, note the
        connection idle, close."""
        core, t = self.core, self.transport
        if t is None:
            return
        out = core.data_to_send()
        if out and not t.is_closing():
            t.write(out)
        if core.idle:
            if self.idle_since is None:
                self.idle_since = self.loop.time()
        else:
            self.idle_since = None
        if core.close_action is not CloseAction.NONE:
            self._close(linger=core.close_action is CloseAction.LINGER)
            return
        if (core.reading and not self.held) != self.reading:
            self._read_as_decided()

    def _read_as_decided(self) -> None:
        """Read while the core wants to and the read gate lets it (a lingering close reads on:
        what it reads is dropped)."""
        t = self.transport
        if t is None or self.lingering is not None:
            return
        reading = self.core.reading and not self.held
        if reading != self.reading:
            self.reading = reading
            with contextlib.suppress(RuntimeError):  # a closing transport
                if reading:
                    t.resume_reading()
                else:
                    t.pause_reading()

    async def _run(self, ex: Exchange) -> None:
        core = self.core
        head = ex.head
        assert head is not None
        request = HttpRequest(
            head.method,
            head.path,
            head.query,
            head.headers,
            ex.user,
            scheme=self.scheme,
            server=self.local,
            peer=_host(self.transport.get_extra_info("peername")),
        )
        try:
            reply = await self.server.handler(request)
        except Exception as e:  # seqserve's handlers answer and log their own errors
            if not ex.started and not ex.disconnected:
                log.error("HTTP %s %s failed: %r", head.method, head.path[:100], e)
                core.reply(ex, 500, [], error_body("internal error"))
        except BaseException:  # cancelled (the loop is closing): no reply will come
            core.abandon()
            self.abort()
            raise
        else:
            if reply is not None and not ex.finished:
                if reply.stream is None:
                    core.reply(ex, reply.status, reply.headers, reply.body, close=reply.close)
                else:
                    await self._stream(ex, reply)
        _wake(ex)
        # The handler is done with its body: the exchange lets go of it, so the pair (each refers
        # to the other) is freed now rather than by the cyclic collector, whose passes, several
        # per thousand requests, would land in inline batches and push models off the loop.
        ex.user = None
        if not ex.finished and not ex.disconnected:
            status, error = core.refusal_of(ex, "the server sent no reply")
            core.reply(ex, status, JSON_HEADERS, error_body(error))
        self.flush()
        if self.writable is not None:
            await self.writable
        if self.transport is None or self.transport.is_closing():
            return
        self._handle(core.reply_done(ex))

    async def _stream(self, ex: Exchange, reply: HttpReply) -> None:
        """A reply whose body streams: its head and first part, then each part as it comes
        (chunked), written as the transport takes it; the client gone, the stream is closed."""
        core, stream = self.core, reply.stream
        assert stream is not None
        core.reply(ex, reply.status, reply.headers, reply.body, end=False, close=reply.close)
        self.flush()
        try:
            async for part in stream:
                if ex.disconnected or self.transport is None or self.transport.is_closing():
                    break
                core.reply_body(ex, part, end=False)
                self.flush()
                if self.writable is not None:
                    await self.writable
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        core.reply_body(ex, b"", end=True)

    # ------------------------------------------------------------------ closing

    def _close(self, *, linger: bool) -> None:
        """Close after the replies written; ``linger``: request bytes may still be coming (see
        LINGER_S), so end the writing side first and read on until the client closes."""
        t = self.transport
        if t is None or t.is_closing() or self.lingering is not None:
            return
        self.idle_since = None
        if not linger or not t.can_write_eof():
            t.close()
            return
        t.write_eof()
        self.lingering = self.loop.call_later(LINGER_S, t.close)
        self.reading = True
        with contextlib.suppress(RuntimeError):
            t.resume_reading()

    def close_idle(self) -> None:
        """At stop: an idle connection ends its writing side and reads and drops what still
        comes until the client closes (a close with unread data would reset it)."""
        if self.core.idle:
            self._close(linger=True)

    @property
    def answering(self) -> bool:
        """A request of this connection is read and not yet answered."""
        core = self.core
        return core.running is not None or bool(core.waiting)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _wake(ex: Exchange) -> None:
    body = ex.user
    if isinstance(body, RequestBody):
        body.wake()


def _host(addr: Any) -> str:
    return str(addr[0]) if isinstance(addr, tuple) and addr else ""


def _address(addr: Any) -> tuple[str, int] | None:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return str(addr[0]), int(addr[1])
    return None
