"""seqserve's own HTTP/1.1 server (api/transport/http1_server.py) with small handlers and raw
sockets: framing, keep-alive, pipelining, Expect: 100-continue, HEAD, HTTP/1.0, and every
refusal and limit (head size, header count, malformed requests, connection cap, idle and header
timeouts, pipelined requests, shutdown). The connection's state machine without sockets:
tests/unit/test_http1.py; the seqserve routes on this server: the rest of tests/integration."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from seqserve.api.limits import HttpLimits
from seqserve.api.transport.exchange import HttpReply, HttpRequest
from seqserve.api.transport.http1 import MAX_HEADERS, MAX_PIPELINED
from seqserve.api.transport.http1_server import Http1Server


async def read_all(request: HttpRequest) -> bytes | None:
    """The request's body, or None when it ended early."""
    body = b""
    while True:
        got = await request.body.receive()
        if got is None:
            return None
        chunk, more = got
        body += chunk
        if not more:
            return body


async def echo(request: HttpRequest) -> HttpReply | None:
    """Replies with what it saw: method, path, query, body; ``/slow`` waits first, ``/raise``
    fails, ``/silent`` returns no reply."""
    path = request.path
    body = await read_all(request)
    if body is None:
        seen.append(("disconnect", path))
        return None
    if path == "/slow":
        await asyncio.sleep(0.2)
    if path == "/raise":
        raise RuntimeError("boom")
    if path == "/silent":
        return None
    doc = json.dumps({"method": request.method, "path": path, "query": request.query.decode(),
                      "body": body.decode("latin-1")}).encode()  # fmt: skip
    return HttpReply(200, [(b"content-type", b"application/json")], doc)


seen: list[tuple[str, str]] = []


async def start(app: Any = echo, **limits: Any) -> tuple[Http1Server, int, asyncio.Task[None]]:
    """A server on a free port, serving until stop(): (server, port, the task that serves)."""
    server = Http1Server(app, HttpLimits(**{"header_timeout_s": 5.0, **limits}))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    await server.start(sock)
    return server, sock.getsockname()[1], asyncio.create_task(server.serve())


@contextlib.asynccontextmanager
async def serving(app: Any = echo, **limits: Any) -> AsyncIterator[tuple[Http1Server, int]]:
    server, port, task = await start(app, **limits)
    try:
        yield server, port
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)


