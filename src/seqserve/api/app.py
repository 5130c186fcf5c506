"""Runs the engine with both front-ends in one process and one asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqserve import __version__
from seqserve.api import http_servers, security
from seqserve.api.grpc.stream import StreamDrain, StreamStats
from seqserve.api.http import HttpFrontend, close_when_exiting
from seqserve.api.limits import DEFAULT_MAX_BODY_BYTES, GrpcLimits, HttpLimits, shutdown_executor
from seqserve.api.metrics import DEFAULT_INTERVAL_MS, DEFAULT_METRICS_PORT, MetricsConfig, MetricsServer, start_metrics
from seqserve.engine import (
    DEFAULT_INLINE_MAX_BATCH_US,
    DEFAULT_MAX_BACKLOG_SEQUENCES,
    DEFAULT_REPOSITORY_POLL_SECS,
    DEFAULT_TOMBSTONE_MAX,
    DEFAULT_TOMBSTONE_S,
    ModelControlMode,
    Server,
    SessionPolicy,
    default_replica_id,
    open_store,
    redact_url,
)

log = logging.getLogger("seqserve")

#: past the exit timeout, how long the front-ends and the interpreter's own exit may take
#: before the process exits at once (os._exit) whatever is still running
EXIT_BACKSTOP_S = 3.0
#: how long gRPC calls still open once the engine has drained get to finish
GRPC_STOP_GRACE_S = 1.0


class StartupError(Exception):
    """Startup cannot go on (a port that cannot be bound, a model that failed to load): the
    message is the one line logged, and the process exits non-zero."""


@dataclass(slots=True)
class ServeOptions:
    model_repository: Path | list[Path]  # several: Triton's repeated --model-repository
    host: str = "0.0.0.0"  # both front-ends, unless http_address / grpc_address say otherwise
    http_port: int | None = 8000  # None: HTTP off
    grpc_port: int | None = 8001  # None: gRPC off
    exit_timeout_s: float = 30.0
    strict_sequence_ids: bool = False
    http_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    http_tls_cert: str | None = None
    http_tls_key: str | None = None
    grpc_tls_cert: str | None = None
    grpc_tls_key: str | None = None
    http_tls_client_ca: str | None = None  # mutual TLS: clients need a certificate this CA signed
    grpc_tls_client_ca: str | None = None
    http_restricted: security.Restrictions = field(default_factory=security.Restrictions)
    grpc_restricted: security.Restrictions = field(default_factory=security.Restrictions)
    http_server: str = "auto"  # "builtin", "hypercorn", "granian", or "auto" (resolve_http_server)
    grpc_server: str = "auto"  # "builtin", "grpcio", or "auto" (builtin)
    model_control: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] | None = None  # None: every model of the repository
    repository_poll_secs: float = DEFAULT_REPOSITORY_POLL_SECS
    http_address: str | None = None  # None: host
    grpc_address: str | None = None  # None: host
    exit_on_error: bool = True  # a model that fails to load at startup ends startup (Triton's default)
    strict_readiness: bool = True  # /v2/health/ready is false while a model failed to load
    metrics_port: int | None = DEFAULT_METRICS_PORT  # None: no metrics (--allow-metrics=false)
    metrics_address: str | None = None  # None: the HTTP address (Triton's default)
    metrics_interval_ms: int = DEFAULT_INTERVAL_MS
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    session_tombstone_s: float = DEFAULT_TOMBSTONE_S
    session_tombstone_max: int = DEFAULT_TOMBSTONE_MAX
    python_isolation: str = "thread"  # or "process": see docs/isolation.md
    inline_max_batch_us: int = DEFAULT_INLINE_MAX_BATCH_US  # 0: never run batches on the loop

    max_backlog_sequences: int = DEFAULT_MAX_BACKLOG_SEQUENCES  # per model; 0: no bound
    stream_scoped_sequences: bool = False  # sequences started on a gRPC stream end with it
    stream_stats: StreamStats | None = None  # the gRPC streams' counters (one made when None)
    state_store: str | None = None  # redis://host:port/db or dir:///path (docs/state-store.md)
    replica_id: str | None = None  # None: hostname-pid-random
    spill_idle_s: float = 0.0  # idle sequences move to the store after this long (0: never)
    handover_timeout_s: float = 2.0

    @property
    def http_host(self) -> str:
        return self.http_address or self.host

    @property
    def grpc_host(self) -> str:
        return self.grpc_address or self.host

    http_limits: HttpLimits = field(default_factory=HttpLimits)
    grpc_limits: GrpcLimits = field(default_factory=GrpcLimits)

    @property
    def metrics_host(self) -> str:
        return self.metrics_address or self.http_host


def resolve_http_server(choice: str) -> str:
    """``auto`` is seqserve's own server (its parser, httptools, is a dependency)."""
    return "builtin" if choice == "auto" else choice


