"""Runs the engine with both front-ends in one process and one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqserve import __version__
from seqserve.api.http import DEFAULT_MAX_BODY_BYTES, HttpFrontend
from seqserve.engine import Server

log = logging.getLogger("seqserve")


@dataclass(slots=True)
class ServeOptions:
    model_repository: Path
    host: str = "0.0.0.0"
    http_port: int | None = 8000  # None: HTTP off
    grpc_port: int | None = 8001  # None: gRPC off
    exit_timeout_s: float = 30.0
    strict_sequence_ids: bool = False
    http_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    http_tls_cert: str | None = None
    http_tls_key: str | None = None
    grpc_tls_cert: str | None = None
    grpc_tls_key: str | None = None
    http_server: str = "auto"  # "hypercorn", "granian", or "auto": granian when installed
    python_isolation: str = "thread"  # or "process": see docs/isolation.md


def resolve_http_server(choice: str) -> str:
    if choice != "auto":
        return choice
    try:
        import granian.server.embed  # noqa: F401
    except ImportError:
        return "hypercorn"
    return "granian"


async def serve(opts: ServeOptions) -> int:
    """Serve until SIGINT/SIGTERM, then drain: new sequences are refused, running ones get up to
    exit_timeout_s to finish, then both front-ends stop. Returns the process exit code."""
    server = Server(
        opts.model_repository,
        exit_timeout_s=opts.exit_timeout_s,
        auto_sequence_ids=not opts.strict_sequence_ids,
        python_isolation=opts.python_isolation,
    )
    await server.start()
    for entry in server.repository_index():
        state = entry["state"] + (f" ({entry['reason']})" if entry["reason"] else "")
        log.info("model %-24s version %-4s %s", entry["name"], entry["version"] or "-", state)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)

    tasks: list[asyncio.Task[None]] = []
    grpc_server = None
    if opts.grpc_port is not None:
        from seqserve.api.grpc import start_grpc

        grpc_server = await start_grpc(
            server, opts.host, opts.grpc_port, cert=opts.grpc_tls_cert, key=opts.grpc_tls_key
        )
        log.info("gRPC listening on %s:%d", opts.host, opts.grpc_port)
    http_done = asyncio.Event()
    stop_http = http_done.set
    if opts.http_port is not None:
        app = HttpFrontend(server, max_body_bytes=opts.http_max_body_bytes).asgi()
        kind = resolve_http_server(opts.http_server)
        if kind == "granian":
            stop_http = _start_granian(app, opts, tasks)
        else:
            _start_hypercorn(app, opts, tasks, http_done)
        scheme = "https" if opts.http_tls_cert else "http"
        log.info("HTTP (%s) listening on %s://%s:%d", kind, scheme, opts.host, opts.http_port)
    log.info("seqserve %s ready", __version__)

    await stop.wait()
    log.info("shutting down: draining sequences (up to %.0f s)", opts.exit_timeout_s)
    await server.shutdown()
    stop_http()
    if grpc_server is not None:
        await grpc_server.stop(grace=1.0)
    for t in tasks:
        await t
    log.info("stopped")
    return 0


def _start_hypercorn(app: Any, opts: ServeOptions, tasks: list[asyncio.Task[None]], done: asyncio.Event) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    cfg = Config()
    cfg.bind = [f"{opts.host}:{opts.http_port}"]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    cfg.keep_alive_timeout = 75
    cfg.graceful_timeout = 1.0
    if opts.http_tls_cert:
        cfg.certfile = opts.http_tls_cert
        cfg.keyfile = opts.http_tls_key
    tasks.append(asyncio.create_task(hypercorn_serve(app, cfg, shutdown_trigger=done.wait)))  # type: ignore[arg-type]


def _start_granian(app: Any, opts: ServeOptions, tasks: list[asyncio.Task[None]]) -> Callable[[], None]:
    """Granian's embedded server: its Rust HTTP stack feeds our ASGI app on this same loop."""
    from granian.constants import Interfaces
    from granian.server.embed import Server as GranianServer

    logging.getLogger("_granian").setLevel(logging.WARNING)  # it warns that embedding is experimental
    server = GranianServer(
        app,
        address=opts.host,
        port=opts.http_port or 8000,
        interface=Interfaces.ASGINL,
        log_enabled=False,
        ssl_cert=Path(opts.http_tls_cert) if opts.http_tls_cert else None,
        ssl_key=Path(opts.http_tls_key) if opts.http_tls_key else None,
    )
    tasks.append(asyncio.create_task(server.serve()))
    return server.stop


def run(opts: ServeOptions) -> int:
    """Run `serve` on uvloop when it is installed, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(opts))
    return uvloop.run(serve(opts))
