"""HTTP floor on hypercorn (uvloop): ``python bench/floors/http_hypercorn.py PORT [--host H]``.
The app is :mod:`bench.floors.asgi_app`, served by ``hypercorn.asyncio.serve`` (seqserve runs
hypercorn's per-connection server behind its own accept loop: api/transport/hypercorn.py)."""

from __future__ import annotations

import sys

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors import common


async def serve(host: str, port: int) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    from bench.floors.asgi_app import app

    cfg = Config()
    cfg.bind = [f"{host}:{port}"]
    cfg.accesslog = None
    cfg.loglevel = "WARNING"
    cfg.keep_alive_timeout = 75
    cfg.graceful_timeout = 0.5
    stop = common.stop_on_signal()
    await hypercorn_serve(app, cfg, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("http_hypercorn.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
