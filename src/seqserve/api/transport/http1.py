"""The HTTP/1.1 connection as a state machine without I/O: bytes in, events and bytes out.

``Http1Connection.receive_data`` feeds what the client sent to httptools (llhttp, a C parser
with no I/O of its own) and returns events: ``RequestStarted`` (an exchange whose turn has
come: its handler may run) and ``BodyChanged`` (an exchange's body grew, ended or broke).
Replies are written with ``reply`` / ``reply_body``; everything to send collects in
``data_to_send()``. The I/O layer (``http1_server``) owns the socket, the timers and the tasks,
and applies three things the core decides: ``reading`` (pause or resume reading),
``close_action`` (close, with or without lingering) and ``idle`` (waiting for a request).

What it serves, with every limit of docs/security.md:

- keep-alive and pipelining (replies in request order; at most ``MAX_PIPELINED`` requests
  waiting behind the running one, after which it answers those and closes), ``Expect:
  100-continue``, chunked bodies both ways, ``HEAD``, HTTP/1.0;
- a request head larger than ``max_head_bytes`` gets 431, a malformed one 400, both as JSON
  ``{"error": ...}`` and followed by a close; upgrades (h2c, websockets) are not taken;
- what llhttp lets through or refuses against RFC 9112 / 9110 is settled by ``http1_rules``:
  Host (required, checked), HTTP/1.x minor versions (served as 1.1), the Transfer-Encoding list
  (``chunked,`` is ``chunked``: a parser primed with a chunked head takes over, since llhttp
  would read that body to the end of the connection), and every request-smuggling shape;
- every reply but 100 Continue carries a Date (formatted once per second);
- reading pauses while a request's unread body passes ``BODY_HIGH_WATER`` or pipelined
  requests wait.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import orjson

from seqserve.api.transport.http1_rules import (
    HTTP_DATE,
    Refused,
    check_host,
    check_transfer_encoding,
    llhttp_frames_chunked,
    new_parser,
    primed_parser,
    request_version,
)

#: a request line plus headers larger than this is refused with 431 (hypercorn and granian: 16 KiB
#: to 64 KiB); counted as it arrives, so an endless header costs at most this plus one read
DEFAULT_MAX_HEAD_BYTES = 64 << 10
#: headers per request (Triton's HTTP server, evhtp, allows about as many)
MAX_HEADERS = 100
#: the request target (path and query): longer is 414
MAX_TARGET_BYTES = 16 << 10
#: requests waiting behind the running one on a pipelining connection
MAX_PIPELINED = 32
#: unread request body buffered before the connection stops reading
BODY_HIGH_WATER = 1 << 20

REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
JSON_HEADERS = [(b"content-type", b"application/json")]


class CloseAction(enum.Enum):
    """What the I/O layer does once the core decides the connection ends."""

    NONE = 0
    CLOSE = 1  # close now, after what was written
    LINGER = 2  # end the writing side, and read and drop what still comes before closing


@dataclass(slots=True)
class RequestHead:
    """A parsed request head: names lower-case, the path percent-decoded."""

    method: str
    path: str
    raw_path: bytes
    query: bytes
    headers: list[tuple[bytes, bytes]]
    http_version: str


class Exchange:
    """One request and its reply, as the connection sees them."""

    __slots__ = (
        "body",
        "broken",
        "buffered",
        "chunked",
        "complete",
        "delivered",
        "disconnected",
        "expect_continue",
        "finished",
        "head",
        "head_only",
        "keep_alive",
        "raw_left",
        "refused",
        "started",
        "user",
    )

    def __init__(self, head: RequestHead | None) -> None:
        self.head = head  # None: a request the parser refused before its head was whole
        self.body: list[bytes] = []  # arrived, not yet taken by the handler
        self.buffered = 0
        self.complete = False  # the whole body has arrived
        self.delivered = False  # the handler has taken the whole body
        self.keep_alive = True
        self.raw_left = 0  # body bytes that follow an Upgrade request's head, read past the parser
        self.expect_continue = False
        self.head_only = False
        self.started = False  # the reply's head was written
        self.chunked = False
        self.finished = False  # the reply was written whole
        self.refused: Refused | None = None  # answered by the connection, not the handler
        self.disconnected = False
        self.broken = False  # its body's framing was malformed: it ends as a disconnect would
        self.user: Any = None  # whatever the I/O layer attaches (its waiter)

    @property
    def version(self) -> str:
        return "1.1" if self.head is None else self.head.http_version


@dataclass(slots=True)
class RequestStarted:
    """``exchange``'s turn has come: run its handler."""

    exchange: Exchange


