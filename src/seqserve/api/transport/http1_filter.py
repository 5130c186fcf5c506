"""The request stream of a hypercorn connection (``--http-server hypercorn``), checked with the
builtin server's rules before hypercorn reads it; without I/O.

hypercorn parses HTTP/1.1 with h11, which answers a request in several Content-Length plus
Transfer-Encoding shapes (a tab or upper case in the Transfer-Encoding value, obs-fold, bare LF)
and keeps the connection: the request-smuggling shapes that a proxy in front may frame the
other way. ``RequestFilter`` runs llhttp over the same bytes with the rules of ``http1_rules``
(and llhttp's own checks); the first request it refuses, and everything after it, never reaches
hypercorn. hypercorn gets the requests before it whole and then a request line that h11
refuses, so the client gets hypercorn's 400 (with its JSON body, ``hypercorn.JsonErrorWriter``)
after the replies before it, and the connection closes. Where the refused head starts in a read
that began inside an earlier request, where it starts is not known: the connection just closes.

An HTTP/2 connection (the prior-knowledge preface, or an accepted ``Upgrade: h2c``) is passed
through unchecked: the rules are HTTP/1.1's. Any other Upgrade is refused (h11 would go on
reading HTTP/1.1 after it, past this filter).
"""

from __future__ import annotations

import contextlib

import httptools

from seqserve.api.transport.http1_rules import (
    Refused,
    check_host,
    check_transfer_encoding,
    llhttp_frames_chunked,
    new_parser,
    primed_parser,
    request_version,
)

#: what hypercorn gets in place of a refused request: a request line h11 answers with 400
REFUSED_LINE = b"\x00 refused by seqserve\r\n\r\n"
#: the start of the HTTP/2 connection preface (RFC 9113 §3.4), where llhttp stops
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\n"


class MessageCounter:
    """Counts the messages a parser completes (``RequestFilter.boundary``)."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = 0

    def on_message_complete(self) -> None:
        self.complete += 1


class RequestFilter:
    """Feed it each read; pass on what ``feed`` returns. ``refused`` once a request was refused
    (then ``feed`` returns nothing: the caller ends the stream once hypercorn has answered)."""

    __slots__ = ("between", "completed", "headers", "opening", "parser", "passing", "reframe", "refusal", "refused")

    def __init__(self) -> None:
        self.parser = new_parser(self)
        self.headers: list[tuple[bytes, bytes]] = []
        self.between = True  # no message started since the last one completed
        self.completed = 0
        self.opening = b""  # the connection's first bytes, as long as the HTTP/2 preface's start
        self.passing = False  # HTTP/2 on this connection: not checked
        self.refused = False
        self.refusal: Refused | None = None  # why, where it was one of this module's rules
        self.reframe: list[bytes] | None = None  # as in Http1Connection.on_body

    def feed(self, data: bytes) -> bytes:
        if self.passing:
            return data
        if self.refused:
            return b""
        if len(self.opening) < len(H2_PREFACE):
            self.opening += data[: len(H2_PREFACE) - len(self.opening)]
        at_boundary, completed = self.between, self.completed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.passing = True  # an h2c upgrade (on_headers_complete refused any other)
            return data
        except httptools.HttpParserError as e:
            if self.completed == 0 and self.opening.startswith(H2_PREFACE):
                self.passing = True  # llhttp stops at the preface's request line: HTTP/2, prior knowledge
                return data
            cause = e.__context__
            self.refusal = cause if isinstance(cause, Refused) else None
            self.refused = True
            if not at_boundary:
                return b""  # cannot tell where the refused request starts: hypercorn gets nothing more
            return data[: boundary(data, self.completed - completed)] + REFUSED_LINE
        if self.reframe is not None:  # as in Http1Connection._reframed
            rest = b"".join(self.reframe)
            self.reframe = None
            self.parser = primed_parser(self)
            return data[: len(data) - len(rest)] + self.feed(rest)
        return data

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self.between = False
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = request_version(parser.get_http_version())
        hosts: list[bytes] = []
        codings: list[bytes] = []
        length = False
        upgrade = b""
        for k, v in self.headers:
            if k == b"host":
                hosts.append(v)
            elif k == b"transfer-encoding":
                codings.append(v)
            elif k == b"content-length":
                length = True
            elif k == b"upgrade":
                upgrade = v.strip(b" \t").lower()
        self.headers = []  # trailers, if any, are not the request's headers
        check_host(hosts, version)
        if codings:
            check_transfer_encoding(codings, version, length)
            if not llhttp_frames_chunked(codings):
                self.reframe = []
        if parser.should_upgrade() and upgrade != b"h2c":
            raise Refused(400, "only an h2c upgrade is taken")

    def on_url(self, url: bytes) -> None:
        if b"#" in url:  # the rest of the target is h11's to check
            raise Refused(400, "a fragment (#) in the request target (RFC 9112 §3.2)")

    def on_body(self, body: bytes) -> None:
        if self.reframe is not None:
            self.reframe.append(body)

    def on_message_complete(self) -> None:
        self.between = True
        self.completed += 1


def boundary(data: bytes, messages: int) -> int:
    """Where the first ``messages`` whole requests in ``data`` end (``data`` starts with a
    request); found by parsing prefixes, only on the way to a refusal."""
    if messages == 0:
        return 0
    low, high = 0, len(data)  # the end of the messages lies in (low, high]
    while high - low > 1:
        middle = (low + high) // 2
        counter = MessageCounter()
        # past the refused request's start, the parser stops: it counted what completed before it
        with contextlib.suppress(httptools.HttpParserError):
            new_parser(counter).feed_data(data[:middle])
        if counter.complete >= messages:
            high = middle
        else:
            low = middle
    return high
