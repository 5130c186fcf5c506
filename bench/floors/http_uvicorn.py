"""HTTP floor on uvicorn: ``python bench/floors/http_uvicorn.py PORT [--host H]``.

The app is :mod:`bench.floors.asgi_app`, served by uvicorn with its ``httptools`` parser on a
uvloop loop in this one process: HTTP/1.1 parsed in C on the event loop's own thread, with no
second runtime and no thread hop per request (granian's embedded server has both).
"""

from __future__ import annotations

import sys

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors import common


def main(argv: list[str] | None = None) -> int:
    try:
        import uvicorn
    except ImportError:
        raise SystemExit(
            "the http-uvicorn floor needs uvicorn (not installed with seqserve): pip install uvicorn"
        ) from None

    from bench.floors.asgi_app import app

    args = common.parse_args("http_uvicorn.py", argv)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
