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
from typing import Any

from seqserve import __version__
from seqserve.api import security
from seqserve.api.front_end_metrics import FrontEndMetrics
from seqserve.api.grpc.stream import StreamDrain, StreamStats
from seqserve.api.http.routes import HttpFrontend, close_when_exiting
from seqserve.api.limits import ConnectionAdmission, shutdown_executor
from seqserve.api.metrics import MetricsServer, start_metrics
from seqserve.api.observability import Observability, start_observability
from seqserve.api.serve_options import GrpcOptions, HttpOptions, MetricsOptions, ServeOptions, StateStoreOptions
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.transport.asgi import asgi_app
from seqserve.api.transport.exchange import Handler
from seqserve.api.transport.read_gate import ReadGate
from seqserve.engine import Server, default_replica_id, open_store, redact_url

log = logging.getLogger("seqserve")

#: past the exit timeout, how long the front-ends and the interpreter's own exit may take
#: before the process exits at once (os._exit) whatever is still running
EXIT_BACKSTOP_S = 3.0
#: how long gRPC calls still open once the engine has drained get to finish
GRPC_STOP_GRACE_S = 1.0


class StartupError(Exception):
    """Startup cannot go on (a port that cannot be bound, a model that failed to load): the
    message is the one line logged, and the process exits non-zero."""


async def serve(opts: ServeOptions) -> int:
    """Serve until SIGINT/SIGTERM, then drain (see ``Shutdown``): readiness turns false, new
    sequences are refused, running ones get up to exit_timeout_s to finish, and only then do
    the front-ends stop. A second signal exits at once. Returns the process exit code."""
    server = await _start_engine(opts)
    if server is None:
        return 1
    # the gRPC streams end with UNAVAILABLE on the drain: at once with a state store (their
    # sequences continue on another replica), after the engine's drain without one
    try:
        observability = start_observability(server, opts)
    except RuntimeError as e:  # the tracing configured cannot run
        log.error("%s", e)
        await server.shutdown(timeout_s=0)
        return 1
    if opts.workers > 1:
        from seqserve.api.workers.supervisor import serve_with_workers

        return await serve_with_workers(opts, server, observability)
    streams = StreamDrain()
    shutdown = Shutdown(server, on_drain=lambda: streams.begin(handoff=opts.state_store is not None))
    handle_signals(shutdown)
    front_ends = FrontEnds(server, streams, observability)
    try:
        await front_ends.start(opts)
    except StartupError as e:
        await front_ends.abort()
        await server.shutdown(timeout_s=0)
        observability.close()
        log.error("%s", e)  # last: the line an operator reads first
        return 1
    log.info("seqserve %s ready", __version__)

    await shutdown.requested.wait()
    code = await _drain(server, front_ends)
    await asyncio.to_thread(observability.close)
    return code


async def _start_engine(opts: ServeOptions) -> Server | None:
    """The engine with its startup models loaded and its state store enabled; None when
    startup ends there (a model failed to load, with exit_on_error; the store cannot be used)."""
    engine = opts.engine
    server = engine.new_server()
    log.info("model control mode: %s", engine.model_control.value)
    await server.start(engine.startup_models)
    _log_models(server)
    failed = server.failed_models()
    if failed and engine.exit_on_error:
        await server.shutdown(timeout_s=0)
        # Triton: "error: creating server: Internal - failed to load all models"; last, after the models' lines
        log.error(
            "failed to load all models (%s); exiting (--exit-on-error=false keeps serving the others)",
            ", ".join(sorted(failed)),
        )
        return None
    if opts.state_store is not None:
        try:
            await _enable_state_store(server, opts.state_store)
        except Exception as e:
            await server.shutdown(timeout_s=0)
            log.error("cannot use the state store %s: %s", redact_url(opts.state_store.url), e)
            return None
    return server


def _log_models(server: Server) -> None:
    for entry in server.repository_index():
        state = entry["state"] + (f" ({entry['reason']})" if entry["reason"] else "")
        log.info("model %-24s version %-4s %s", entry["name"], entry["version"] or "-", state)


