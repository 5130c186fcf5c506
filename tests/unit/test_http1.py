"""The HTTP/1.1 connection's state machine (api/transport/http1.py) without sockets: bytes in,
events and bytes out. Framing both ways, keep-alive, pipelining, Expect: 100-continue, HEAD,
HTTP/1.0, upgrades, flow control and every refusal with its status and message. The same over
real sockets, with timers and the connection cap: tests/integration/test_http1_server.py."""

from __future__ import annotations

import json

import pytest

from seqserve.api.transport.http1 import (
    BODY_HIGH_WATER,
    MAX_HEADERS,
    MAX_PIPELINED,
    BodyChanged,
    CloseAction,
    Exchange,
    Http1Connection,
    RequestStarted,
)


def request(method: str, path: str, body: bytes = b"", *extra: str, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: x", *extra]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def started(events: list[RequestStarted | BodyChanged]) -> list[Exchange]:
    return [e.exchange for e in events if isinstance(e, RequestStarted)]


def body_of(conn: Http1Connection, ex: Exchange) -> bytes:
    out = b""
    while True:
        got = conn.take_body(ex)
        assert not isinstance(got, bool), got
        out += got[0]
        if not got[1]:
            return out


def parse_reply(data: bytes) -> tuple[int, dict[str, str], bytes, bytes]:
    """(status, headers, body, the bytes after it) of the first reply in ``data``."""
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "content-length" in headers:
        n = int(headers["content-length"])
        return int(lines[0].split()[1]), headers, rest[:n], rest[n:]
    body = b""
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            body, rest = body + rest[:size], rest[size + 2 :]
            if size == 0:
                break
        return int(lines[0].split()[1]), headers, body, rest
    return int(lines[0].split()[1]), headers, rest, b""


def answer(conn: Http1Connection, ex: Exchange, body: bytes = b"ok") -> list[RequestStarted | BodyChanged]:
    conn.reply(ex, 200, [(b"content-type", b"text/plain")], body)
    return conn.reply_done(ex)


def test_a_request_and_its_reply() -> None:
    conn = Http1Connection()
    assert conn.idle
    events = conn.receive_data(request("POST", "/a%20b?x=1", b"hello"))
    (ex,) = started(events)
    assert ex.head is not None and (ex.head.method, ex.head.path, ex.head.query) == ("POST", "/a b", b"x=1")
    assert (b"host", b"x") in ex.head.headers and ex.head.http_version == "1.1"
    assert any(isinstance(e, BodyChanged) for e in events) and body_of(conn, ex) == b"hello"
    assert not conn.idle
    assert answer(conn, ex) == []
    status_line, date, rest = conn.data_to_send().split(b"\r\n", 2)
    assert status_line == b"HTTP/1.1 200 OK" and date.startswith(b"date: ") and date.endswith(b" GMT")
    assert rest == b"content-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
    assert conn.idle and conn.close_action is CloseAction.NONE


def test_keep_alive_then_the_next_request() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("GET", "/one")))
    answer(conn, ex)
    conn.data_to_send()
    (ex2,) = started(conn.receive_data(request("GET", "/two")))
    assert ex2.head is not None and ex2.head.path == "/two"


def test_chunked_request_body() -> None:
    conn = Http1Connection()
    (ex,) = started(
        conn.receive_data(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n")
    )
    assert conn.take_body(ex) == (b"abcde", True)
    assert conn.take_body(ex) is True  # wait for more
    conn.receive_data(b"0\r\n\r\n")
    assert conn.take_body(ex) == (b"", False)


def test_a_reply_in_parts_is_chunked() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("GET", "/parts")))
    conn.reply(ex, 200, [(b"x-kind", b"parts")], b"abc", end=False)
    conn.reply_body(ex, b"de", end=True)
    status, headers, body, rest = parse_reply(conn.data_to_send())
    assert status == 200 and headers["transfer-encoding"] == "chunked" and headers["x-kind"] == "parts"
    assert body == b"abcde" and rest == b""