async def serve(opts: ServeOptions) -> int:
    """Serve until SIGINT/SIGTERM, then drain (see ``Shutdown``): readiness turns false, new
    sequences are refused, running ones get up to exit_timeout_s to finish, and only then do
    both front-ends stop. A second signal exits at once. Returns the process exit code."""
    server = Server(
        opts.model_repository,
        exit_timeout_s=opts.exit_timeout_s,
        auto_sequence_ids=not opts.strict_sequence_ids,
        model_control=opts.model_control,
        repository_poll_secs=opts.repository_poll_secs,
        strict_readiness=opts.strict_readiness,
        sessions=SessionPolicy(opts.session_tombstone_s, opts.session_tombstone_max),
        python_isolation=opts.python_isolation,
        max_backlog_sequences=opts.max_backlog_sequences,
        inline_max_batch_us=opts.inline_max_batch_us,
    )
    log.info("model control mode: %s", opts.model_control.value)
    await server.start(opts.startup_models)
    for entry in server.repository_index():
        state = entry["state"] + (f" ({entry['reason']})" if entry["reason"] else "")
        log.info("model %-24s version %-4s %s", entry["name"], entry["version"] or "-", state)
    failed = server.failed_models()
    if failed and opts.exit_on_error:
        # Triton: "error: creating server: Internal - failed to load all models"
        log.error(
            "failed to load all models (%s); exiting (--exit-on-error=false keeps serving the others)",
            ", ".join(sorted(failed)),
        )
        await server.shutdown(timeout_s=0)
        return 1
    if opts.state_store:
        try:
            await _enable_state_store(server, opts)
        except Exception as e:
            log.error("cannot use the state store %s: %s", redact_url(opts.state_store), e)
            await server.shutdown(timeout_s=0)
            return 1

    # the gRPC streams end with UNAVAILABLE on the drain: at once with a state store (their
    # sequences continue on another replica), after the engine's drain without one
    streams = StreamDrain()
    shutdown = Shutdown(server, on_drain=lambda: streams.begin(handoff=bool(opts.state_store)))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, shutdown.on_signal, sig)

    tasks: list[asyncio.Task[None]] = []
    grpc_server = None
    metrics: MetricsServer | None = None
    http_done = asyncio.Event()
    stop_http = http_done.set
    try:
        if opts.grpc_port is not None:
            grpc_server = await _start_grpc(server, opts, streams)
            log.info(
                "gRPC (%s) listening on %s:%d%s",
                "grpcio" if opts.grpc_server == "grpcio" else "builtin",
                opts.grpc_host, opts.grpc_port, _tls_note(opts.grpc_tls_client_ca),
            )  # fmt: skip
            if opts.grpc_restricted:
                log.info("gRPC restricted protocols: %s", opts.grpc_restricted.describe())
        if opts.http_port is not None:
            app = HttpFrontend(
                server, max_body_bytes=opts.http_max_body_bytes, body_timeout_s=opts.http_limits.body_timeout_s
            ).asgi()
            # app itself when nothing is restricted
            app = security.restrict_http(
                app,
                opts.http_restricted,
                max_body_bytes=opts.http_max_body_bytes,
                body_timeout_s=opts.http_limits.body_timeout_s,
            )
            app = close_when_exiting(app, server)
            kind = resolve_http_server(opts.http_server)
            if kind == "builtin":
                stop_http = await _start_builtin(app, opts, tasks)
            elif kind == "granian":
                stop_http = await _start_granian(app, opts, tasks)
            else:
                _start_hypercorn(app, opts, tasks, http_done)
            scheme = "https" if opts.http_tls_cert else "http"
            log.info(
                "HTTP (%s) listening on %s://%s:%d%s",
                kind, scheme, opts.http_host, opts.http_port, _tls_note(opts.http_tls_client_ca),
            )  # fmt: skip
            if opts.http_restricted:
                log.info("HTTP restricted APIs: %s", opts.http_restricted.describe())
        if opts.metrics_port is not None:
            sock = _listen("metrics", opts.metrics_host, opts.metrics_port)
            metrics = await start_metrics(
                server, sock, interval_ms=opts.metrics_interval_ms, config=opts.metrics_config
            )
            log.info("metrics listening on http://%s:%d/metrics", opts.metrics_host, opts.metrics_port)
    except StartupError as e:
        log.error("%s", e)
        stop_http()
        if grpc_server is not None:
            await grpc_server.stop(grace=None)
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        await server.shutdown(timeout_s=0)
        return 1
    log.info("seqserve %s ready", __version__)

    await shutdown.requested.wait()
    await server.shutdown()
    await server.linger_while_requested()  # with a state store: until the balancer stops sending
    # The front-ends stop only now: every request the engine took has its answer.
    log.info("stopping the front-ends")
    stop_http()
    if grpc_server is not None:
        streams.end()  # each writes its last replies, then ends with UNAVAILABLE (not a reset)
        if not await streams.wait_closed(GRPC_STOP_GRACE_S):
            log.warning("%d gRPC stream(s) still open after %g s; closing them", len(streams), GRPC_STOP_GRACE_S)
        await grpc_server.stop(grace=GRPC_STOP_GRACE_S)
    for t in tasks:
        await t
    if metrics is not None:
        await metrics.close()
    shutdown_executor()
    if server.hung_instances:
        hung = ", ".join(f"model '{m}' instance '{i}'" for m, i in server.hung_instances)
        log.error("stopped; exiting without waiting for %s (still in execute)", hung)
        exit_now(1)
    log.info("stopped")
    return 0