async def _enable_state_store(server: Server, opts: StateStoreOptions) -> None:
    store = open_store(opts.url, opts.replica_id or default_replica_id())
    await server.enable_state_store(store, spill_idle_s=opts.spill_idle_s, handover_timeout_s=opts.handover_timeout_s)
    log.info("state store %s: this replica is '%s'", redact_url(opts.url), store.replica_id)


def handle_signals(shutdown: Shutdown) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, shutdown.on_signal, sig)


async def _drain(server: Server, front_ends: FrontEnds) -> int:
    """The engine drains, then the front-ends stop: every request the engine took has its
    answer by then. Returns the exit code, or exits at once past a model that never returned
    from execute."""
    await server.shutdown()
    await server.linger_while_requested()  # with a state store: until the balancer stops sending
    await front_ends.stop()
    shutdown_executor()
    if server.hung_instances:
        hung = ", ".join(f"model '{m}' instance '{i}'" for m, i in server.hung_instances)
        log.error("stopped; exiting without waiting for %s (still in execute)", hung)
        exit_now(1)
    log.info("stopped")
    return 0


class FrontEndParts:
    """How the front-ends answer: over the engine of this process (the default, one process)
    or, in a worker process, over the engine process (api/workers)."""

    #: a worker's read gate (api/transport/read_gate.py) for the builtin HTTP server; one process has none
    read_gate: ReadGate | None = None

    def http_handler(self, server: Server, http: HttpOptions, shared_memory: SharedMemoryRegistry) -> Handler:
        return _http_handler(server, http, shared_memory)

    async def start_grpc(
        self,
        server: Server,
        grpc: GrpcOptions,
        streams: StreamDrain,
        shared_memory: SharedMemoryRegistry,
        *,
        stream_stats: StreamStats,
        admission: ConnectionAdmission | None,
        sock: socket.socket | None,
    ) -> Any:
        return await _start_grpc(
            server, grpc, streams, shared_memory, stream_stats=stream_stats, admission=admission, sock=sock
        )


