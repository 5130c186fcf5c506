"""A ``Handler`` (api/transport/exchange.py) as an ASGI app, for the servers that speak ASGI
(hypercorn, granian): the same routes and replies as on the builtin server."""

from __future__ import annotations

import contextlib

from starlette.types import ASGIApp, Receive, Scope, Send

from seqserve.api.transport.exchange import Handler, HttpReply, HttpRequest


class AsgiBody:
    """A request body read from ASGI ``receive`` (a ``BodySource``)."""

    __slots__ = ("_receive",)

    def __init__(self, receive: Receive) -> None:
        self._receive = receive

    async def receive(self) -> tuple[bytes, bool] | None:
        msg = await self._receive()
        if msg["type"] == "http.disconnect":
            return None
        return msg.get("body", b""), msg.get("more_body", False)

    async def wait_disconnect(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass


def asgi_app(handler: Handler) -> ASGIApp:
    """``handler`` as an ASGI app; the lifespan protocol is answered (there is nothing to set
    up: the engine starts before the server)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            return
        server = scope.get("server")
        client = scope.get("client")
        request = HttpRequest(
            scope["method"],
            scope["path"],
            scope.get("query_string", b""),
            scope["headers"],
            AsgiBody(receive),
            scheme=scope.get("scheme", "http"),
            server=(str(server[0]), int(server[1])) if server and server[1] is not None else None,
            peer=str(client[0]) if client else "",
        )
        reply = await handler(request)
        if reply is not None:
            await send_reply(send, reply)

    return app


async def send_reply(send: Send, reply: HttpReply) -> None:
    if reply.stream is not None:
        await send_stream(send, reply)
        return
    headers = [*reply.headers, (b"content-length", b"%d" % len(reply.body))]
    if reply.close:
        headers.append((b"connection", b"close"))
    try:
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})
    except OSError:  # the client is gone (ASGI servers may raise on a closed connection)
        pass


async def send_stream(send: Send, reply: HttpReply) -> None:
    """A reply whose body streams: no content-length (the server frames it), each part sent as
    it comes; the stream is closed whatever happens (the client gone: the send fails)."""
    stream = reply.stream
    assert stream is not None
    headers = list(reply.headers)
    if reply.close:
        headers.append((b"connection", b"close"))
    try:
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body, "more_body": True})
        async for part in stream:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except OSError:  # the client is gone
        pass
    finally:
        await _close_stream(stream)


async def _close_stream(stream: object) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def _lifespan(receive: Receive, send: Send) -> None:
    with contextlib.suppress(Exception):
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
