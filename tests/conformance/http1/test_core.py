"""Every HTTP/1.1 conformance case (cases.py) against the sans-IO core (api/transport/http1.py),
fed in one read and one byte per read, with a handler that echoes what it was given; and the
rules that a table of requests does not show: Date, Expect: 100-continue, HEAD, replies in
parts, HTTP/1.0 framing, the hypercorn filter."""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass

import pytest

from seqserve.api.transport.http1 import (
    JSON_HEADERS,
    CloseAction,
    Exchange,
    Http1Connection,
    RequestStarted,
    error_body,
    error_reply,
)
from seqserve.api.transport.http1_filter import REFUSED_LINE, RequestFilter
from seqserve.api.transport.http1_rules import HTTP_DATE, valid_host
from tests.conformance.http1.cases import CASES, Case, get, post


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def parse_replies(data: bytes) -> list[Reply]:
    replies = []
    while data:
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        n = int(headers.get("content-length", "0"))
        replies.append(Reply(int(lines[0].split()[1]), headers, data[:n]))
        data = data[n:]
    return replies


class EchoServer:
    """Drives a core as http1_server does, with a handler that answers each request with
    ``METHOD path version|body`` once its body is whole."""

    def __init__(self) -> None:
        self.conn = Http1Connection()
        self.out = b""

    def feed(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self.serve()

    def serve(self) -> None:
        conn = self.conn
        while (ex := conn.running) is not None and not ex.finished:
            body = self.body(ex)
            if body is None:
                if not (ex.broken or ex.disconnected):
                    return  # the rest of its body has not come
                status, error = conn.refusal_of(ex, "no reply")
                conn.reply(ex, status, JSON_HEADERS, error_body(error))
            else:
                assert ex.head is not None
                head = ex.head
                conn.reply(ex, 200, [], f"{head.method} {head.path} {head.http_version}|".encode() + body)
            self.out += conn.data_to_send()
            conn.reply_done(ex)
            self.out += conn.data_to_send()
        self.out += conn.data_to_send()

    def body(self, ex: Exchange) -> bytes | None:
        """The whole body, or None while it is incomplete (or broken, or the client gone)."""
        if ex.head is None or not ex.complete:
            return None
        chunks = b""
        while True:
            got = self.conn.take_body(ex)
            assert not isinstance(got, bool), got
            chunks += got[0]
            if not got[1]:
                return chunks


def run(raw: bytes, pieces: int) -> tuple[list[Reply], bool]:
    server = EchoServer()
    for i in range(0, len(raw), pieces):
        if server.conn.close_action is not CloseAction.NONE and not server.conn.reading:
            break
        server.feed(raw[i : i + pieces])
    return parse_replies(server.out), server.conn.close_action is not CloseAction.NONE


def check(case: Case, replies: list[Reply], closed: bool) -> None:
    assert [r.status for r in replies] == list(case.statuses), [(r.status, r.body[:100]) for r in replies]
    assert closed == case.close
    if case.bodies is not None:
        assert [r.body for r in replies if r.status == 200] == list(case.bodies)
    if case.message:
        assert case.message in json.loads(replies[-1].body)["error"]
    for r in replies:
        assert "date" in r.headers  # RFC 9110 §6.6.1
        if r.status >= 400:
            assert r.headers["content-type"] == "application/json" and json.loads(r.body)["error"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_in_16k_reads(case: Case) -> None:
    check(case, *run(case.raw, 16 << 10))  # one read, but for the large heads


SPLIT = [c for c in CASES if c.split]


@pytest.mark.parametrize("case", SPLIT, ids=[c.id for c in SPLIT])
def test_case_one_byte_per_read(case: Case) -> None:
    check(case, *run(case.raw, 1))


def test_cases_name_their_section() -> None:
    assert len(CASES) >= 80
    assert len({c.id for c in CASES}) == len(CASES)
    assert all(c.id.startswith(("rfc9112-", "rfc9110-", "rfc3986-")) for c in CASES)


# ---------------------------------------------------------------------------------- Date


def test_rfc9110_6_6_1_date_is_imf_fixdate_and_now() -> None:
    replies, _ = run(get(), 1 << 20)
    date = replies[0].headers["date"]
    assert date.endswith(" GMT") and len(date) == 29
    assert abs(email.utils.parsedate_to_datetime(date).timestamp() - time.time()) < 5


def test_rfc9110_6_6_1_date_on_refusals_and_the_connection_cap() -> None:
    replies, _ = run(get(host=False), 1 << 20)
    assert replies[0].status == 400 and "date" in replies[0].headers
    assert b"\r\ndate: " in error_reply(503, "too many connections")


def test_rfc9110_6_6_1_date_is_formatted_once_per_second() -> None:
    first = HTTP_DATE.header()
    assert HTTP_DATE.header() is first or int(time.time()) != HTTP_DATE.second


# ---------------------------------------------------------------------------------- Expect, HEAD, parts


def start(conn: Http1Connection, raw: bytes) -> Exchange:
    (ex,) = [e.exchange for e in conn.receive_data(raw) if isinstance(e, RequestStarted)]
    return ex


def test_rfc9110_10_1_1_continue_sent_when_the_body_is_read() -> None:
    conn = Http1Connection()
    ex = start(conn, post(b"Content-Length: 2", b"Expect: 100-continue", body=b""))
    assert conn.data_to_send() == b""  # not before the handler reads
    assert conn.take_body(ex) is True
    assert conn.data_to_send() == b"HTTP/1.1 100 Continue\r\n\r\n"


def test_rfc9110_10_1_1_no_continue_when_replied_first() -> None:
    conn = Http1Connection()
    ex = start(conn, post(b"Content-Length: 2", b"Expect: 100-continue", body=b""))
    conn.reply(ex, 413, JSON_HEADERS, error_body("too large"))
    out = conn.data_to_send()
    assert out.startswith(b"HTTP/1.1 413") and b"100 Continue" not in out and b"connection: close" in out


def test_rfc9110_10_1_1_no_continue_for_http_1_0() -> None:
    conn = Http1Connection()
    ex = start(conn, post(b"Content-Length: 2", b"Expect: 100-continue", body=b"", version=b"1.0"))
    assert conn.take_body(ex) is True and conn.data_to_send() == b""


def test_rfc9110_9_3_2_head_has_the_length_and_no_body() -> None:
    conn = Http1Connection()
    ex = start(conn, b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.reply(ex, 200, [], b"12345")
    out = conn.data_to_send()
    assert out.endswith(b"content-length: 5\r\n\r\n")


def test_rfc9112_7_1_reply_in_parts_is_chunked() -> None:
    conn = Http1Connection()
    ex = start(conn, get())
    conn.reply(ex, 200, [], b"ab", end=False)
    conn.reply_body(ex, b"cd", end=True)
    out = conn.data_to_send()
    assert b"transfer-encoding: chunked\r\n" in out and out.endswith(b"2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")


def test_rfc9112_6_3_http_1_0_reply_in_parts_ends_with_the_close() -> None:
    conn = Http1Connection()
    ex = start(conn, get(version=b"1.0", host=False))
    conn.reply(ex, 200, [], b"ab", end=False)
    conn.reply_body(ex, b"cd", end=True)
    out = conn.data_to_send()
    assert b"transfer-encoding" not in out and b"connection: close" in out and out.endswith(b"abcd")


def test_rfc9110_2_5_reply_version_is_1_1_for_1_2() -> None:
    replies, _ = run(get(version=b"1.2"), 1 << 20)
    server = EchoServer()
    server.feed(get(version=b"1.2"))
    assert server.out.startswith(b"HTTP/1.1 200") and replies[0].status == 200


# ---------------------------------------------------------------------------------- the hypercorn filter


@pytest.mark.parametrize(
    ("host", "valid"),
    [(b"x", True), (b"[::1]", True), (b"[::1]:1", True), (b"a.b-c_d~e", True), (b"", True), (b":80", True),
     (b"a b", False), (b"[1::2::3]", False), (b"a:b", False), (b"\xe9", False), (b"a:1:2", False)],
)  # fmt: skip
def test_rfc9110_7_2_host_syntax(host: bytes, valid: bool) -> None:
    assert valid_host(host) is valid


SMUGGLED = [c for c in CASES if c.hypercorn and c.close]


@pytest.mark.parametrize("case", SMUGGLED, ids=[c.id for c in SMUGGLED])
def test_filter_hands_hypercorn_the_requests_before_a_refused_one(case: Case) -> None:
    checks = RequestFilter()
    passed = checks.feed(case.raw)
    assert checks.refused and passed.endswith(REFUSED_LINE)
    assert passed.count(b"HTTP/1.1\r\n") == len(case.statuses) - 1  # the good ones before, whole


def test_filter_passes_good_requests_in_any_split() -> None:
    raw = get() + post(b"Transfer-Encoding: chunked,", body=b"2\r\n{}\r\n0\r\n\r\n") + get()
    for step in (1, 3, 7, len(raw)):
        checks = RequestFilter()
        out = b"".join(checks.feed(raw[i : i + step]) for i in range(0, len(raw), step))
        assert out == raw and not checks.refused


def test_filter_refused_inside_a_read_after_a_partial_request_ends_the_stream() -> None:
    checks = RequestFilter()
    first = post(b"Content-Length: 4", body=b"{}")
    assert checks.feed(first) == first
    assert checks.feed(b"{}" + get(host=False)) == b""
    assert checks.refused and checks.feed(get()) == b""


@pytest.mark.parametrize("step", [1, 5, 100])
def test_filter_passes_http2_prior_knowledge(step: int) -> None:
    checks = RequestFilter()
    stream = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    out = b"".join(checks.feed(stream[i : i + step]) for i in range(0, len(stream), step))
    assert out == stream and checks.passing


def test_filter_checks_a_request_that_starts_like_the_preface() -> None:
    checks = RequestFilter()
    assert checks.feed(b"P") == b"P"
    assert checks.feed(b"OST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n") == b""
    assert checks.refused and not checks.passing


def test_filter_refuses_upgrades_other_than_h2c() -> None:
    checks = RequestFilter()
    assert checks.feed(get(b"Connection: Upgrade", b"Upgrade: websocket")) == REFUSED_LINE
    checks = RequestFilter()
    h2c = get(b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c", b"HTTP2-Settings: AAMAAABkAAQAAP__")
    assert checks.feed(h2c) == h2c and checks.feed(b"anything") == b"anything"
