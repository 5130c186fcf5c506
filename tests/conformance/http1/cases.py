"""The HTTP/1.1 conformance cases, each named after the section of RFC 9112 or RFC 9110 that
says what a server must do with it: raw request bytes, the statuses of the replies, and whether
the connection closes after them. test_core.py runs every case against the sans-IO core;
test_live.py runs the cases marked ``live`` against a real ``seqserve serve`` over loopback
(and the ``hypercorn`` ones against ``--http-server hypercorn`` too).

The requests use two paths that the KServe routes and the core's echo handler both answer:
``GET /v2/health/live`` and ``POST /v2/repository/index`` with the body ``{}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from seqserve.api.transport.http1 import MAX_HEADERS, MAX_PIPELINED, MAX_TARGET_BYTES


@dataclass(frozen=True)
class Case:
    """``statuses``: one per reply, in order. ``bodies``: the core's echo of each request served
    (``b"METHOD path version|body"``), when the case checks them. ``message``: a part of the
    last reply's JSON error."""

    id: str
    raw: bytes
    statuses: tuple[int, ...]
    close: bool
    bodies: tuple[bytes, ...] | None = None
    message: str = ""
    live: bool = False
    hypercorn: bool = False
    split: bool = True  # also fed one byte per read


GET = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
FOLLOW = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"  # a second request: must not be reached


def post(*headers: bytes, body: bytes = b"{}", version: bytes = b"1.1") -> bytes:
    """A POST to the index with ``headers`` (each a whole field line) and ``body`` as given."""
    head = b"POST /v2/repository/index HTTP/" + version + b"\r\nHost: x\r\n"
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def get(*headers: bytes, target: bytes = b"/v2/health/live", version: bytes = b"1.1", host: bool = True) -> bytes:
    head = b"GET " + target + b" HTTP/" + version + b"\r\n" + (b"Host: x\r\n" if host else b"")
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n"


def echo(method: str, path: str, body: bytes = b"", version: str = "1.1") -> bytes:
    return f"{method} {path} {version}|".encode() + body


LIVE_ECHO = echo("GET", "/v2/health/live")
INDEX_ECHO = echo("POST", "/v2/repository/index", b"{}")
CHUNKED = b"Transfer-Encoding: chunked"
CHUNKS = b"2\r\n{}\r\n0\r\n\r\n"


def refused(case_id: str, raw: bytes, status: int = 400, message: str = "", **kw: bool) -> Case:
    """A request the server refuses, and closes on; nothing after it is served."""
    return Case(case_id, raw + FOLLOW, (status,), True, message=message, **kw)


def served(case_id: str, raw: bytes, *bodies: bytes, **kw: bool) -> Case:
    """Requests the server serves, keeping the connection."""
    return Case(case_id, raw, (200,) * len(bodies), False, bodies=bodies, **kw)


def smuggled(case_id: str, raw: bytes) -> Case:
    """A request-smuggling shape (a body framed two ways, or framing that parsers read apart):
    400, the connection closed, the request in its body never served; on both servers."""
    return refused(case_id, raw, live=True, hypercorn=True)