async def _enable_state_store(server: Server, opts: ServeOptions) -> None:
    assert opts.state_store
    store = open_store(opts.state_store, opts.replica_id or default_replica_id())
    await server.enable_state_store(store, spill_idle_s=opts.spill_idle_s, handover_timeout_s=opts.handover_timeout_s)
    log.info("state store %s: this replica is '%s'", redact_url(opts.state_store), store.replica_id)


class Shutdown:
    """Signal handling: the first SIGINT/SIGTERM begins the drain at once (readiness false,
    new sequences refused) and arms a backstop that ends the process if the shutdown outlasts
    the exit timeout by EXIT_BACKSTOP_S; a second one exits at once with 128 + its number."""

    def __init__(self, server: Server, on_drain: Callable[[], None] | None = None) -> None:
        """on_drain: called once the drain has begun (the gRPC streams' part of it)."""
        self.server = server
        self.on_drain = on_drain
        self.requested = asyncio.Event()
        self.first: signal.Signals | None = None

    def on_signal(self, sig: signal.Signals) -> None:
        sequences, requests, _ = self.server.open_work()
        if self.first is not None:
            log.warning(
                "received %s again: exiting at once with %s and %s still open",
                sig.name,
                _count(sequences, "sequence"),
                _count(requests, "request"),
            )
            exit_now(128 + sig)
        self.first = sig
        self.server.begin_shutdown()
        if self.on_drain is not None:
            self.on_drain()
        timeout = self.server.exit_timeout_s
        log.info(
            "received %s: shutting down; draining %s and %s (up to %g s; %s again exits at once)",
            sig.name,
            _count(sequences, "sequence"),
            _count(requests, "request"),
            timeout,
            sig.name,
        )
        deadline = self.server.shutdown_deadline
        backstop = (deadline if deadline is not None else time.monotonic() + timeout) + EXIT_BACKSTOP_S
        threading.Thread(target=_backstop, args=(backstop,), name="seqserve-exit-backstop", daemon=True).start()
        self.requested.set()


def _backstop(at: float) -> None:
    """Daemon thread: the process must not outlive the exit timeout (a model's finalize, a
    front-end or the interpreter's own exit that never ends)."""
    time.sleep(max(at - time.monotonic(), 0.0))
    log.error("Exit timeout expired. Exiting immediately. (the shutdown did not finish)")
    exit_now(1)