async def read_reply(r: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One reply: status, headers (lower-case names), body (de-chunked)."""
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" in headers:
        body = await r.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await r.readuntil(b"\r\n")).strip(), 16)
            chunk = await r.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    else:
        body = b""
    return status, headers, body


def request(method: str, path: str, body: bytes = b"", *extra: str, version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: x", *extra]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def closed(r: asyncio.StreamReader, timeout: float = 5) -> bool:
    try:
        return await asyncio.wait_for(r.read(), timeout) == b""
    except (ConnectionError, asyncio.TimeoutError):
        return False


async def test_keep_alive_and_framing() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/a%20b?x=1", b"hello"))
        status, headers, body = await read_reply(r)
        assert status == 200 and headers["content-type"] == "application/json"
        assert json.loads(body) == {"method": "POST", "path": "/a b", "query": "x=1", "body": "hello"}
        # a chunked request body (chunked replies: tests/unit/test_http1.py)
        w.write(
            b"POST /parts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        status, headers, body = await read_reply(r)
        assert status == 200 and headers["content-length"] == str(len(body))
        assert json.loads(body)["body"] == "abcde"
        # HEAD: the head of the reply, with its length, and no body
        w.write(request("HEAD", "/h"))
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200") and b"content-length:" in head
        w.write(request("GET", "/after-head"))
        status, _, body = await read_reply(r)
        assert status == 200 and json.loads(body)["path"] == "/after-head"
        w.close()


async def test_rfc_rules_over_the_socket() -> None:
    """RFC 9112 / 9110 rules on the asyncio side too (every case: tests/conformance/http1): a
    Date on replies, HTTP/1.2 served as 1.1, a ``chunked,`` body arriving in pieces (the parser
    that takes over sees every piece), a large body so framed (reading pauses and resumes), and
    a request without Host refused after the ones before it."""
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /v HTTP/1.2\r\nHost: x\r\n\r\n")
        status, headers, body = await read_reply(r)
        assert status == 200 and headers["date"].endswith(" GMT") and json.loads(body)["path"] == "/v"
        raw = b"POST /comma HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked,\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        for i in range(0, len(raw), 7):
            w.write(raw[i : i + 7])
            await w.drain()
            await asyncio.sleep(0.001)
        status, _, body = await read_reply(r)
        assert status == 200 and json.loads(body)["body"] == "abcde"
        big = b"x" * (3 << 20)
        w.write(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: , chunked\r\n\r\n")
        w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(big), big))
        status, _, body = await read_reply(r)
        assert status == 200 and len(json.loads(body)["body"]) == len(big)
        w.write(request("GET", "/ok") + b"GET /nohost HTTP/1.1\r\n\r\n")
        assert (await read_reply(r))[0] == 200
        status, headers, body = await read_reply(r)
        assert status == 400 and "missing Host" in json.loads(body)["error"] and "date" in headers
        assert await closed(r)


async def test_http_1_0_closes_unless_kept_alive() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("GET", "/k", b"", "Connection: keep-alive", version="1.0"))
        status, headers, _ = await read_reply(r)
        assert status == 200 and headers["connection"] == "keep-alive"
        w.write(request("GET", "/c", version="1.0"))
        status, headers, _ = await read_reply(r)
        assert status == 200 and headers["connection"] == "close"
        assert await closed(r)


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/slow", b"1") + request("POST", "/fast", b"2") + request("GET", "/x"))
        paths = [json.loads((await read_reply(r))[2])["path"] for _ in range(3)]
        assert paths == ["/slow", "/fast", "/x"]
        w.close()


async def test_too_many_pipelined_requests_get_503_then_close() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/slow", b"0") + b"".join(request("GET", f"/{i}") for i in range(MAX_PIPELINED + 5)))
        statuses = [(await read_reply(r))[0] for _ in range(MAX_PIPELINED + 2)]
        assert statuses == [200] * (MAX_PIPELINED + 1) + [503]
        assert await closed(r)


async def test_expect_100_continue() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.write(b"body")
        status, _, body = await read_reply(r)
        assert status == 200 and json.loads(body)["body"] == "body"
        w.close()


@pytest.mark.parametrize(
    ("raw", "status", "error"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (80 << 10) + b"\r\n\r\n", 431, "request head too large"),
        (b"GET /" + b"a" * (80 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "request target too long"),
        (request("GET", "/", b"", *(f"X-{i}: v" for i in range(MAX_HEADERS + 1))), 431, "too many request headers"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "malformed HTTP request"),
        (b"\x16\x03\x01 not http\r\n\r\n", 400, "malformed HTTP request"),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "malformed"),
        # an endless trailer: httptools would hold it whole before any callback
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nX-T: "
            + b"a" * (80 << 10),
            431,
            "framing or trailers too large",
        ),
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
async def test_refusals_are_json_and_close(raw: bytes, status: int, error: str) -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        for i in range(0, len(raw), 16 << 10):  # a large head arrives in several reads
            w.write(raw[i : i + (16 << 10)])
            await w.drain()
            await asyncio.sleep(0.01)
        got, headers, body = await read_reply(r)
        assert got == status and error in json.loads(body)["error"]
        assert headers["content-type"] == "application/json" and headers["connection"] == "close"
        assert await closed(r)


async def test_a_refusal_waits_for_the_reply_before_it() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/slow", b"x") + b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")
        assert (await read_reply(r))[0] == 200
        assert (await read_reply(r))[0] == 400
        assert await closed(r)


async def test_malformed_chunks_end_the_body_as_a_disconnect() -> None:
    seen.clear()
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
        # the app saw its body end early and sent no reply: the server answers for it and closes
        status, _, body = await read_reply(r)
        assert status == 400 and "malformed" in json.loads(body)["error"] and seen == [("disconnect", "/chunks")]
        assert await closed(r)


async def test_app_errors_get_500() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("GET", "/raise"))
        status, _, body = await read_reply(r)
        assert status == 500 and json.loads(body)["error"]
        w.write(request("GET", "/silent"))
        status, _, body = await read_reply(r)
        assert status == 500 and "no reply" in json.loads(body)["error"]
        w.write(request("GET", "/fine"))  # the connection still serves
        assert (await read_reply(r))[0] == 200
        w.close()


async def test_connection_cap_answers_503() -> None:
    async with serving(max_connections=2) as (server, port):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.05)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        status, _, body = await read_reply(r)
        assert status == 503 and "too many connections" in json.loads(body)["error"]
        assert await closed(r)
        held[0][1].close()
        await asyncio.sleep(0.1)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("GET", "/back"))
        assert (await read_reply(r))[0] == 200
        assert len(server.connections) == 2


async def test_idle_and_slow_header_connections_close() -> None:
    async with serving(header_timeout_s=0.3, keepalive_s=5) as (_, port):
        r1, _w1 = await asyncio.open_connection("127.0.0.1", port)  # sends nothing
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)
        w2.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        r3, w3 = await asyncio.open_connection("127.0.0.1", port)
        w3.write(request("GET", "/once"))
        assert (await read_reply(r3))[0] == 200  # then idle
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await closed(r1, 3) and await closed(r2, 3) and await closed(r3, 3)
        assert loop.time() - t0 < 1.5


async def test_keepalive_off_closes_after_each_reply() -> None:
    async with serving(keepalive_s=0) as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("GET", "/one"))
        status, headers, _ = await read_reply(r)
        assert status == 200 and headers["connection"] == "close"
        assert await closed(r)


async def test_upgrade_is_not_taken() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("GET", "/u", b"", "Connection: Upgrade", "Upgrade: h2c") + b"PRI * HTTP/2.0\r\n\r\n")
        status, headers, body = await read_reply(r)
        assert status == 200 and json.loads(body)["path"] == "/u" and headers["connection"] == "close"
        assert await closed(r)


async def test_large_body_with_flow_control() -> None:
    big = bytes(range(256)) * (12 << 10)  # 3 MiB, past the read-pause mark

    async def length(request: HttpRequest) -> HttpReply:
        n = 0
        while True:
            got = await request.body.receive()
            assert got is not None
            n += len(got[0])
            await asyncio.sleep(0)  # a slow reader
            if not got[1]:
                break
        return HttpReply(200, [], str(n).encode())

    async with serving(length) as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/big", big))
        status, _, body = await read_reply(r)
        assert status == 200 and int(body) == len(big)
        w.close()


async def test_stop_answers_in_flight_requests_then_closes() -> None:
    server, port, task = await start(header_timeout_s=10.0)
    r_idle, _ = await asyncio.open_connection("127.0.0.1", port)
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(request("POST", "/slow", b"x"))
    await asyncio.sleep(0.05)
    server.stop()
    status, headers, _ = await read_reply(r)
    assert status == 200 and headers["connection"] == "close"
    assert await closed(r) and await closed(r_idle)
    await asyncio.wait_for(task, 5)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_client_disconnect_reaches_the_app() -> None:
    seen.clear()
    async with serving() as (_, port):
        _r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /gone HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npart")
        await w.drain()
        await asyncio.sleep(0.1)
        w.close()
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == [("disconnect", "/gone")]


async def test_a_reply_before_the_body_is_read_survives_the_close() -> None:
    """The app answers without reading a large body: the server ends its side and drops what
    still comes, so the client reads the reply (a plain close would reset the connection)."""

    async def refuse(request: HttpRequest) -> HttpReply:
        return HttpReply(413, [], b'{"error": "too large"}', close=True)

    async with serving(refuse) as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/big", b"x" * (8 << 20)))  # more than the socket buffers hold
        status, headers, body = await read_reply(r)
        assert status == 413 and headers["connection"] == "close" and json.loads(body)["error"]
        w.close()


async def test_a_half_closed_client_is_gone() -> None:
    """EOF is a disconnect: the app waiting on a request sees it (and seqserve cancels the
    request), as a client that closed its socket would want."""
    seen.clear()

    async def waits(request: HttpRequest) -> None:
        await request.body.receive()  # the body
        await asyncio.wait_for(request.body.wait_disconnect(), 5)  # then nothing until the client leaves
        seen.append(("http.disconnect", request.path))

    async with serving(waits) as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/wait", b"x"))
        await asyncio.sleep(0.05)
        w.write_eof()
        assert await closed(r)
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.02)
        assert seen == [("http.disconnect", "/wait")]


async def test_upgrade_with_a_body_gets_its_body() -> None:
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /u HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n")
        w.write(b"HTTP2-Settings: x\r\nContent-Length: 5\r\n\r\nhel")
        await w.drain()
        await asyncio.sleep(0.05)
        w.write(b"lo")
        status, headers, body = await read_reply(r)
        assert status == 200 and json.loads(body)["body"] == "hello" and headers["connection"] == "close"
        assert await closed(r)


async def test_pipelined_head_split_after_a_large_body() -> None:
    """The read that ends a large body and begins the next head counts only the head's bytes."""
    async with serving() as (_, port):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(request("POST", "/a", b"x" * (200 << 10)) + b"GET /b HTTP/1.1\r\n")
        await w.drain()
        await asyncio.sleep(0.1)
        w.write(b"Host: x\r\n\r\n")
        paths = [json.loads((await read_reply(r))[2])["path"] for _ in range(2)]
        assert paths == ["/a", "/b"]
        w.close()


async def test_a_client_that_does_not_read_its_reply_is_cut_off() -> None:
    """The write buffer full for the body timeout: the connection closes (no held slot)."""
    big = b"x" * (16 << 20)

    async def large(request: HttpRequest) -> HttpReply:
        await request.body.receive()
        return HttpReply(200, [], big)

    async with serving(large, body_timeout_s=0.4) as (server, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request("GET", "/large"))  # and never reads
        for _ in range(100):
            await asyncio.sleep(0.05)
            if not server.connections:
                break
        assert not server.connections
        sock.close()