class FrontEnds:
    """The gRPC, HTTP and metrics servers of the process: started in that order, stopped
    together once the engine has drained."""

    def __init__(
        self,
        server: Server,
        streams: StreamDrain,
        observability: Observability | None = None,
        *,
        sockets: dict[str, socket.socket] | None = None,
        parts: FrontEndParts | None = None,
        front_end_metrics: FrontEndMetrics | None = None,
    ) -> None:
        """streams: the open gRPC streams, which the drain ends. sockets: listening sockets
        bound already ("HTTP", "gRPC"), used instead of binding; parts: see FrontEndParts;
        front_end_metrics: the front-end counts /metrics shows (default: this process's)."""
        self._server = server
        self._sockets = sockets or {}
        self._parts = parts or FrontEndParts()
        self._front_end_metrics = front_end_metrics
        self._summaries = observability.summaries if observability is not None else None
        self._streams = streams
        self._tasks: list[asyncio.Task[None]] = []  # servers that run as tasks on this loop
        self._grpc_server: Any = None  # grpc.aio.Server or the builtin one: both have stop(grace)
        self._metrics_server: MetricsServer | None = None
        self._http_done = asyncio.Event()  # hypercorn's shutdown trigger
        self._stop_http: Callable[[], None] = self._http_done.set
        self._shared_memory = SharedMemoryRegistry()  # both front-ends' regions, unmapped at the stop
        # the connection caps of the front-ends that have them, by protocol, and the streams' counts
        self._admissions: dict[str, ConnectionAdmission] = {}
        self._stream_stats: StreamStats | None = None

    async def start(self, opts: ServeOptions) -> None:
        """StartupError when one cannot start; ``abort`` stops those that did."""
        if opts.grpc is not None:
            await self._launch_grpc(opts.grpc)
        if opts.http is not None:
            await self._launch_http(opts.http)
        if opts.metrics is not None:
            await self._launch_metrics(opts.metrics)

    async def _launch_grpc(self, grpc: GrpcOptions) -> None:
        limits = grpc.limits
        self._stream_stats = StreamStats()
        admission = None
        if grpc.kind == "builtin":
            admission = ConnectionAdmission(limits.max_connections, limits.max_connections_per_peer)
            self._admissions["grpc"] = admission
        sock = None
        if grpc.kind == "builtin":  # grpc.aio binds its own port
            # gRPC's own failure says neither why nor in one line
            sock = self._listen("gRPC", grpc.host, grpc.port, reuse_port=grpc.reuse_port)
        self._grpc_server = await self._parts.start_grpc(
            self._server,
            grpc,
            self._streams,
            self._shared_memory,
            stream_stats=self._stream_stats,
            admission=admission,
            sock=sock,
        )
        log.info("gRPC (%s) listening on %s:%d%s", grpc.kind, grpc.host, grpc.port, _tls_note(grpc.tls))
        if grpc.restricted:
            log.info("gRPC restricted protocols: %s", grpc.restricted.describe())

    async def _launch_http(self, http: HttpOptions) -> None:
        handler = self._parts.http_handler(self._server, http, self._shared_memory)
        kind = http.kind
        admission = ConnectionAdmission(http.limits.max_connections, http.limits.max_connections_per_peer)
        if kind == "builtin":
            self._admissions["http"] = admission
            sock = self._listen("HTTP", http.host, http.port, reuse_port=http.reuse_port)
            self._stop_http = await _start_builtin(handler, http, self._tasks, admission, sock, self._parts.read_gate)
        elif kind == "granian":
            self._stop_http = await _start_granian(asgi_app(handler), http, self._tasks)
        else:
            self._admissions["http"] = admission
            # bound here, so that a busy port ends startup at once; hypercorn serves its connections
            sock = self._listen("HTTP", http.host, http.port, reuse_port=http.reuse_port)
            _start_hypercorn(asgi_app(handler), http, self._tasks, self._http_done, admission, sock)
        scheme = "https" if http.tls is not None else "http"
        log.info("HTTP (%s) listening on %s://%s:%d%s", kind, scheme, http.host, http.port, _tls_note(http.tls))
        if http.restricted:
            log.info("HTTP restricted APIs: %s", http.restricted.describe())

    def _listen(self, what: str, host: str, port: int, *, reuse_port: bool) -> socket.socket:
        """The socket bound already for ``what``, or a new one."""
        sock = self._sockets.pop(what, None)
        return sock if sock is not None else listen(what, host, port, reuse_port=reuse_port)

    @property
    def admissions(self) -> dict[str, ConnectionAdmission]:
        """The connection caps by protocol (for the metrics)."""
        return self._admissions

    @property
    def stream_stats(self) -> StreamStats | None:
        return self._stream_stats

    @property
    def shared_memory(self) -> SharedMemoryRegistry:
        """Both front-ends' registered shared-memory regions."""
        return self._shared_memory

    async def _launch_metrics(self, metrics: MetricsOptions) -> None:
        sock = listen("metrics", metrics.host, metrics.port)
        front_ends = self._front_end_metrics or FrontEndMetrics(self._admissions, self._stream_stats)
        self._metrics_server = await start_metrics(
            self._server,
            sock,
            interval_ms=metrics.interval_ms,
            config=metrics.config,
            summaries=self._summaries,
            cpu=metrics.cpu,
            gpu=metrics.gpu,
            extra=front_ends.collect,
        )
        log.info("metrics listening on http://%s:%d/metrics", metrics.host, metrics.port)

    async def abort(self) -> None:
        """After a failed start: stop at once what did start."""
        self._stop_http()
        if self._grpc_server is not None:
            await self._grpc_server.stop(grace=None)
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._shared_memory.close()

    async def stop(self) -> None:
        log.info("stopping the front-ends")
        self._stop_http()
        if self._grpc_server is not None:
            self._streams.end()  # each writes its last replies, then ends with UNAVAILABLE (not a reset)
            if not await self._streams.wait_closed(GRPC_STOP_GRACE_S):
                log.warning(
                    "%d gRPC stream(s) still open after %g s; closing them", len(self._streams), GRPC_STOP_GRACE_S
                )
            await self._grpc_server.stop(grace=GRPC_STOP_GRACE_S)
        for t in self._tasks:
            await t
        if self._metrics_server is not None:
            await self._metrics_server.close()
        self._shared_memory.close()