def exit_now(code: int) -> None:
    """End the process at once, after flushing the logs: no interpreter teardown, which would
    wait for threads that may never return."""
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _listen(what: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, or StartupError naming the port and why."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise StartupError(f"cannot listen for {what} on {host}:{port} (port {port}): {_reason(e)}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot listen for {what} on {host}:{port} (port {port}): {_reason(e)}") from None
    return sock


def _reason(e: OSError) -> str:
    return (e.strerror or str(e)).lower()


async def _start_grpc(server: Server, opts: ServeOptions, streams: StreamDrain | None = None) -> Any:
    from seqserve.api.grpc.serve import start_grpc

    if opts.stream_stats is None:
        opts.stream_stats = StreamStats()
    host, port = opts.grpc_host, opts.grpc_port or 0
    kind = "grpcio" if opts.grpc_server == "grpcio" else "builtin"
    # gRPC's own failure says neither why nor in one line
    sock: socket.socket | None = _listen("gRPC", host, port)
    if kind == "grpcio":
        sock.close()  # type: ignore[union-attr]
        sock = None
    try:
        return await start_grpc(
            server,
            host,
            port,
            cert=opts.grpc_tls_cert,
            key=opts.grpc_tls_key,
            client_ca=opts.grpc_tls_client_ca,
            restrictions=opts.grpc_restricted,
            limits=opts.grpc_limits,
            stream_scoped=opts.stream_scoped_sequences,
            stream_stats=opts.stream_stats,
            streams=streams,
            kind=kind,
            sock=sock,
        )
    except ssl.SSLError as e:  # the files were checked at startup (security.check_tls); changed since
        if sock is not None:
            sock.close()
        raise StartupError(f"cannot use the gRPC TLS certificate or key: {e}") from None
    except (RuntimeError, OSError):
        if sock is not None:
            sock.close()
        raise StartupError(f"cannot listen for gRPC on {host}:{port} (port {port})") from None


def _start_hypercorn(app: Any, opts: ServeOptions, tasks: list[asyncio.Task[None]], done: asyncio.Event) -> None:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    cfg = Config()
    # Bound here, so that a busy port ends startup at once; hypercorn serves the socket.
    sock = _listen("HTTP", opts.http_host, opts.http_port or 0)
    cfg.bind = [f"fd://{sock.detach()}"]
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    limits = opts.http_limits
    # hypercorn's idle timer runs from when a connection opens or answers until the next
    # request's headers are complete: it is both the header timeout and the keep-alive limit.
    cfg.keep_alive_timeout = limits.idle_s
    if limits.keepalive_s <= 0:
        cfg.keep_alive_max_requests = 1  # one request per connection
    cfg.alpn_protocols = ["http/1.1"]  # HTTP/2 streams would escape the HTTP/1 timers
    cfg.graceful_timeout = 1.0
    http_servers.harden_hypercorn(cfg, limits.max_connections, opts.http_max_body_bytes)
    tls = _http_tls(opts)
    if tls is not None:
        security.hypercorn_tls(cfg, tls)
    tasks.append(asyncio.create_task(hypercorn_serve(app, cfg, shutdown_trigger=done.wait)))  # type: ignore[arg-type]


async def _start_builtin(app: Any, opts: ServeOptions, tasks: list[asyncio.Task[None]]) -> Callable[[], None]:
    """seqserve's own HTTP/1.1 server (api/http1.py) on this loop."""
    from seqserve.api.http1 import Http1Server

    tls = _http_tls(opts)
    try:  # the files were checked at startup (security.check_tls); they may have changed since
        ctx = None if tls is None else security.builtin_tls(tls)
    except (OSError, ssl.SSLError) as e:
        raise StartupError(f"cannot use the HTTP TLS certificate or key: {e}") from None
    server = Http1Server(app, opts.http_limits, ssl_context=ctx)
    sock = _listen("HTTP", opts.http_host, opts.http_port or 0)
    try:
        await server.start(sock)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot serve HTTP on {opts.http_host}:{opts.http_port}: {_reason(e)}") from None
    tasks.append(asyncio.create_task(server.serve()))
    return server.stop


async def _start_granian(app: Any, opts: ServeOptions, tasks: list[asyncio.Task[None]]) -> Callable[[], None]:
    """Granian's embedded server: its Rust HTTP stack feeds our ASGI app on this same loop."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server as GranianServer

    host, port = opts.http_host, opts.http_port or 8000
    _listen("HTTP", host, port).close()  # granian binds its own socket: a busy port is found here
    logging.getLogger("_granian").setLevel(logging.WARNING)  # it warns that embedding is experimental
    server = GranianServer(
        app,
        address=host,
        port=port,
        interface=Interfaces.ASGINL,
        # HTTP/1 only: in "auto" mode granian waits, untimed, for a new connection's first bytes
        http=HTTPModes.http1,
        # hyper's header timer also ends a kept-alive connection idle that long
        http1_settings=HTTP1Settings(
            header_read_timeout=int(opts.http_limits.idle_s * 1000), keep_alive=opts.http_limits.keepalive_s > 0
        ),
        # granian takes a permit per connection: connections beyond wait in the listen backlog
        backpressure=opts.http_limits.max_connections,
        log_enabled=False,
        **security.granian_tls(_http_tls(opts)),
    )
    task = asyncio.create_task(server.serve())
    tasks.append(task)
    await asyncio.sleep(0)  # granian binds in the task's first step
    if task.done() and task.exception() is not None:
        tasks.remove(task)
        raise StartupError(f"cannot listen for HTTP on {host}:{port} (port {port}): {task.exception()}")
    return server.stop


def _http_tls(opts: ServeOptions) -> security.TlsFiles | None:
    if not (opts.http_tls_cert and opts.http_tls_key):
        return None
    return security.TlsFiles(opts.http_tls_cert, opts.http_tls_key, opts.http_tls_client_ca)


def _tls_note(client_ca: str | None) -> str:
    return f" (mutual TLS: client certificates from {client_ca})" if client_ca else ""


def run(opts: ServeOptions) -> int:
    """Run `serve` on uvloop when it is installed, else on the default asyncio loop."""
    runner: Callable[..., int] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass  # asyncio's loop; it runs outside this block, so a later error is not chained to the ImportError
    return runner(serve(opts))