SMUGGLING = [
    smuggled("rfc9112-6.1-cl-then-te", post(b"Content-Length: 4", CHUNKED, body=b"0\r\n\r\n")),
    smuggled("rfc9112-6.1-te-then-cl", post(CHUNKED, b"Content-Length: 4", body=b"0\r\n\r\n")),
    smuggled("rfc9112-6.1-cl-te-tab", post(b"Content-Length: 4", b"Transfer-Encoding:\tchunked", body=b"0\r\n\r\n")),
    smuggled("rfc9112-6.1-cl-te-upper", post(b"Content-Length: 4", b"Transfer-Encoding: CHUNKED", body=b"0\r\n\r\n")),
    smuggled("rfc9112-6.1-cl-te-comma", post(b"Content-Length: 4", b"Transfer-Encoding: chunked,", body=b"0\r\n\r\n")),
    smuggled("rfc9112-5.2-cl-te-obs-fold", post(b"Content-Length: 4", b"Transfer-Encoding:", b" chunked",
                                                body=b"0\r\n\r\n")),
    smuggled("rfc9112-5.2-te-obs-fold", post(b"Transfer-Encoding: identity", b" chunked", body=CHUNKS)),
    smuggled("rfc9112-2.2-cl-te-bare-lf", post(b"Content-Length: 4\nTransfer-Encoding: chunked", body=b"0\r\n\r\n")),
    smuggled(
        "rfc9112-2.2-bare-lf-lines",
        b"POST /v2/repository/index HTTP/1.1\nHost: x\nContent-Length: 4\nTransfer-Encoding: chunked\n\n0\r\n\r\n",
    ),
    smuggled("rfc9112-5.1-te-space-before-colon", post(b"Transfer-Encoding : chunked", b"Content-Length: 4",
                                                       body=b"0\r\n\r\n")),
    smuggled("rfc9112-5.1-cl-space-before-colon", post(b"Content-Length : 4", body=b"{}\r\n")),
    smuggled("rfc9112-5.5-te-vertical-tab", post(b"Transfer-Encoding:\x0bchunked", b"Content-Length: 4",
                                                  body=b"0\r\n\r\n")),
    smuggled("rfc9112-5.5-te-nul", post(b"Transfer-Encoding: chunked\x00", body=CHUNKS)),
    smuggled("rfc9112-6.1-te-twice-chunked", post(CHUNKED, CHUNKED, body=CHUNKS)),
    smuggled("rfc9112-6.1-te-chunked-then-identity", post(CHUNKED, b"Transfer-Encoding: identity", body=CHUNKS)),
    smuggled("rfc9112-6.3-te-chunked-not-last", post(b"Transfer-Encoding: chunked, identity", body=CHUNKS)),
    smuggled("rfc9112-6.3-te-xchunked", post(b"Transfer-Encoding: xchunked", body=CHUNKS)),
    smuggled("rfc9112-6.3-te-quoted", post(b'Transfer-Encoding: "chunked"', body=CHUNKS)),
    smuggled("rfc9112-6.1-te-in-http-1.0", post(CHUNKED, body=CHUNKS, version=b"1.0")),
    smuggled("rfc9112-6.3-cl-twice-different", post(b"Content-Length: 2", b"Content-Length: 5", body=b"{}")),
    smuggled("rfc9112-6.3-cl-twice-same", post(b"Content-Length: 2", b"Content-Length: 2", body=b"{}")),
    smuggled("rfc9112-6.3-cl-list", post(b"Content-Length: 2, 2", body=b"{}")),
    smuggled("rfc9112-6.2-cl-plus", post(b"Content-Length: +2", body=b"{}")),
    smuggled("rfc9112-6.2-cl-negative", post(b"Content-Length: -2", body=b"{}")),
    smuggled("rfc9112-6.2-cl-hex", post(b"Content-Length: 0x2", body=b"{}")),
    smuggled("rfc9112-6.2-cl-two-numbers", post(b"Content-Length: 2 2", body=b"{}")),
    smuggled("rfc9112-6.2-cl-empty", post(b"Content-Length: ", body=b"{}")),
    smuggled("rfc9112-7.1-chunk-size-hex-prefix", post(CHUNKED, body=b"0x2\r\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1-chunk-size-bare-lf", post(CHUNKED, body=b"2\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1-chunk-data-bare-lf", post(CHUNKED, body=b"2\r\n{}\n0\r\n\r\n")),
    smuggled("rfc9112-7.1-chunk-data-overrun", post(CHUNKED, body=b"1\r\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1-chunk-size-space", post(CHUNKED, body=b"2 \r\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1-chunk-size-negative", post(CHUNKED, body=b"-2\r\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1-chunk-size-overflow", post(CHUNKED, body=b"10000000000000002\r\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1.1-chunk-ext-control", post(CHUNKED, body=b"2;\x01\r\n{}\r\n0\r\n\r\n")),
    smuggled("rfc9112-7.1.2-trailer-obs-fold", post(CHUNKED, body=b"2\r\n{}\r\n0\r\nX: a\r\n b\r\n\r\n")),
]  # fmt: skip

FRAMING = [
    served("rfc9112-6.2-content-length", post(b"Content-Length: 2"), INDEX_ECHO, live=True, hypercorn=True),
    served("rfc9112-6.2-content-length-leading-zeros", post(b"Content-Length: 002"), INDEX_ECHO, live=True),
    served("rfc9112-6.3-no-length-no-body", get() + get(), LIVE_ECHO, LIVE_ECHO, live=True),
    served("rfc9112-6.3-get-with-a-body", get(b"Content-Length: 2") + b"{}" + get(), echo("GET", "/v2/health/live",
                                                                                           b"{}"), LIVE_ECHO),
    served("rfc9112-7.1-chunked", post(CHUNKED, body=CHUNKS), INDEX_ECHO, live=True, hypercorn=True),
    served("rfc9112-7.1-chunked-then-next", post(CHUNKED, body=CHUNKS) + get(), INDEX_ECHO, LIVE_ECHO, live=True),
    served("rfc9112-7.1-chunks-several", post(CHUNKED, body=b"1\r\n{\r\n1\r\n}\r\n0\r\n\r\n"), INDEX_ECHO),
    served("rfc9112-7.1-chunk-size-upper-hex", post(CHUNKED, body=b"A\r\n0123456789\r\n0\r\n\r\n"),
           echo("POST", "/v2/repository/index", b"0123456789")),
    served("rfc9112-7.1-chunk-size-leading-zeros", post(CHUNKED, body=b"0002\r\n{}\r\n000\r\n\r\n"), INDEX_ECHO),
    served("rfc9112-7.1.1-chunk-extension", post(CHUNKED, body=b"2;a=b;c\r\n{}\r\n0;end=1\r\n\r\n"), INDEX_ECHO,
           live=True),
    served("rfc9112-7.1.1-chunk-extension-quoted", post(CHUNKED, body=b'2;a="x y"\r\n{}\r\n0\r\n\r\n'), INDEX_ECHO),
    served("rfc9112-7.1.2-trailer", post(CHUNKED, body=b"2\r\n{}\r\n0\r\nX-Trailer: 1\r\n\r\n") + get(), INDEX_ECHO,
           LIVE_ECHO, live=True),
    served("rfc9110-7.6.1-te-case-insensitive", post(b"Transfer-Encoding: Chunked", body=CHUNKS), INDEX_ECHO),
    served("rfc9110-5.6.1-te-list-trailing-comma", post(b"Transfer-Encoding: chunked,", body=CHUNKS) + get(),
           INDEX_ECHO, LIVE_ECHO, live=True),
    served("rfc9110-5.6.1-te-list-leading-comma", post(b"Transfer-Encoding: , chunked", body=CHUNKS) + get(),
           INDEX_ECHO, LIVE_ECHO, live=True),
    served("rfc9110-5.6.1-te-list-empty-elements", post(b"Transfer-Encoding: ,,chunked ,\t,", body=CHUNKS) + get(),
           INDEX_ECHO, LIVE_ECHO),
    served("rfc9110-5.5-te-trailing-whitespace", post(b"Transfer-Encoding: chunked \t", body=CHUNKS), INDEX_ECHO),
    refused("rfc9112-6.1-te-unknown-coding", post(b"Transfer-Encoding: gzip, chunked", body=CHUNKS), 501,
            "Transfer-Encoding", live=True),
    refused("rfc9112-6.1-te-empty-list", post(b"Transfer-Encoding: ,", body=CHUNKS)),
    refused("rfc9110-15.5.14-content-length-too-large", post(b"Content-Length: 100000000000000000000")),
]  # fmt: skip

VERSIONS = [
    served("rfc9112-2.3-http-1.1", get(), LIVE_ECHO, live=True),
    Case("rfc9112-2.3-http-1.0-closes", get(version=b"1.0", host=False), (200,), True,
         bodies=(echo("GET", "/v2/health/live", version="1.0"),), live=True),
    served("rfc9112-9.3-http-1.0-keep-alive", get(b"Connection: keep-alive", version=b"1.0"),
           echo("GET", "/v2/health/live", version="1.0")),
    served("rfc9110-2.5-http-1.2-as-1.1", get(version=b"1.2") + get(), LIVE_ECHO, LIVE_ECHO, live=True),
    served("rfc9110-2.5-http-1.9-as-1.1", get(version=b"1.9"), LIVE_ECHO, live=True),
    refused("rfc9110-15.6.6-http-2.0", get(version=b"2.0"), 505, "not supported", live=True),
    refused("rfc9110-15.6.6-http-3.0", get(version=b"3.0"), 505, "not supported"),
    refused("rfc9110-15.6.6-http-0.9", b"GET /v2/health/live\r\n\r\n", 505, "not supported"),
    refused("rfc9112-2.3-version-two-digits", get(version=b"1.10")),
    refused("rfc9112-2.3-version-no-minor", get(version=b"1")),
    refused("rfc9112-2.3-version-lower-case", b"GET /v2/health/live http/1.1\r\nHost: x\r\n\r\n"),
]  # fmt: skip

REQUEST_LINE = [
    served("rfc9112-2.2-empty-lines-before", b"\r\n\r\n" + get(), LIVE_ECHO, live=True),
    served("rfc9112-3-double-space", b"GET  /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", LIVE_ECHO),
    served("rfc9112-3.2.2-absolute-form", get(target=b"http://x/v2/health/live"), LIVE_ECHO, live=True),
    served("rfc9112-3.2.4-asterisk-form", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", echo("OPTIONS", "*")),
    served("rfc9112-3.2.1-query", get(target=b"/v2/health/live?x=1"), LIVE_ECHO),
    served("rfc3986-2.1-percent-encoded-path", get(target=b"/v2/health/%6Cive"), LIVE_ECHO, live=True),
    refused("rfc9112-3-tab-separator", b"GET\t/v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"),
    refused("rfc9112-3-trailing-space", b"GET /v2/health/live HTTP/1.1 \r\nHost: x\r\n\r\n"),
    refused("rfc9112-3-bare-lf", b"GET /v2/health/live HTTP/1.1\nHost: x\r\n\r\n", live=True, hypercorn=True),
    refused("rfc9110-9.1-method-case-sensitive", b"get /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
            message="unknown method"),
    refused("rfc9110-9.1-method-unknown", b"BREW /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
            message="unknown method"),
    refused("rfc9112-3.2-target-space", b"GET /v2/a b HTTP/1.1\r\nHost: x\r\n\r\n"),
    refused("rfc9112-3.2-target-control", get(target=b"/v2/\x01")),
    refused("rfc9112-3.2-target-non-ascii", get(target=b"/v2/\xe9")),
    refused("rfc9112-3.2-target-fragment", get(target=b"/v2/health/live#x"), message="fragment", live=True,
            hypercorn=True),
    refused("rfc9112-3-target-too-long", get(target=b"/" + b"a" * (MAX_TARGET_BYTES + 1)), 414, "too long",
            live=True, split=False),
    refused("rfc9110-9.3.6-connect", b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n", 405, "CONNECT"),
]  # fmt: skip

HOST = [
    refused("rfc9112-3.2-host-missing", get(host=False), 400, "missing Host", live=True, hypercorn=True),
    refused("rfc9112-3.2-host-twice", get(b"Host: y"), 400, "more than one Host", live=True, hypercorn=True),
    refused("rfc9112-3.2-host-twice-same", get(b"Host: x"), 400, "more than one Host"),
    refused("rfc9110-7.2-host-space", get(b"Host: a b", host=False), 400, "invalid Host", live=True, hypercorn=True),
    refused("rfc9110-7.2-host-slash", get(b"Host: a/b", host=False), 400, "invalid Host"),
    refused("rfc9110-7.2-host-userinfo", get(b"Host: u@a", host=False), 400, "invalid Host", live=True),
    refused("rfc9110-7.2-host-port-not-digits", get(b"Host: a:8o", host=False), 400, "invalid Host"),
    refused("rfc9110-7.2-host-bad-percent", get(b"Host: a%4", host=False), 400, "invalid Host"),
    refused("rfc9110-7.2-host-bad-ipv6", get(b"Host: [zz::1]", host=False), 400, "invalid Host"),
    refused("rfc9110-7.2-host-unclosed-bracket", get(b"Host: [::1", host=False), 400, "invalid Host"),
    refused("rfc9110-7.2-host-tab-inside", get(b"Host: a\tb", host=False), 400, "invalid Host"),
    served("rfc9110-7.2-host-with-port", get(b"Host: example.com:8000", host=False), LIVE_ECHO, live=True),
    served("rfc9110-7.2-host-ipv4", get(b"Host: 127.0.0.1", host=False), LIVE_ECHO),
    served("rfc9110-7.2-host-ipv6", get(b"Host: [::1]:8000", host=False), LIVE_ECHO, live=True),
    served("rfc9110-7.2-host-ipvfuture", get(b"Host: [v1.x]", host=False), LIVE_ECHO),
    served("rfc9110-7.2-host-sub-delims-and-percent", get(b"Host: a!$&'()*+,;=%41", host=False), LIVE_ECHO),
    served("rfc9110-7.2-host-empty", get(b"Host:", host=False), LIVE_ECHO),
    served("rfc9112-3.2-host-not-needed-in-http-1.0", get(b"Connection: keep-alive", version=b"1.0", host=False),
           echo("GET", "/v2/health/live", version="1.0")),
    served("rfc9112-3.2.2-absolute-form-other-host", get(target=b"http://other/v2/health/live"), LIVE_ECHO),
    served("rfc9112-3.2-host-checked-per-request", get() + get(b"Host: y:1", host=False), LIVE_ECHO, LIVE_ECHO),
    Case("rfc9112-3.2-host-bad-on-second-request", get() + get(b"Host: a b", host=False), (200, 400), True,
         message="invalid Host", live=True),
]  # fmt: skip

FIELDS = [
    refused("rfc9112-5.1-space-in-name", get(b"Bad Header: v")),
    refused("rfc9112-5.1-empty-name", get(b": v")),
    refused("rfc9112-5-no-colon", get(b"NoColon")),
    refused("rfc9112-2.2-whitespace-before-first-field", b"GET /v2/health/live HTTP/1.1\r\n Host: x\r\n\r\n"),
    refused("rfc9112-5.2-obs-fold", get(b"X-A: a", b" b"), live=True, hypercorn=True),
    refused("rfc9110-5.5-nul-in-value", get(b"X-A: a\x00b")),
    refused("rfc9110-5.5-cr-in-value", get(b"X-A: a\rb")),
    refused("rfc9110-5.5-del-in-value", get(b"X-A: a\x7fb")),
    refused("rfc9110-5.1-nul-in-name", get(b"X\x00A: b")),
    served("rfc9110-5.5-obs-text-in-value", get(b"X-A: caf\xe9"), LIVE_ECHO),
    served("rfc9110-5.5-empty-value", get(b"X-A:"), LIVE_ECHO),
    served("rfc9110-5.6.3-whitespace-around-value", get(b"X-A: \t v \t"), LIVE_ECHO),
    served("rfc9110-5.3-repeated-field", get(b"X-A: 1", b"X-A: 2"), LIVE_ECHO),
    served("rfc9110-10.1.1-expect-unknown-ignored", get(b"Expect: something"), LIVE_ECHO),
    refused("rfc9110-15.5.20-too-many-fields", get(*(b"X-%d: v" % i for i in range(MAX_HEADERS + 1))), 431,
            "too many request headers", live=True, split=False),
    refused("rfc9110-15.5.20-head-too-large", get(b"X-Big: " + b"a" * (80 << 10)), 431, "too large", live=True,
            split=False),
    Case("rfc9110-15.5.20-trailers-too-large", post(CHUNKED, body=b"2\r\n{}\r\n0\r\nX: " + b"a" * (100 << 10)),
         (431,), True, message="trailers too large", split=False),
]  # fmt: skip

CONNECTION = [
    Case("rfc9112-9.6-connection-close", get(b"Connection: close") + get(), (200,), True, bodies=(LIVE_ECHO,),
         live=True),
    served("rfc9112-9.3-persistent-by-default", get() + post(b"Content-Length: 2") + get(), LIVE_ECHO, INDEX_ECHO,
           LIVE_ECHO, live=True, hypercorn=True),
    served("rfc9112-9.3.2-pipelined-in-order", b"".join(get(target=b"/v2/health/live?n=%d" % i) for i in range(5)),
           *(LIVE_ECHO,) * 5, live=True),
    Case("rfc9112-9.3.2-pipelining-limit", get() * (MAX_PIPELINED + 3), (200,) * (MAX_PIPELINED + 1) + (503,), True,
         message="too many pipelined requests", split=False),
    Case("rfc9112-9.6-refusal-after-served", get() + get(b"Bad Header: v"), (200, 400), True, live=True,
         hypercorn=True),
    Case("rfc9110-7.8-upgrade-not-taken", get(b"Connection: Upgrade", b"Upgrade: websocket"), (200,), True,
         bodies=(LIVE_ECHO,)),
]  # fmt: skip

CASES = SMUGGLING + FRAMING + VERSIONS + REQUEST_LINE + HOST + FIELDS + CONNECTION