@dataclass(slots=True)
class BodyChanged:
    """``exchange``'s body grew, ended or broke: wake its reader."""

    exchange: Exchange


Event = RequestStarted | BodyChanged


class Http1Connection:
    """One server-side HTTP/1.1 connection's state; see the module docstring."""

    def __init__(self, *, keep_alive: bool = True, max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES) -> None:
        self.keep_alive = keep_alive  # the server's: off answers one request per connection
        self.max_head_bytes = max_head_bytes
        self.parser = new_parser(self)
        self.stopping = False  # the server is shutting down
        self.closing = False  # close once the running and waiting requests are answered
        self.reading = True  # what the I/O layer should do with its transport
        self.close_action = CloseAction.NONE
        self.current: Exchange | None = None  # its body is being parsed
        self.running: Exchange | None = None  # its handler runs (or its refusal is written)
        self.waiting: collections.deque[Exchange] = collections.deque()  # pipelined, in order
        self._head_bytes = 0  # of a head still incomplete
        self._head_fresh = False  # the head began in the read being parsed
        self._read_body_bytes = 0  # body bytes in the read being parsed
        self._in_head = False  # between a request's first byte and the end of its head
        self._tail_bytes = 0  # read during a body without body bytes in them: framing, trailers
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._large_read = False  # the read being parsed is larger than max_head_bytes
        self._field_bytes = 0  # names and values of the head (or trailers) being parsed
        self._host_seen = b""  # the last Host value found valid
        self._reframe: list[bytes] | None = None  # see on_body
        self._out: list[bytes] = []
        self._events: list[Event] = []

    # ------------------------------------------------------------------ the I/O layer's calls

    @property
    def idle(self) -> bool:
        """Waiting for a request or for the rest of its head (the idle and header timers run)."""
        return (
            self.running is None and self.current is None and not self.waiting and self.close_action is CloseAction.NONE
        )

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def receive_data(self, data: bytes) -> list[Event]:
        """What the client sent; returns the events it caused."""
        current = self.current
        if current is not None and current.raw_left:
            self._raw_body(current, data)
            return self._take_events()
        if self.closing and current is None:
            return []  # after a refusal or an upgrade: nothing more is read
        self._read_body_bytes = 0
        self._large_read = len(data) > self.max_head_bytes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            # llhttp stops at an upgrade's head: it is answered over HTTP/1.1, its body (when it
            # has a length) read here, and nothing after it
            self.closing = True
            current = self.current
            if current is not None and current.raw_left:
                self._raw_body(current, data[e.args[0] :])
                return self._take_events()
        except httptools.HttpParserError as e:
            cause = e.__context__
            self._refuse(cause if isinstance(cause, Refused) else Refused(400, parse_error(e)))
            return self._take_events()
        if self._reframe is not None:
            return self._reframed()
        # What httptools holds without a callback is bounded here: an incomplete head (in the read
        # it began in, what was not another request's body), and chunk framing or trailers
        # (reads during a body without body bytes in them).
        limit = self.max_head_bytes
        if self._in_head:
            self._head_bytes += len(data) - self._read_body_bytes if self._head_fresh else len(data)
            self._head_fresh = False
            if self._head_bytes > limit:
                self._refuse(Refused(431, "request head too large"))
                return self._take_events()
        elif self.current is not None and not self._read_body_bytes:
            self._tail_bytes += len(data)
            if self._tail_bytes > limit:
                self._refuse(Refused(431, "request body framing or trailers too large"))
                return self._take_events()
        if self.running is None:
            self._next()
        return self._take_events()

    def connection_lost(self) -> list[Exchange]:
        """The client is gone: every exchange it left ends as a disconnect; returns them."""
        self.close_action = CloseAction.CLOSE
        gone = [ex for ex in dict.fromkeys((self.running, self.current, *self.waiting)) if ex is not None]
        for ex in gone:
            ex.disconnected = True
        return gone

    def take_body(self, ex: Exchange) -> tuple[bytes, bool] | bool:
        """The body that arrived for ``ex`` as (bytes, more to come); False: it ended early
        (disconnect, broken framing, or the reply is already written); True: wait for more.
        Asks for the client's body (100 Continue) when it must wait for it."""
        if ex.body:
            chunks, ex.body, ex.buffered = ex.body, [], 0
            if not self.reading and not self.waiting:  # read on, unless pipelined requests wait
                self._resume()
            ex.delivered = ex.complete
            return (chunks[0] if len(chunks) == 1 else b"".join(chunks)), not ex.complete
        if ex.disconnected or ex.finished or ex.broken:
            return False
        if ex.complete and not ex.delivered:
            ex.delivered = True
            return b"", False
        if ex.expect_continue and not ex.started and not ex.complete:
            ex.expect_continue = False
            self._out.append(CONTINUE)
        return True

    def reply(
        self,
        ex: Exchange,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        *,
        end: bool = True,
        close: bool = False,
    ) -> None:
        """The reply's head, with the first (or only) part of its body, in one write; ``end``
        False: more follows (``reply_body``). ``headers`` hold no framing header (content-length,
        transfer-encoding, connection): the framing is this connection's, and ``close`` ends the
        keep-alive after this reply."""
        ex.started = True
        if end:
            ex.finished = True
        if ex.disconnected:
            return
        if close:
            ex.keep_alive = False
        head = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"")), HTTP_DATE.header()]
        head.extend(b"%s: %s\r\n" % kv for kv in headers)
        self._write_head(ex, head, body, end)

    def reply_body(self, ex: Exchange, data: bytes, *, end: bool) -> None:
        """More of a reply whose head was written without its whole body."""
        if ex.finished or ex.disconnected:
            return
        if ex.chunked:
            out = b"%x\r\n%s\r\n" % (len(data), data) if data else b""
            if end:
                out += b"0\r\n\r\n"
        else:
            out = data
        if end:
            ex.finished = True
        if out and not ex.head_only:
            self._out.append(out)

    def refusal_of(self, ex: Exchange, fallback: str) -> tuple[int, str]:
        """The answer for a request its handler left without a reply."""
        return (500, fallback) if ex.refused is None else (ex.refused.status, ex.refused.message)

    def reply_done(self, ex: Exchange) -> list[Event]:
        """``ex``'s handler is done and its reply written: go on with the next request, or close."""
        self._done(ex)
        return self._take_events()

    def abandon(self) -> None:
        """The running handler will give no reply (cancelled): the connection is to be cut."""
        self.running = None

    def close_when_idle(self) -> bool:
        """The server stops: no new request is taken; True when the connection can close now."""
        self.closing = True
        return self.running is None and not self.waiting

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self.closing:
            if self.stopping:
                raise Refused(503, "the server is shutting down")
            raise Refused(400, "no more requests on this connection")
        self._in_head = True
        self._head_fresh = True
        self._head_bytes = 0
        self._url = b""
        self._headers = []
        self._field_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_TARGET_BYTES:
            raise Refused(414, f"request target too long (over {MAX_TARGET_BYTES} bytes)")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) >= MAX_HEADERS:
            raise Refused(431, f"too many request headers (at most {MAX_HEADERS})")
        if self._large_read:  # a head that arrives whole in one read counts against the limit too
            self._field_bytes += len(name) + len(value)
            if self._field_bytes > self.max_head_bytes:
                raise Refused(431, "request head too large")
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self.parser
        method = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            version = request_version(version)
        if method == "CONNECT":
            raise Refused(405, "CONNECT is not supported")
        expect_continue = False
        length = b""
        hosts: list[bytes] = []
        codings: list[bytes] | None = None
        for k, v in self._headers:  # one pass: llhttp has checked their syntax
            if k == b"host":
                hosts.append(v)
            elif k == b"transfer-encoding":
                codings = [v] if codings is None else [*codings, v]
            elif k == b"content-length":
                length = v
            elif k == b"expect" and v.lower() == b"100-continue":
                expect_continue = version == "1.1"
        if len(hosts) != 1:
            check_host(hosts, version)
        elif hosts[0] != self._host_seen:  # the same Host as the last request's is not checked again
            check_host(hosts, version)
            self._host_seen = hosts[0]
        chunked = reframe = codings is not None
        if codings is not None:
            check_transfer_encoding(codings, version, bool(length))
            reframe = not llhttp_frames_chunked(codings)
        upgrade = parser.should_upgrade()
        if upgrade and chunked:  # not taken; llhttp leaves the body to this connection
            raise Refused(400, "a chunked body on an Upgrade request is not supported")
        try:
            url = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:
            raise Refused(400, "malformed request target") from None
        if url.fragment is not None:
            raise Refused(400, "a fragment (#) in the request target (RFC 9112 §3.2)")
        raw_path = url.path or b"/"
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path, encoding="utf-8", errors="replace")
        ex = Exchange(RequestHead(method, path, raw_path, url.query or b"", self._headers, version))
        self._headers = []  # trailers, if any, are not the request's headers
        self._field_bytes = 0
        self._tail_bytes = 0
        ex.keep_alive = self.keep_alive and parser.should_keep_alive() and not upgrade
        ex.raw_left = int(length) if upgrade and length.isdigit() else 0
        ex.head_only = method == "HEAD"
        ex.expect_continue = expect_continue
        if reframe:
            self._reframe = []  # see on_body
        self.current = ex
        if self.running is None and not self.waiting:
            self.running = ex
            self._events.append(RequestStarted(ex))
            return
        if len(self.waiting) >= MAX_PIPELINED:
            self.current = None
            raise Refused(503, f"too many pipelined requests (at most {MAX_PIPELINED} wait)")
        self.waiting.append(ex)
        self._pause()

    def on_body(self, body: bytes) -> None:
        if self._reframe is not None:
            # llhttp reads this request's body to the end of the connection (its Transfer-Encoding
            # list is valid but not llhttp's spelling, e.g. ``chunked,``): kept for _reframed
            self._reframe.append(body)
            return
        ex = self.current
        if ex is None:
            return
        self._tail_bytes = 0
        self._read_body_bytes += len(body)
        ex.body.append(body)
        ex.buffered += len(body)
        if ex.buffered > BODY_HIGH_WATER:
            self._pause()
        self._events.append(BodyChanged(ex))

    def on_message_complete(self) -> None:
        ex = self.current
        if ex is not None and ex.raw_left:
            return  # an Upgrade request: its body follows, past the parser
        self.current = None
        if ex is not None:
            ex.complete = True
            self._events.append(BodyChanged(ex))

    # ------------------------------------------------------------------ helpers

    def _reframed(self) -> list[Event]:
        """A new parser, primed with a chunked head, takes over from the one that read the last
        head: it reads the chunked body that followed, and the requests after it."""
        rest = b"".join(self._reframe or ())
        self._reframe = None
        self.parser = primed_parser(self)
        return self.receive_data(rest)

    def _raw_body(self, ex: Exchange, data: bytes) -> None:
        """Body bytes of an Upgrade request (which llhttp leaves unparsed), up to its length."""
        take = data[: ex.raw_left]
        ex.raw_left -= len(take)
        if take:
            self.on_body(take)
        if not ex.raw_left:
            self.current = None
            ex.complete = True
            self._events.append(BodyChanged(ex))
        if self.running is None:
            self._next()

    def _write_head(self, ex: Exchange, head: list[bytes], body: bytes, end: bool) -> None:
        if end:
            head.append(b"content-length: %d\r\n" % len(body))
        elif ex.version == "1.0":
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
        elif (self.closing or self.stopping) and not self.waiting:
            ex.keep_alive = False  # the last reply before the close
        if not ex.keep_alive:
            head.append(b"connection: close\r\n")
        elif ex.version == "1.0":
            head.append(b"connection: keep-alive\r\n")
        head.append(b"\r\n")
        if not ex.head_only:
            head.append(body)
        self._out.append(b"".join(head))

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _done(self, ex: Exchange) -> None:
        self.running = None
        if ex.disconnected or self.close_action is not CloseAction.NONE:
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
                self.reply(ex, ex.refused.status, JSON_HEADERS, error_body(ex.refused.message))
                self._done(ex)
                return
            self._events.append(RequestStarted(ex))
            if not self.waiting and ex.buffered <= BODY_HIGH_WATER:
                self._resume()
            return
        if self.closing:
            self._close(linger=self.current is not None)
            return
        self._resume()

    def _refuse(self, refusal: Refused) -> None:
        """Answer a request the parser refused, in its turn, and close."""
        self.closing = True
        self._in_head = False
        self._pause()
        current = self.current
        if current is not None:  # a broken body: the handler reads the end of it and answers
            current.broken = True
            current.refused = refusal  # the answer if the handler gives none
            self._events.append(BodyChanged(current))
            self.current = None
            return
        ex = Exchange(None)
        ex.refused = refusal
        ex.complete = True
        ex.keep_alive = False
        self.waiting.append(ex)
        if self.running is None:
            self._next()

    def _pause(self) -> None:
        self.reading = False

    def _resume(self) -> None:
        if not self.closing:
            self.reading = True

    def _close(self, *, linger: bool) -> None:
        self.close_action = CloseAction.LINGER if linger else CloseAction.CLOSE
        self.reading = linger  # a lingering connection reads and drops what still comes


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def error_reply(status: int, message: str) -> bytes:
    """A whole JSON error reply that closes the connection (one refused before any request)."""
    body = error_body(message)
    return (
        b"HTTP/1.1 %d %s\r\n%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, REASONS.get(status, b""), HTTP_DATE.header(), len(body))
    ) + body


def parse_error(e: Exception) -> str:
    if isinstance(e, httptools.HttpParserInvalidMethodError):
        return "malformed HTTP request: unknown method"
    return "malformed HTTP request (request line, headers or body framing)"