def test_http_1_0() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("GET", "/k", b"", "Connection: keep-alive", version="1.0")))
    answer(conn, ex)
    assert parse_reply(conn.data_to_send())[1]["connection"] == "keep-alive"
    (ex,) = started(conn.receive_data(request("GET", "/c", version="1.0")))
    answer(conn, ex)
    assert parse_reply(conn.data_to_send())[1]["connection"] == "close"
    assert conn.close_action is CloseAction.CLOSE


def test_http_1_0_reply_in_parts_ends_with_the_close() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("GET", "/p", b"", "Connection: keep-alive", version="1.0")))
    conn.reply(ex, 200, [], b"ab", end=False)
    conn.reply_body(ex, b"cd", end=True)
    conn.reply_done(ex)
    out = conn.data_to_send().lower()
    assert b"transfer-encoding" not in out and b"connection: close" in out and out.endswith(b"\r\n\r\nabcd")
    assert conn.close_action is CloseAction.CLOSE


def test_head_has_the_length_and_no_body() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("HEAD", "/h")))
    answer(conn, ex, b"12345")
    assert conn.data_to_send().endswith(b" GMT\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\n")


def test_pipelined_requests_wait_their_turn() -> None:
    conn = Http1Connection()
    (first,) = started(
        conn.receive_data(request("POST", "/1", b"a") + request("POST", "/2", b"b") + request("GET", "/3"))
    )
    assert len(conn.waiting) == 2 and not conn.reading  # reading pauses while requests wait
    order = []
    ex: Exchange | None = first
    while ex is not None:
        assert ex.head is not None
        order.append(ex.head.path)
        nxt = started(answer(conn, ex))
        ex = nxt[0] if nxt else None
    assert order == ["/1", "/2", "/3"] and conn.reading
    assert conn.data_to_send().count(b"HTTP/1.1 200 OK") == 3


def test_too_many_pipelined_requests_get_503_then_close() -> None:
    conn = Http1Connection()
    data = request("POST", "/slow", b"0") + b"".join(request("GET", f"/{i}") for i in range(MAX_PIPELINED + 5))
    (ex,) = started(conn.receive_data(data))
    statuses = []
    while True:
        nxt = started(answer(conn, ex))
        out = conn.data_to_send()
        while out:
            status, _, body, out = parse_reply(out)
            statuses.append((status, json.loads(body)["error"] if status != 200 else ""))
        if not nxt:
            break
        ex = nxt[0]
    assert [s for s, _ in statuses] == [200] * (MAX_PIPELINED + 1) + [503]
    assert "too many pipelined requests" in statuses[-1][1]
    assert conn.close_action is CloseAction.LINGER


def test_expect_100_continue() -> None:
    conn = Http1Connection()
    (ex,) = started(
        conn.receive_data(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    )
    assert conn.data_to_send() == b""  # asked for only when the handler reads the body
    assert conn.take_body(ex) is True
    assert conn.data_to_send() == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.receive_data(b"body")
    assert conn.take_body(ex) == (b"body", False)


def test_reply_before_the_body_closes_and_lingers() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nxx"))
    conn.reply(ex, 413, [], b"{}")
    conn.reply_done(ex)
    assert parse_reply(conn.data_to_send())[1]["connection"] == "close"
    assert conn.close_action is CloseAction.LINGER and conn.reading


@pytest.mark.parametrize(
    ("raw", "status", "error"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (80 << 10) + b"\r\n\r\n", 431, "request head too large"),
        (b"GET /" + b"a" * (80 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "request target too long"),
        (request("GET", "/", b"", *(f"X-{i}: v" for i in range(MAX_HEADERS + 1))), 431, "too many request headers"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "malformed HTTP request"),
        (b"\x16\x03\x01 not http\r\n\r\n", 400, "malformed HTTP request"),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "malformed"),
        (b"BREW / HTTP/1.1\r\n\r\n", 400, "unknown method"),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTP version 2.0 not supported"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501, "Transfer-Encoding"),
        (b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n", 405, "CONNECT"),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            "Upgrade",
        ),
    ],
)
def test_refusals_are_json_and_close(raw: bytes, status: int, error: str) -> None:
    conn = Http1Connection()
    for i in range(0, len(raw), 16 << 10):  # a large head arrives in several reads
        assert started(conn.receive_data(raw[i : i + (16 << 10)])) == []
        if conn.close_action is not CloseAction.NONE:
            break
    got, headers, body, _ = parse_reply(conn.data_to_send())
    assert got == status and error in json.loads(body)["error"]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert conn.close_action is not CloseAction.NONE