def _http_handler(server: Server, http: HttpOptions, shared_memory: SharedMemoryRegistry) -> Handler:
    """The KServe routes as one handler, behind the restrictions, closing connections once the
    process is exiting: the builtin server calls it directly, hypercorn and granian through
    the ASGI adapter."""
    frontend = HttpFrontend(
        server,
        max_body_bytes=http.max_body_bytes,
        body_timeout_s=http.limits.body_timeout_s,
        shared_memory=shared_memory,
        header_forward=http.header_forward,
    )
    # the routes themselves when nothing is restricted
    handler = security.restrict_http(
        frontend.handle, http.restricted, max_body_bytes=http.max_body_bytes, body_timeout_s=http.limits.body_timeout_s
    )
    return close_when_exiting(handler, server)


class Shutdown:
    """Signal handling: the first SIGINT/SIGTERM begins the drain at once (readiness false,
    new sequences refused) and arms a backstop that ends the process if the shutdown outlasts
    the exit timeout by EXIT_BACKSTOP_S; a second one exits at once with 128 + its number."""

    def __init__(
        self,
        server: Server,
        on_drain: Callable[[], None] | None = None,
        before_drain: Callable[[], None] | None = None,
    ) -> None:
        """on_drain: called once the drain has begun (the gRPC streams' part of it);
        before_drain: just before it begins (worker processes hear of it first)."""
        self.server = server
        self.on_drain = on_drain
        self.before_drain = before_drain
        self.requested = asyncio.Event()
        self.first: signal.Signals | None = None

    def on_signal(self, sig: signal.Signals) -> None:
        sequences, requests, _ = self.server.open_work()
        if self.first is not None:
            log.warning(
                "received %s again: exiting at once with %s and %s still open",
                sig.name,
                _plural(sequences, "sequence"),
                _plural(requests, "request"),
            )
            exit_now(128 + sig)
        self.first = sig
        if self.before_drain is not None:
            self.before_drain()
        self.server.begin_shutdown()
        if self.on_drain is not None:
            self.on_drain()
        timeout = self.server.exit_timeout_s
        log.info(
            "received %s: shutting down; draining %s and %s (up to %g s; %s again exits at once)",
            sig.name,
            _plural(sequences, "sequence"),
            _plural(requests, "request"),
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


def _plural(n: int, noun: str) -> str:
    """'1 sequence', '2 sequences'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def listen(what: str, host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on host:port, or StartupError naming the port and why;
    reuse_port: SO_REUSEPORT, so that several servers that all set it share the port."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise StartupError(f"cannot listen for {what} on {host}:{port} (port {port}): {_reason(e)}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
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


async def _start_grpc(
    server: Server,
    grpc: GrpcOptions,
    streams: StreamDrain | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
    *,
    stream_stats: StreamStats | None = None,
    admission: ConnectionAdmission | None = None,
    sock: socket.socket | None = None,
) -> Any:
    """sock: the builtin server's listening socket (grpc.aio binds its own; its port is tried
    here first, so that a busy one ends startup with a clear line)."""
    from seqserve.api.grpc.serve import start_grpc

    if grpc.kind == "grpcio":
        listen("gRPC", grpc.host, grpc.port, reuse_port=grpc.reuse_port).close()
    try:
        return await start_grpc(
            server,
            grpc,
            streams=streams,
            sock=sock,
            shared_memory=shared_memory,
            stream_stats=stream_stats,
            admission=admission,
        )
    except ssl.SSLError as e:  # the files were checked at startup (security.check_tls); changed since
        if sock is not None:
            sock.close()
        raise StartupError(f"cannot use the gRPC TLS certificate or key: {e}") from None
    except (RuntimeError, OSError):
        if sock is not None:
            sock.close()
        raise StartupError(f"cannot listen for gRPC on {grpc.host}:{grpc.port} (port {grpc.port})") from None


def _start_hypercorn(
    app: Any,
    http: HttpOptions,
    tasks: list[asyncio.Task[None]],
    done: asyncio.Event,
    admission: ConnectionAdmission,
    sock: socket.socket,
) -> None:
    from hypercorn.config import Config

    from seqserve.api.transport.hypercorn import serve_hypercorn

    cfg = Config()
    cfg.accesslog = None
    cfg.errorlog = logging.getLogger("hypercorn.error")
    limits = http.limits
    # hypercorn's idle timer runs from when a connection opens or answers until the next
    # request's headers are complete: it is both the header timeout and the keep-alive limit.
    cfg.keep_alive_timeout = limits.idle_s
    if limits.keepalive_s <= 0:
        cfg.keep_alive_max_requests = 1  # one request per connection
    cfg.alpn_protocols = ["http/1.1"]  # HTTP/2 streams would escape the HTTP/1 timers
    cfg.graceful_timeout = 1.0
    if http.tls is not None:
        security.hypercorn_tls(cfg, http.tls)
    tasks.append(asyncio.create_task(serve_hypercorn(app, cfg, sock, admission, done.wait)))


async def _start_builtin(
    handler: Handler,
    http: HttpOptions,
    tasks: list[asyncio.Task[None]],
    admission: ConnectionAdmission,
    sock: socket.socket,
    read_gate: ReadGate | None = None,
) -> Callable[[], None]:
    """seqserve's own HTTP/1.1 server (api/transport/http1_server.py) on this loop."""
    from seqserve.api.transport.http1_server import Http1Server

    tls = http.tls
    try:  # the files were checked at startup (security.check_tls); they may have changed since
        ctx = None if tls is None else security.builtin_tls(tls)
    except (OSError, ssl.SSLError) as e:
        sock.close()
        raise StartupError(f"cannot use the HTTP TLS certificate or key: {e}") from None
    server = Http1Server(handler, http.limits, ssl_context=ctx, admission=admission, read_gate=read_gate)
    try:
        await server.start(sock)
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot serve HTTP on {http.host}:{http.port}: {_reason(e)}") from None
    tasks.append(asyncio.create_task(server.serve()))
    return server.stop


