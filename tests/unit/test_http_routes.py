"""api/http: the routes as handlers, without a server: routing answers (404, 405, the trailing
slash's 307, HEAD), the one status table, and the ASGI adapter hypercorn and granian use."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from seqserve.api.http.body import BodyTimeout, ClientGone
from seqserve.api.http.routes import HttpFrontend, close_when_exiting
from seqserve.api.http.status import reply_for
from seqserve.api.limits import TooLarge
from seqserve.api.transport.asgi import asgi_app
from seqserve.api.transport.exchange import HttpReply, HttpRequest
from seqserve.engine import Code, InferenceError, SessionGoneError


class _Body:
    async def receive(self) -> tuple[bytes, bool] | None:
        return b"", False

    async def wait_disconnect(self) -> None:
        await asyncio.sleep(3600)


class _Server:
    exiting = False

    def is_live(self) -> bool:
        return True

    def is_model_ready(self, model: str, version: Any) -> bool:
        return model == "m" and version in ("", 3)


def _request(method: str, path: str, *headers: tuple[bytes, bytes], query: bytes = b"") -> HttpRequest:
    return HttpRequest(method, path, query, list(headers), _Body(), server=("127.0.0.1", 8000))


def _serve(method: str, path: str, *headers: tuple[bytes, bytes], query: bytes = b"") -> HttpReply:
    frontend = HttpFrontend(_Server())  # type: ignore[arg-type]
    reply = asyncio.run(frontend.handle(_request(method, path, *headers, query=query)))
    assert reply is not None
    return reply


def test_routing_answers() -> None:
    live = _serve("GET", "/v2/health/live")
    assert (live.status, live.headers, live.body) == (200, [(b"content-type", b"text/plain; charset=utf-8")], b"")
    assert _serve("HEAD", "/v2/health/live").status == 200  # HEAD wherever GET is served
    assert _serve("GET", "/v2/models/m/versions/3/ready").status == 200  # {version:int} as an int
    assert _serve("GET", "/v2/models/m/versions/4/ready").status == 400
    missing = _serve("GET", "/v2/nothing")
    assert missing.status == 404 and orjson.loads(missing.body) == {"error": "Not Found"}
    wrong = _serve("POST", "/v2/health/live")
    assert wrong.status == 405 and orjson.loads(wrong.body) == {"error": "Method Not Allowed"}
    assert _serve("GET", "/v2/models/m/infer").status == 405  # infer is POST only
    redirect = _serve("GET", "/v2/health/live/", (b"host", b"h:1"), query=b"a=1")
    assert redirect.status == 307 and redirect.headers == [(b"location", b"http://h:1/v2/health/live?a=1")]
    assert _serve("GET", "/v2/health/live/").headers == [(b"location", b"http://127.0.0.1:8000/v2/health/live")]
    for kind in ("cuda", "system"):
        no_body = _serve("POST", f"/v2/{kind}sharedmemory/region/r/register")  # no JSON: a 400
        assert no_body.status == 400 and "failed to parse the request JSON" in orjson.loads(no_body.body)["error"]


@pytest.mark.parametrize(
    ("error", "status", "close", "extra"),
    [
        (InferenceError(Code.NOT_FOUND, "no such model"), 404, False, []),
        (InferenceError(Code.UNAVAILABLE, "full", retry_after_s=0.2), 503, False, [(b"retry-after", b"1")]),
        (
            InferenceError(Code.UNSUPPORTED, "Unsupported compression type"),
            415,
            False,
            [(b"accept-encoding", b"gzip, deflate")],
        ),
        (SessionGoneError("the session ended"), 410, False, []),
        (TooLarge(10, 5), 413, True, []),
        (BodyTimeout(1.0), 408, True, []),
        (ClientGone(), 400, True, []),
    ],
)
def test_one_status_table(error: Exception, status: int, close: bool, extra: list[tuple[bytes, bytes]]) -> None:
    reply = reply_for(error, "test")
    assert (reply.status, reply.close) == (status, close)
    assert reply.headers == [(b"content-type", b"application/json"), *extra]
    assert orjson.loads(reply.body) == {
        "error": str(error) if not isinstance(error, ClientGone) else ClientGone.MESSAGE
    }


def test_replies_close_once_exiting() -> None:
    server = _Server()
    handler = close_when_exiting(HttpFrontend(server).handle, server)  # type: ignore[arg-type]
    reply = asyncio.run(handler(_request("GET", "/v2/health/live")))
    assert reply is not None and not reply.close
    server.exiting = True
    reply = asyncio.run(handler(_request("GET", "/v2/health/live")))
    assert reply is not None and reply.close and reply.status == 503


def test_the_asgi_adapter() -> None:
    async def handler(request: HttpRequest) -> HttpReply:
        got = await request.body.receive()
        assert got == (b"abc", False) and request.header(b"x-a") == "2"
        return HttpReply(201, [(b"content-type", b"text/plain")], b"made", close=True)

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"abc", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/p", "query_string": b"", "scheme": "http",
             "headers": [(b"x-a", b"1"), (b"x-a", b"2")], "server": ("127.0.0.1", 1)}  # fmt: skip
    asyncio.run(asgi_app(handler)(scope, receive, send))
    assert sent[0] == {
        "type": "http.response.start",
        "status": 201,
        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"4"), (b"connection", b"close")],
    }
    assert sent[1] == {"type": "http.response.body", "body": b"made"}
