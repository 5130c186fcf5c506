"""seqserve's own HTTP/1.1 server (``--http-server builtin``): an ASGI server on the event loop,
with the request line, headers and body framing parsed in C by httptools (llhttp).

Why a server of our own: granian's embedded server runs its HTTP stack on Rust threads and
hands every request to the loop and every reply back (two thread hops and the GIL each way),
and hypercorn parses HTTP in Python. Here a request costs one ``data_received`` on the loop's
own thread, a task for the app, and one ``write`` for the reply; bench/README.md ("HTTP: the
builtin server") has the measurements.

It serves exactly what seqserve's app needs of HTTP/1.1, with every limit of docs/security.md:

- keep-alive and pipelining (replies in request order; at most ``MAX_PIPELINED`` requests
  waiting on one connection, after which it answers those and closes), ``Expect:
  100-continue``, chunked bodies both ways, ``HEAD``, HTTP/1.0;
- a request head larger than ``max_head_bytes`` gets 431, a malformed one 400, both as JSON
  ``{"error": ...}`` and followed by a close; upgrades (h2c, websockets) are not taken;
- one timer (``idle_s``) for a connection's wait for the next request and for its headers
  (slow-header clients), checked by one sweep for all connections rather than a timer each;
  the body's deadline is the app's (``http_body.BodyWatch``);
- ``max_connections``: a connection beyond gets 503 with a JSON error and is closed;
- flow control: reading pauses while a request's unread body passes ``_BODY_HIGH_WATER`` or
  pipelined requests wait; ``send`` waits while the transport's write buffer is full;
- TLS (and client certificates) through the loop's own TLS transport.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

from seqserve.api.limits import HttpLimits

log = logging.getLogger("seqserve.http")

ASGIApp = Callable[[dict[str, Any], Any, Any], Any]

#: a request line plus headers larger than this is refused with 431 (hypercorn and granian: 16 KiB
#: to 64 KiB); counted as it arrives, so an endless header costs at most this plus one read
DEFAULT_MAX_HEAD_BYTES = 64 << 10
#: headers per request (Triton's HTTP server, evhtp, allows about as many)
MAX_HEADERS = 100
#: the request target (path and query): longer is 414
MAX_TARGET_BYTES = 16 << 10
#: after a reply that leaves request bytes unread (a refusal, a body not read), the connection
#: reads and drops what still arrives, for up to this long, before it closes: a close with unread
#: data resets the connection, and the client could lose the reply it has not read yet
LINGER_S = 2.0
#: requests waiting behind the running one on a pipelining connection
MAX_PIPELINED = 32
#: unread request body buffered before the connection stops reading
_BODY_HIGH_WATER = 1 << 20

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DISCONNECT = {"type": "http.disconnect"}
_EMPTY_BODY = {"type": "http.request", "body": b"", "more_body": False}


class _Refused(Exception):
    """A request the server answers itself (status, error message) and then closes on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Http1Server:
    """Serves ``app`` on a listening socket until ``stop()``; ``serve()`` returns once every
    connection has closed (in-flight requests get ``grace_s`` to finish)."""

    def __init__(
        self,
        app: ASGIApp,
        limits: HttpLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
        grace_s: float = 1.0,
    ) -> None:
        self.app = app
        self.limits = limits
        self.idle_s = limits.idle_s
        self.keep_alive = limits.keepalive_s > 0
        self.ssl_context = ssl_context
        self.max_head_bytes = max_head_bytes
        self.grace_s = grace_s
        self.connections: set[_Connection] = set()
        self.stopping = False
        self._stop = asyncio.Event()
        self._listener: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, sock: Any) -> None:
        """Listen on ``sock`` (bound and listening)."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            lambda: _Connection(self),
            sock=sock,
            ssl=self.ssl_context,
            backlog=1024,
            # a TLS handshake that does not finish holds a socket outside the connection cap
            ssl_handshake_timeout=self.idle_s if self.ssl_context is not None else None,
        )
        self._sweep_later()

    def stop(self) -> None:
        """Stop accepting; close idle connections now and the others after their reply."""
        self.stopping = True
        self._stop.set()

    async def serve(self) -> None:
        await self._stop.wait()
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            conn.close_when_idle()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
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
            if (idle is not None and idle < expired) or (paused is not None and paused < stalled):
                conn.abort()
        self._sweep_later()


class _Exchange:
    """One request and its reply; ``receive`` and ``send`` are the app's ASGI channels."""

    __slots__ = (
        "body",
        "broken",
        "buffered",
        "chunked",
        "complete",
        "conn",
        "delivered",
        "disconnected",
        "expect_continue",
        "finished",
        "head_only",
        "keep_alive",
        "raw_left",
        "refused",
        "reply",
        "scope",
        "started",
        "waiter",
    )

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.scope: dict[str, Any] = {}
        self.body: list[bytes] = []  # arrived, not yet received by the app
        self.buffered = 0
        self.complete = False  # the whole body has arrived
        self.delivered = False  # the app has received the whole body
        self.waiter: asyncio.Future[None] | None = None  # receive() waiting for body or disconnect
        self.keep_alive = True
        self.raw_left = 0  # body bytes that follow an Upgrade request's head, read past the parser
        self.expect_continue = False
        self.head_only = False
        self.reply: tuple[int, Iterable[tuple[bytes, bytes]]] | None = None  # http.response.start
        self.started = False  # the reply's head was written
        self.chunked = False
        self.finished = False  # the reply was written whole
        self.refused: _Refused | None = None  # answered by the server, not the app
        self.disconnected = False
        self.broken = False  # its body's framing was malformed: it ends as a disconnect would

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        while True:
            if self.body:
                chunks, self.body, self.buffered = self.body, [], 0
                conn.body_drained()
                self.delivered = self.complete
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return {"type": "http.request", "body": body, "more_body": not self.complete}
            if self.disconnected or self.finished or self.broken:
                return _DISCONNECT
            if self.complete and not self.delivered:
                self.delivered = True
                return _EMPTY_BODY
            if self.expect_continue and not self.started and not self.complete:
                self.expect_continue = False
                if not conn.transport.is_closing():
                    conn.transport.write(_CONTINUE)
            # more body, or (once it is all received) the disconnect or the reply's end
            self.waiter = conn.loop.create_future()
            await self.waiter

    async def send(self, message: dict[str, Any]) -> None:
        if self.disconnected or self.finished:
            return
        kind = message["type"]
        conn = self.conn
        if kind == "http.response.start":
            self.reply = (message["status"], message.get("headers", ()))
            return
        if kind != "http.response.body":
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if not self.started:
            status, headers = self.reply or (500, [])
            conn.write_reply(self, status, headers, body, end=not more)
        else:
            if self.chunked:
                data = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
                if not more:
                    data += b"0\r\n\r\n"
            else:
                data = body
            if not more:
                self.finished = True
                self.wake()
            if data and not self.head_only and not conn.transport.is_closing():
                conn.transport.write(data)
        if conn.writable is not None:
            await conn.writable