async def _start_granian(app: Any, http: HttpOptions, tasks: list[asyncio.Task[None]]) -> Callable[[], None]:
    """Granian's embedded server: its Rust HTTP stack feeds our ASGI app on this same loop."""
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server as GranianServer

    host, port = http.host, http.port
    listen("HTTP", host, port).close()  # granian binds its own socket: a busy port is found here
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
            header_read_timeout=int(http.limits.idle_s * 1000), keep_alive=http.limits.keepalive_s > 0
        ),
        # granian takes a permit per connection: connections beyond wait in the listen backlog
        backpressure=http.limits.max_connections,
        log_enabled=False,
        **security.granian_tls(http.tls),
    )
    task = asyncio.create_task(server.serve())
    tasks.append(task)
    await asyncio.sleep(0)  # granian binds in the task's first step
    if task.done() and task.exception() is not None:
        tasks.remove(task)
        raise StartupError(f"cannot listen for HTTP on {host}:{port} (port {port}): {task.exception()}")
    return server.stop


def _tls_note(tls: security.TlsFiles | None) -> str:
    if tls is None or not tls.client_ca:
        return ""
    return f" (mutual TLS: client certificates from {tls.client_ca})"


def run(opts: ServeOptions) -> int:
    """Run `serve` on uvloop when it is installed, else on the default asyncio loop."""
    runner: Callable[..., int] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        pass  # asyncio's loop; it runs outside this block, so a later error is not chained to the ImportError
    return runner(serve(opts))