def test_endless_trailers_are_refused() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n"))
    for _ in range(6):
        conn.receive_data(b"0\r\nX-T: " + b"a" * (16 << 10) if not ex.broken else b"a" * (16 << 10))
    assert ex.broken and ex.refused is not None and ex.refused.status == 431
    assert "framing or trailers too large" in ex.refused.message


def test_a_refusal_waits_for_the_reply_before_it() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("POST", "/slow", b"x") + b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"))
    assert conn.data_to_send() == b""
    answer(conn, ex)
    out = conn.data_to_send()
    first, _, _, rest = parse_reply(out)
    assert first == 200 and parse_reply(rest)[0] == 400
    assert conn.close_action is CloseAction.LINGER


def test_malformed_chunks_end_the_body() -> None:
    conn = Http1Connection()
    events = conn.receive_data(
        b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    )
    (ex,) = started(events)
    assert conn.take_body(ex) is False and ex.broken  # the handler sees its body end early
    assert conn.refusal_of(ex, "no reply")[0] == 400  # the answer when the handler gives none


def test_a_lost_connection_ends_its_exchanges() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(b"POST /gone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npart"))
    assert conn.take_body(ex) == (b"part", True)
    assert conn.connection_lost() == [ex]
    assert conn.take_body(ex) is False and not conn.idle


def test_upgrade_is_not_taken_and_its_body_is_read() -> None:
    conn = Http1Connection()
    head = b"POST /u HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    (ex,) = started(conn.receive_data(head + b"HTTP2-Settings: x\r\nContent-Length: 5\r\n\r\nhel"))
    conn.receive_data(b"lo")
    assert body_of(conn, ex) == b"hello"
    answer(conn, ex)
    assert parse_reply(conn.data_to_send())[1]["connection"] == "close"
    assert conn.receive_data(b"PRI * HTTP/2.0\r\n\r\n") == []


def test_a_large_body_pauses_reading_until_taken() -> None:
    conn = Http1Connection()
    big = b"x" * (BODY_HIGH_WATER + 10)
    (ex,) = started(conn.receive_data(request("POST", "/big", big + b"more")[: -len(b"more")]))
    assert not conn.reading
    assert conn.take_body(ex) == (big, True)
    assert conn.reading


def test_a_head_split_after_a_large_body_counts_only_its_bytes() -> None:
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("POST", "/a", b"x" * (200 << 10)) + b"GET /b HTTP/1.1\r\n"))
    conn.receive_data(b"Host: x\r\n\r\n")
    assert len(conn.waiting) == 1 and conn.close_action is CloseAction.NONE
    (nxt,) = started(answer(conn, ex))
    assert nxt.head is not None and nxt.head.path == "/b"


def test_keep_alive_off_and_stopping() -> None:
    conn = Http1Connection(keep_alive=False)
    (ex,) = started(conn.receive_data(request("GET", "/one")))
    answer(conn, ex)
    assert parse_reply(conn.data_to_send())[1]["connection"] == "close"
    conn = Http1Connection()
    assert conn.close_when_idle()  # nothing running: it can close now
    conn = Http1Connection()
    (ex,) = started(conn.receive_data(request("GET", "/one")))
    conn.stopping = True
    assert not conn.close_when_idle()
    answer(conn, ex)
    assert parse_reply(conn.data_to_send())[1]["connection"] == "close"