class _Connection(asyncio.Protocol):
    __slots__ = (
        "client",
        "closing",
        "current",
        "head_bytes",
        "head_fresh",
        "headers",
        "idle_since",
        "in_head",
        "lingering",
        "local",
        "loop",
        "parser",
        "read_body_bytes",
        "reading",
        "running",
        "scheme",
        "server",
        "tail_bytes",
        "transport",
        "url",
        "waiting",
        "writable",
        "write_paused_since",
    )

    def __init__(self, server: Http1Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.idle_since: float | None = self.loop.time()  # waiting for a request or its head since
        self.head_bytes = 0  # of a head still incomplete
        self.head_fresh = False  # the head began in the read being parsed
        self.read_body_bytes = 0  # body bytes in the read being parsed
        self.in_head = False  # between a request's first byte and the end of its head
        self.tail_bytes = 0  # read during a body without body bytes in them: framing, trailers
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.current: _Exchange | None = None  # its body is being parsed
        self.running: _Exchange | None = None  # the app has it
        self.waiting: collections.deque[_Exchange] = collections.deque()  # pipelined, in order
        self.closing = False  # close once the running and waiting requests are answered
        self.reading = True
        self.writable: asyncio.Future[None] | None = None  # while the write buffer is full
        self.write_paused_since: float | None = None
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.scheme = "http"
        self.lingering: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self.transport = transport
        srv = self.server
        if srv.stopping or len(srv.connections) >= srv.limits.max_connections:
            msg = f"too many connections: the server serves at most {srv.limits.max_connections} at once"
            transport.write(_error_reply(503, "the server is shutting down" if srv.stopping else msg))
            self.idle_since = None
            self.closing = True
            self._close(linger=True)  # the client may be sending its request
            return
        srv.connections.add(self)
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        if transport.get_extra_info("sslcontext") is not None:
            self.scheme = "https"

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.lingering is not None:
            self.lingering.cancel()
        self.idle_since = None
        for ex in (self.running, self.current, *self.waiting):
            if ex is not None:
                ex.disconnected = True
                ex.wake()
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

    def eof_received(self) -> bool:
        """The client ended its side: taken as gone (as most HTTP servers do), so the requests it
        left cancel (the disconnect watch of api/http.py); a client cannot half-close and still
        read its reply."""
        return False

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            return  # dropped: the last reply is written
        current = self.current
        if current is not None and current.raw_left:
            self._raw_body(current, data)
            return
        if self.closing and current is None:
            return  # after a refusal or an upgrade: nothing more is read
        self.read_body_bytes = 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            # llhttp stops at an upgrade's head: it is answered over HTTP/1.1, its body (when it
            # has a length) read here, and nothing after it
            self.closing = True
            current = self.current
            if current is not None and current.raw_left:
                self._raw_body(current, data[e.args[0] :])
                return
        except httptools.HttpParserError as e:
            cause = e.__context__
            self._refuse(cause if isinstance(cause, _Refused) else _Refused(400, _parse_error(e)))
            return
        # What httptools holds without a callback is bounded here: an incomplete head (in the read
        # it began in, what was not another request's body), and chunk framing or trailers
        # (reads during a body without body bytes in them).
        limit = self.server.max_head_bytes
        if self.in_head:
            self.head_bytes += len(data) - self.read_body_bytes if self.head_fresh else len(data)
            self.head_fresh = False
            if self.head_bytes > limit:
                self._refuse(_Refused(431, "request head too large"))
                return
        elif self.current is not None and not self.read_body_bytes:
            self.tail_bytes += len(data)
            if self.tail_bytes > limit:
                self._refuse(_Refused(431, "request body framing or trailers too large"))
                return
        if self.running is None:
            self._next()

    def _raw_body(self, ex: _Exchange, data: bytes) -> None:
        """Body bytes of an Upgrade request (which llhttp leaves unparsed), up to its length."""
        take = data[: ex.raw_left]
        ex.raw_left -= len(take)
        if take:
            self.on_body(take)
        if not ex.raw_left:
            self.current = None
            ex.complete = True
            ex.wake()
        if self.running is None:
            self._next()

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self.closing:
            if self.server.stopping:
                raise _Refused(503, "the server is shutting down")
            raise _Refused(400, "no more requests on this connection")
        self.in_head = True
        self.head_fresh = True
        self.head_bytes = 0
        self.url = b""
        self.headers = []

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_TARGET_BYTES:
            raise _Refused(414, f"request target too long (over {MAX_TARGET_BYTES} bytes)")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise _Refused(431, f"too many request headers (at most {MAX_HEADERS})")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.idle_since = None
        parser = self.parser
        method = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _Refused(505, f"HTTP version {version[:8]} not supported: this server speaks HTTP/1.1")
        if method == "CONNECT":
            raise _Refused(405, "CONNECT is not supported")
        chunked = expect_continue = False
        length = b""
        for k, v in self.headers:  # one pass: llhttp has checked their syntax
            if k == b"transfer-encoding":
                if v.strip().lower() != b"chunked":
                    raise _Refused(501, "a Transfer-Encoding other than chunked is not supported")
                chunked = True
            elif k == b"content-length":
                length = v
            elif k == b"expect" and v.lower() == b"100-continue":
                expect_continue = version == "1.1"
        upgrade = parser.should_upgrade()
        if upgrade and chunked:  # not taken; llhttp leaves the body to this server
            raise _Refused(400, "a chunked body on an Upgrade request is not supported")
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            raise _Refused(400, "malformed request target") from None
        raw_path = url.path or b"/"
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path, encoding="utf-8", errors="replace")
        ex = _Exchange(self)
        ex.scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "method": method,
            "scheme": self.scheme,
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "root_path": "",
            "headers": self.headers,
            "client": self.client,
            "server": self.local,
        }
        self.headers = []  # trailers, if any, are not the request's headers
        self.tail_bytes = 0
        ex.keep_alive = self.server.keep_alive and parser.should_keep_alive() and not upgrade
        ex.raw_left = int(length) if upgrade and length.isdigit() else 0
        ex.head_only = method == "HEAD"
        ex.expect_continue = expect_continue
        self.current = ex
        if self.running is None and not self.waiting:
            self.running = ex
            self.loop.create_task(self._run(ex))  # its first step comes after this read is parsed
            return
        if len(self.waiting) >= MAX_PIPELINED:
            self.current = None
            raise _Refused(503, f"too many pipelined requests (at most {MAX_PIPELINED} wait)")
        self.waiting.append(ex)
        self._pause()

    def on_body(self, body: bytes) -> None:
        ex = self.current
        if ex is None:
            return
        self.tail_bytes = 0
        self.read_body_bytes += len(body)
        ex.body.append(body)
        ex.buffered += len(body)
        if ex.buffered > _BODY_HIGH_WATER:
            self._pause()
        ex.wake()

    def on_message_complete(self) -> None:
        ex = self.current
        if ex is not None and ex.raw_left:
            return  # an Upgrade request: its body follows, past the parser
        self.current = None
        if ex is not None:
            ex.complete = True
            ex.wake()

    # ------------------------------------------------------------------ the app's side

    async def _run(self, ex: _Exchange) -> None:
        try:
            await self.server.app(ex.scope, ex.receive, ex.send)
        except Exception as e:  # seqserve's app answers and logs its own errors
            if not ex.started and not ex.disconnected:
                log.error("HTTP %s %s failed: %r", ex.scope["method"], ex.scope["path"][:100], e)
                self.write_reply(ex, 500, [], orjson.dumps({"error": "internal error"}), end=True)
        except BaseException:  # cancelled (the loop is closing): no reply will come
            self.running = None
            self.abort()
            raise
        if not ex.finished and not ex.disconnected:
            if ex.started:  # a reply cut short: the client must not take it for a whole one
                self.abort()
                return
            status, error = (
                (500, "the server sent no reply") if ex.refused is None else (ex.refused.status, ex.refused.message)
            )
            self.write_reply(ex, status, _JSON_HEADERS, orjson.dumps({"error": error}), end=True)
        self._done(ex)

    def write_reply(
        self, ex: _Exchange, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes, *, end: bool
    ) -> None:
        """The reply's head, with the first (or only) part of its body, in one write."""
        ex.started = True
        if end:
            ex.finished = True
            ex.wake()
        if self.transport is None or self.transport.is_closing():
            return  # aborted: the client is gone
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
        length = None
        for k, v in headers:
            lk = k.lower()
            if lk == b"content-length":
                length = v
                continue
            if lk == b"connection":
                if b"close" in v.lower():
                    ex.keep_alive = False
                continue
            if lk == b"transfer-encoding":
                continue  # the framing is this server's
            head.append(b"%s: %s\r\n" % (k, v))
        if length is None and end:
            length = b"%d" % len(body)
        if length is not None:
            head.append(b"content-length: %s\r\n" % length)
        elif ex.scope["http_version"] == "1.0":
            ex.keep_alive = False  # no chunked framing in HTTP/1.0: the close ends the body
        else:
            ex.chunked = True
            head.append(b"transfer-encoding: chunked\r\n")
            if body:
                body = b"%x\r\n%s\r\n" % (len(body), body)
            if end:
                body += b"0\r\n\r\n"
        if end and not ex.complete:
            ex.keep_alive = False  # the rest of an unread body is not worth reading
        elif (self.closing or self.server.stopping) and not self.waiting:
            ex.keep_alive = False  # the last reply before the close
        if not ex.keep_alive:
            head.append(b"connection: close\r\n")
        elif ex.scope["http_version"] == "1.0":
            head.append(b"connection: keep-alive\r\n")
        head.append(b"\r\n")
        if not ex.head_only:
            head.append(body)
        self.transport.write(b"".join(head))

    def _done(self, ex: _Exchange) -> None:
        self.running = None
        if ex.disconnected or self.transport is None or self.transport.is_closing():
            return
        if not ex.keep_alive:
            self._close(linger=not ex.complete or ex.refused is not None or bool(self.waiting))
            return
        self._next()

    def _next(self) -> None:
        """Start the next waiting request, or note the connection idle."""
        if self.waiting:
            ex = self.waiting.popleft()
            self.running = ex
            if ex.refused is not None:
                self.write_reply(
                    ex, ex.refused.status, _JSON_HEADERS, orjson.dumps({"error": ex.refused.message}), end=True
                )
                self._done(ex)
                return
            self.loop.create_task(self._run(ex))
            if not self.waiting and ex.buffered <= _BODY_HIGH_WATER:
                self._resume()
            return
        if self.closing:
            self._close(linger=self.current is not None)
            return
        if self.current is None and self.idle_since is None:
            self.idle_since = self.loop.time()
        self._resume()

    def body_drained(self) -> None:
        """The app took the buffered body: read on, unless pipelined requests wait."""
        if not self.reading and not self.waiting:
            self._resume()

    # ------------------------------------------------------------------ helpers

    def _refuse(self, refusal: _Refused) -> None:
        """Answer a request the parser refused, in its turn, and close."""
        self.closing = True
        self.in_head = False
        self._pause()
        if self.current is not None:  # a broken body: the app reads the end of it and answers
            self.current.broken = True
            self.current.refused = refusal  # the answer if the app gives none
            self.current.wake()
            self.current = None
            return
        ex = _Exchange(self)
        ex.scope = {"http_version": "1.1", "method": "", "path": ""}
        ex.refused = refusal
        ex.complete = True
        ex.keep_alive = False
        self.waiting.append(ex)
        if self.running is None:
            self._next()

    def _pause(self) -> None:
        if self.reading and self.transport is not None:
            self.reading = False
            with contextlib.suppress(RuntimeError):  # a closing transport
                self.transport.pause_reading()

    def _resume(self) -> None:
        if not self.reading and not self.closing and self.transport is not None:
            self.reading = True
            with contextlib.suppress(RuntimeError):
                self.transport.resume_reading()

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

    def close_when_idle(self) -> None:
        self.closing = True
        if self.running is None and not self.waiting and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


_JSON_HEADERS = [(b"content-type", b"application/json")]


def _error_reply(status: int, message: str) -> bytes:
    body = orjson.dumps({"error": message})
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, _REASONS.get(status, b""), len(body))
    ) + body


def _parse_error(e: Exception) -> str:
    if isinstance(e, httptools.HttpParserInvalidMethodError):
        return "malformed HTTP request: unknown method"
    return "malformed HTTP request (request line, headers or body framing)"


def _address(addr: Any) -> tuple[str, int] | None:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return str(addr[0]), int(addr[1])
    return None
