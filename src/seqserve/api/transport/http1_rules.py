"""The rules of RFC 9112 and RFC 9110 that a request head must pass beyond what llhttp
(httptools) checks, where llhttp is laxer than the spec (Host, Transfer-Encoding on HTTP/1.0) or
stricter (HTTP/1.x minor versions, empty elements in the Transfer-Encoding list). Shared by the
builtin server's core (``http1``) and the filter in front of hypercorn (``http1_filter``), so
both servers refuse the same requests; without I/O.

llhttp runs with two leniencies, each taken back here: ``lenient_version`` (any ``d.d``
version reaches ``request_version``) and ``lenient_transfer_encoding`` (any Transfer-Encoding
reaches ``check_transfer_encoding``). Every other llhttp check stays on: both Content-Length
and Transfer-Encoding, duplicate or malformed Content-Length, obs-fold, bare LF, whitespace
before a colon, control characters, malformed chunks.
"""

from __future__ import annotations

import ipaddress
import re
import time
from email.utils import formatdate
from typing import Any

import httptools


class Refused(Exception):
    """A request the connection answers itself (status, error message) and then closes on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def new_parser(protocol: Any) -> httptools.HttpRequestParser:
    """An llhttp request parser calling ``protocol``, with the two leniencies this module takes
    back (see the module docstring)."""
    parser = httptools.HttpRequestParser(protocol)
    parser.set_dangerous_leniencies(lenient_version=True, lenient_transfer_encoding=True)
    return parser


def request_version(version: str) -> str:
    """The version a request is served as: HTTP/1.x with x >= 1 as 1.1 (RFC 9110 §2.5: a
    recipient treats a higher minor version as the highest it speaks), 1.0 as 1.0; any other
    major version (and HTTP/0.9, a request line without one) is refused with 505."""
    if version == "1.1" or version == "1.0":
        return version
    major, _, minor = version.partition(".")
    if major == "1" and minor.isdigit():
        return "1.1"
    raise Refused(505, f"HTTP version {version[:8]} not supported: this server speaks HTTP/1.1")


# RFC 9110 §7.2: Host = uri-host [ ":" port ]; uri-host is RFC 3986's IP-literal, IPv4address or
# reg-name (unreserved, pct-encoded, sub-delims; possibly empty), port is *DIGIT.
HOST_VALUE = re.compile(rb"(?:\[([0-9A-Za-z:.%~_-]+)\]|(?:[A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*)(?::[0-9]*)?")
IPV_FUTURE = re.compile(rb"v[0-9A-Fa-f]+\.[A-Za-z0-9._~!$&'()*+,;=:-]+")


def valid_host(value: bytes) -> bool:
    """Whether ``value`` (a Host field value, OWS already stripped) is RFC 9110 §7.2 syntax."""
    match = HOST_VALUE.fullmatch(value)
    if match is None:
        return False
    literal = match.group(1)
    if literal is None:
        return True
    if IPV_FUTURE.fullmatch(literal):
        return True
    try:
        ipaddress.IPv6Address(literal.decode("ascii"))
    except ValueError:
        return False
    return True


def check_host(hosts: list[bytes], version: str) -> None:
    """RFC 9112 §3.2: an HTTP/1.1 request without Host, any request with more than one, or with
    an invalid value, is refused with 400."""
    if len(hosts) != 1:
        if hosts:
            raise Refused(400, "more than one Host header (RFC 9112 §3.2)")
        if version != "1.0":
            raise Refused(400, "missing Host header: HTTP/1.1 requests must send one (RFC 9112 §3.2)")
        return
    if not valid_host(hosts[0].strip(b" \t")):
        raise Refused(400, "invalid Host header value (RFC 9110 §7.2)")


TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def check_transfer_encoding(values: list[bytes], version: str, has_length: bool) -> None:
    """The Transfer-Encoding field lines of a request, as a list (RFC 9110 §5.6.1: empty elements
    are ignored, names are case-insensitive): served when it is exactly ``chunked``. Refused with
    400 on HTTP/1.0 (RFC 9112 §6.1: faulty framing), with a Content-Length (§6.1, and the
    request-smuggling shapes), when chunked is not last or applied twice (§6.3, §6.1), or when an
    element is not a token; with 501 when it names another coding (§6.1)."""
    if version == "1.0":
        raise Refused(400, "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)")
    if has_length:
        raise Refused(400, "both Content-Length and Transfer-Encoding (RFC 9112 §6.1)")
    codings = [element.strip(b" \t").lower() for value in values for element in value.split(b",")]
    codings = [c for c in codings if c]
    if codings == [b"chunked"]:
        return
    if not codings or any(TOKEN.fullmatch(c) is None for c in codings):
        raise Refused(400, "malformed Transfer-Encoding (RFC 9112 §6.1)")
    if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
        raise Refused(400, "Transfer-Encoding must end with one chunked (RFC 9112 §6.3)")
    raise Refused(501, "a Transfer-Encoding other than chunked is not supported")


class ChunkProbe:
    """Counts the messages a parser completes (``llhttp_frames_chunked``)."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = 0

    def on_message_complete(self) -> None:
        self.complete += 1


def llhttp_frames_chunked(values: list[bytes]) -> bool:
    """Whether llhttp reads the body of a request with these Transfer-Encoding values as chunked;
    under ``lenient_transfer_encoding`` it reads one whose list ends in an empty element
    (``chunked,``) to the end of the connection instead."""
    if len(values) == 1 and values[0].lower() == b"chunked":
        return True  # the usual spelling, without a probe (llhttp reads "chunked \t" otherwise)
    probe = ChunkProbe()
    parser = new_parser(probe)
    head = b"".join(b"transfer-encoding: %s\r\n" % v for v in values)
    try:
        parser.feed_data(b"POST / HTTP/1.1\r\nhost: x\r\n" + head + b"\r\n0\r\n\r\n")
    except httptools.HttpParserError:
        return False
    return probe.complete == 1


#: what a parser taking over inside a request's body is primed with (``primed_parser``)
CHUNKED_HEAD = b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"


class ParserPrimer:
    """The callbacks of a parser that takes over inside a request's body: dropped while it reads
    the head it is primed with, ``target``'s once ``primed``."""

    __slots__ = ("primed", "target")

    def __init__(self, target: Any) -> None:
        self.target = target
        self.primed = False

    def on_message_begin(self) -> None:
        if self.primed:
            self.target.on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self.primed:
            self.target.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.primed:
            self.target.on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.primed:
            self.target.on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self.target.on_body(body)

    def on_message_complete(self) -> None:
        self.target.on_message_complete()


def primed_parser(target: Any) -> httptools.HttpRequestParser:
    """A parser for ``target`` (a connection whose parser read a request's head but took its
    chunked body for one that runs to the end of the connection: ``llhttp_frames_chunked``), in
    the state of having read a chunked head: it reads the body, and the requests after it."""
    primer = ParserPrimer(target)
    parser = new_parser(primer)
    parser.feed_data(CHUNKED_HEAD)
    primer.primed = True
    return parser


class HttpDate:
    """The Date header line of a reply (RFC 9110 §6.6.1: an origin server with a clock sends
    one), formatted once per second rather than per reply."""

    __slots__ = ("line", "second")

    def __init__(self) -> None:
        self.second = -1
        self.line = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.line = b"date: %s\r\n" % formatdate(now, usegmt=True).encode("ascii")
        return self.line


#: the one clock every connection of the process shares
HTTP_DATE = HttpDate()
