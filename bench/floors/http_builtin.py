"""HTTP floor on seqserve's builtin server: ``python bench/floors/http_builtin.py PORT [--host H]``.

The routes and replies are those of :mod:`bench.floors.asgi_app`, written as handlers and served
the way seqserve serves its routes by default: ``seqserve.api.transport.http1_server.Http1Server``
(httptools on the event loop, no ASGI) on uvloop, with its default limits, so the floor's CPU
per step compares with seqserve's and with the other servers' floors.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from typing import Any

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors import common


def handler() -> Any:
    """The floor's routes (those of ``asgi_app``) on seqserve's router."""
    import orjson

    from bench.floors.asgi_app import infer_echo
    from seqserve.api.http.router import Route, Router
    from seqserve.api.transport.exchange import HttpReply, HttpRequest

    empty = [(b"content-type", b"text/plain; charset=utf-8")]

    async def ready(request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        return HttpReply(200, empty)

    async def server_metadata(request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        doc = {"name": "floor-http", "version": "0", "extensions": []}
        return HttpReply(200, [(b"content-type", b"application/json")], orjson.dumps(doc))

    async def metadata(request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        doc = common.model_metadata(p["name"])
        return HttpReply(200, [(b"content-type", b"application/json")], orjson.dumps(doc))

    async def infer(request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        body = b""
        while (got := await request.body.receive()) is not None:
            body += got[0]
            if not got[1]:
                break
        kind, out, json_len = infer_echo(p["name"], request.header(b"inference-header-content-length"), body)
        headers = [(b"content-type", kind.encode())]
        if json_len is not None:
            headers.insert(0, (b"inference-header-content-length", str(json_len).encode()))
        return HttpReply(200, headers, out)

    router = Router([
        Route("/v2/health/ready", ready, ["GET"]),
        Route("/v2/health/live", ready, ["GET"]),
        Route("/v2", server_metadata, ["GET"]),
        Route("/v2/models/{name}/ready", ready, ["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", ready, ["GET"]),
        Route("/v2/models/{name}", metadata, ["GET"]),
        Route("/v2/models/{name}/infer", infer, ["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, ["POST"]),
    ])  # fmt: skip
    return router.dispatch


async def serve(host: str, port: int) -> None:
    from seqserve.api.limits import HttpLimits
    from seqserve.api.transport.http1_server import Http1Server

    server = Http1Server(handler(), HttpLimits())
    sock = socket.create_server((host, port), backlog=1024)
    await server.start(sock)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.stop)
    await server.serve()


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("http_builtin.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
