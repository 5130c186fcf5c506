"""HTTP floor on granian: ``python bench/floors/http_granian.py PORT [--host H]``.

The app is :mod:`bench.floors.asgi_app`, served the way seqserve serves its routes with
``--http-server granian``: granian's embedded server (``ASGINL`` interface) on a uvloop loop in this
one process, so the floor's CPU per step compares with seqserve's.
"""

from __future__ import annotations

import asyncio
import logging
import sys

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors import common


async def serve(host: str, port: int) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server as GranianServer

    from bench.floors.asgi_app import app

    logging.getLogger("_granian").setLevel(logging.WARNING)
    server = GranianServer(app, address=host, port=port, interface=Interfaces.ASGINL, log_enabled=False)
    task = asyncio.create_task(server.serve())
    stop = common.stop_on_signal()
    await stop.wait()
    server.stop()
    try:
        await asyncio.wait_for(task, 5)
    except (asyncio.TimeoutError, Exception):
        task.cancel()


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("http_granian.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
