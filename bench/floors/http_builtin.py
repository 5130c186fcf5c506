"""HTTP floor on seqserve's builtin server: ``python bench/floors/http_builtin.py PORT [--host H]``.

The app is :mod:`bench.floors.asgi_app`, served the way seqserve serves its ASGI app by default:
``seqserve.api.http1.Http1Server`` (httptools on the event loop) on uvloop, with its default
limits, so the floor's CPU per step compares with seqserve's and with the other servers' floors.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors import common


async def serve(host: str, port: int) -> None:
    from bench.floors.asgi_app import app
    from seqserve.api.http1 import Http1Server
    from seqserve.api.limits import HttpLimits

    server = Http1Server(app, HttpLimits())
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
