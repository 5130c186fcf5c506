"""The engine process of ``seqserve serve --workers N``: it owns the models (the ``Server``), binds
the listening sockets once, creates the shared-memory rings and starts N worker processes that
run the front-ends on those sockets. It answers what the workers relay, runs the requests they
send through the rings (``SlowPath``), keeps them up to date (``Snapshot``), starts a new one
when one dies, and stops them once its own drain is over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from dataclasses import dataclass, replace
from typing import Any

from seqserve import __version__
from seqserve.api.app import (
    GRPC_STOP_GRACE_S,
    FrontEnds,
    Shutdown,
    StartupError,
    exit_now,
    handle_signals,
    listen,
)
from seqserve.api.front_end_metrics import FrontEndMetrics
from seqserve.api.grpc.serve import method_table
from seqserve.api.grpc.servicer import HealthServicer, InferenceServicer
from seqserve.api.grpc.stream import StreamDrain, StreamStats
from seqserve.api.http.routes import HttpFrontend
from seqserve.api.limits import ConnectionAdmission, shutdown_executor
from seqserve.api.logs import log_control
from seqserve.api.observability import Observability
from seqserve.api.serve_options import ServeOptions
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.transport.grpc_context import Status
from seqserve.api.workers.channel import Channel, ChannelClosed
from seqserve.api.workers.relay import EngineAnswers
from seqserve.api.workers.snapshot import FrontEndCounts, Snapshot, Targets
from seqserve.engine import Server
from seqserve.engine.workers import SLAB_CLASSES, RingFeeder, ShmRegion, SlowPath

log = logging.getLogger("seqserve")

#: how long a new worker may take to start its front-ends
WORKER_START_TIMEOUT_S = 60.0
#: how often the engine looks for changes the workers must know (readiness, models)
SNAPSHOT_EVERY_S = 0.25
#: past the front-ends' own grace, how long a stopping worker may take before it is killed
WORKER_STOP_GRACE_S = 5.0
#: the wait before starting a worker again after a start that failed
RESTART_BACKOFF_S = 1.0
#: how long a dead worker's requests on the compiled path may take to finish before its rings
#: are reset anyway (a request stuck in a model longer than this is not waited for)
DEAD_WORKER_DRAIN_S = 30.0
#: each restart of a worker numbers its requests from a new base: a reply to the dead one's
#: request that arrives after the reset names a handle the new one never used
HANDLE_GENERATION = 1 << 40


async def serve_with_workers(opts: ServeOptions, server: Server, observability: Observability) -> int:
    """``serve`` with N > 1 front-end worker processes; as ``app.serve``, returns the exit code."""
    sockets: dict[str, list[socket.socket]] = {}
    try:
        if opts.http is not None:
            if opts.http.kind == "granian":
                raise StartupError("--workers needs the builtin or hypercorn HTTP server (not granian)")
            sockets["HTTP"] = _listeners("HTTP", opts.http.host, opts.http.port, opts.workers)
        if opts.grpc is not None:
            if opts.grpc.kind != "builtin":
                raise StartupError("--workers needs the builtin gRPC server (not --grpc-server grpcio)")
            sockets["gRPC"] = _listeners("gRPC", opts.grpc.host, opts.grpc.port, opts.workers)
    except StartupError as e:
        for group in sockets.values():
            for s in group:
                s.close()
        await server.shutdown(timeout_s=0)
        observability.close()
        log.error("%s", e)
        return 1
    pool = WorkerPool(server, opts, sockets)
    shutdown = Shutdown(server, on_drain=pool.begin_drain, before_drain=pool.announce_drain)
    handle_signals(shutdown)
    # the metrics endpoint, with every worker's front-end counts
    front_ends = FrontEnds(server, StreamDrain(), observability, front_end_metrics=pool.front_end_metrics)
    try:
        # /metrics first: a client that found the workers ready may scrape at once
        await front_ends.start(replace(opts, http=None, grpc=None))
        await pool.start()
    except StartupError as e:
        await pool.stop()
        await front_ends.abort()
        await server.shutdown(timeout_s=0)
        observability.close()
        log.error("%s", e)
        return 1
    log.info("%d front-end worker processes serve HTTP and gRPC", opts.workers)
    log.info("seqserve %s ready", __version__)  # the line tools wait for, as with one process
    await shutdown.requested.wait()
    await server.shutdown()
    await server.linger_while_requested()
    await pool.stop()
    await front_ends.stop()
    shutdown_executor()
    await asyncio.to_thread(observability.close)
    if server.hung_instances:
        hung = ", ".join(f"model '{m}' instance '{i}'" for m, i in server.hung_instances)
        log.error("stopped; exiting without waiting for %s (still in execute)", hung)
        exit_now(1)
    log.info("stopped")
    return 0


def _listeners(what: str, host: str, port: int, n: int) -> list[socket.socket]:
    """One listening socket per worker on the same port (SO_REUSEPORT): the kernel spreads new
    connections over them. The first is bound as a single process binds (port 0 picks the port
    the others take; a busy port ends startup); a dead worker's socket stays open in the engine
    process, its waiting connections kept for the worker that replaces it."""
    first = listen(what, host, port, reuse_port=True)
    out = [first]
    try:
        bound = first.getsockname()[1]
        for _ in range(n - 1):
            out.append(listen(what, host, bound, reuse_port=True))
    except StartupError:
        for s in out:
            s.close()
        raise
    return out


@dataclass(slots=True)
class WorkerProcess:
    index: int
    process: asyncio.subprocess.Process
    channel: Channel
    tasks: list[asyncio.Task[Any]]


class WorkerPool:
    """The worker processes and what the engine does for them."""

    def __init__(self, server: Server, opts: ServeOptions, sockets: dict[str, list[socket.socket]]) -> None:
        self._server = server
        self._opts = opts
        self._sockets = sockets
        self._region = ShmRegion(workers=opts.workers, slab_classes=SLAB_CLASSES)
        self._slow = SlowPath(server, self._region, self._send)
        # the engine's compiled path: records of plain requests go straight into the models'
        # schedulers; the rest wait in take_slow() for the SlowPath
        self._feeder = RingFeeder(self._region)
        self._targets = Targets(self._feeder, self._fast_allowed)
        self._restarts = [0] * opts.workers
        self._snapshot = Snapshot()
        self._workers: list[WorkerProcess | None] = [None] * opts.workers
        # workers between their init message and "ready": they hear the snapshots and drain
        # notices too (a worker that starts while the drain begins must not miss it)
        self._starting: dict[int, Channel] = {}
        self._stopping = False
        self._snapshot_task: asyncio.Task[None] | None = None
        self._shared_memory = SharedMemoryRegistry()  # the engine's regions (relayed registrations)
        self._answers = _engine_answers(server, opts, self._shared_memory)
        self._background: set[asyncio.Task[Any]] = set()
        self._counts = WorkerCounts()
        self.front_end_metrics = self._counts.metrics

    async def start(self) -> None:
        feeder = self._feeder
        os.set_blocking(feeder.slow_fd, False)
        asyncio.get_running_loop().add_reader(feeder.slow_fd, self._take_slow)
        self._snapshot = self._targets.snapshot(self._server, self._shared_memory)
        await asyncio.gather(*(self._spawn(w) for w in range(self._opts.workers)))
        self._snapshot_task = asyncio.create_task(self._watch_snapshot())

    async def _spawn(self, w: int) -> None:
        region = self._region
        parent_end, child_end = socket.socketpair()
        fds = [region.fd, region.engine_eventfd, *region.worker_eventfds, child_end.fileno()]
        fds += [group[w].fileno() for group in self._sockets.values()]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "seqserve.api.workers.worker",
            str(w),
            str(child_end.fileno()),
            pass_fds=fds,
            stdin=asyncio.subprocess.DEVNULL,
        )
        child_end.close()
        channel = await Channel.open(parent_end)
        channel.send(("init", self._init_message(w)))
        self._starting[w] = channel
        try:
            message = await asyncio.wait_for(channel.receive(), WORKER_START_TIMEOUT_S)
        except (ChannelClosed, asyncio.TimeoutError):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            code = await process.wait()
            raise StartupError(f"worker {w} failed to start (exit status {code})") from None
        finally:
            self._starting.pop(w, None)
        log.info("worker %d started (pid %d)", w, message[1])
        wp = WorkerProcess(w, process, channel, [])
        self._workers[w] = wp
        wp.tasks.append(asyncio.create_task(self._serve(wp)))
        wp.tasks.append(asyncio.create_task(self._watch(wp)))

    def _fast_allowed(self) -> bool:
        """Whether the server lets requests skip its Python: not while it traces, keeps a state
        store or has replicas (they see every request)."""
        server = self._server
        return server.tracer is None and self._opts.state_store is None and server.replicas is None

    def _take_slow(self) -> None:
        self._slow.handle_records(self._feeder.take_slow())

    def _init_message(self, w: int) -> dict[str, Any]:
        region = self._region
        opts = self._opts
        redact = []
        for front_end in (opts.http, opts.grpc):
            if front_end is not None:
                redact += [front_end.restricted[g].value for g in front_end.restricted]
        return {
            "opts": opts,
            "log_settings": log_control.settings,
            "redact": redact,
            "engine_pid": os.getpid(),
            "region_fd": region.fd,
            "engine_eventfd": region.engine_eventfd,
            "worker_eventfds": region.worker_eventfds,
            "sockets": {what: group[w].fileno() for what, group in self._sockets.items()},
            "snapshot": self._snapshot,
            "handle_base": self._restarts[w] * HANDLE_GENERATION,
        }

    # ------------------------------------------------------------------ one worker

    def _tell_all(self, message: Any) -> None:
        """A one-way message to every worker, those still starting included."""
        for wp in self._workers:
            if wp is not None:
                wp.channel.send(message)
        for channel in self._starting.values():
            channel.send(message)

    def _send(self, w: int, message: Any) -> None:
        wp = self._workers[w]
        if wp is not None:
            wp.channel.send(message)

    async def _serve(self, wp: WorkerProcess) -> None:
        """What the worker sends: calls to answer, requests too large for the rings, the end
        of its streams' scopes."""
        w = wp.index
        while True:
            try:
                message = await wp.channel.receive()
            except ChannelClosed:
                return
            kind = message[0]
            if kind == "call":
                task = asyncio.create_task(self._answer(wp, message[1], message[2], message[3]))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            elif kind == "infer":
                _, handle, head, parts, fields = message
                self._slow.submit_parts(w, handle, head, dict(enumerate(parts)), fields)
            elif kind == "scope_close":
                self._slow.close_scope(w, message[1], message[2])
            elif kind == "counts":
                self._counts.record(w, message[1])

    async def _answer(self, wp: WorkerProcess, call_id: int, kind: str, payload: Any) -> None:
        result: Any
        try:
            if kind == "http":
                result = await self._answers.http(payload)
            else:
                result = await self._answers.grpc(payload)
        except Exception as e:  # the handlers answer their errors themselves: this is a bug
            log.exception("answering a relayed %s request failed", kind)
            if kind == "http":
                result = (500, [(b"content-type", b"text/plain")], f"internal error: {e}".encode(), False)
            else:
                result = (Status.INTERNAL, f"internal error: {e}")
        self._refresh_snapshot()  # a model loaded or unloaded: every worker knows before the answer
        wp.channel.answer(call_id, result)

    async def _watch(self, wp: WorkerProcess) -> None:
        """A worker that dies is replaced once nothing of it is left in the engine."""
        code = await wp.process.wait()
        if self._stopping:
            return
        w = wp.index
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        log.error("worker %d (pid %d) %s; starting a new one", w, wp.process.pid, how)
        self._workers[w] = None
        wp.channel.close()
        self._restarts[w] += 1
        await self._forget_worker(w)
        while not self._stopping:
            try:
                await self._spawn(w)
                return
            except StartupError as e:
                log.error("%s; trying again", e)
                await asyncio.sleep(RESTART_BACKOFF_S)

    async def _forget_worker(self, w: int) -> None:
        """Nothing of a dead worker stays in the engine: its slow records are run and cancelled,
        its compiled-path requests finish (their replies dropped), then its rings are reset."""
        feeder = self._feeder
        feeder.forget_worker(w)
        await asyncio.sleep(0.05)  # the drain thread takes what the worker left in its ring
        self._take_slow()
        self._slow.forget_worker(w)
        deadline = asyncio.get_running_loop().time() + DEAD_WORKER_DRAIN_S
        while feeder.inflight(w) or self._slow.running(w):
            if asyncio.get_running_loop().time() > deadline:
                log.warning("worker %d: requests still running in the engine; resetting its rings anyway", w)
                break
            await asyncio.sleep(0.01)
            self._take_slow()
            self._slow.forget_worker(w)
        feeder.reset_worker(w)

    # ---------------------------------------------------------------------- snapshot

    def _refresh_snapshot(self) -> None:
        snapshot = self._targets.snapshot(self._server, self._shared_memory)
        if snapshot != self._snapshot:
            self._snapshot = snapshot
            self._tell_all(("snapshot", snapshot))

    async def _watch_snapshot(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_EVERY_S)
            self._refresh_snapshot()

    # ------------------------------------------------------------------------ drain

    def announce_drain(self) -> None:
        """The engine's drain is about to begin: every worker answers as exiting from now on.
        Sent before any model is retired, since the compiled path answers a retired model's
        requests from its own thread, while this loop is still in the signal handler."""
        self._tell_all(("exiting",))

    def begin_drain(self) -> None:
        """The engine's drain began: the workers answer as draining, their streams end."""
        self._tell_all(("drain", self._opts.state_store is not None))
        try:
            self._refresh_snapshot()
        except Exception:  # called by the signal handler: the drain must go on
            log.exception("cannot tell the workers that the drain began")

    async def stop(self) -> None:
        """After the engine's drain: each worker stops its front-ends and exits."""
        self._stopping = True
        if self._snapshot_task is not None:
            self._snapshot_task.cancel()
        running = [wp for wp in self._workers if wp is not None]
        for wp in running:
            wp.channel.send(("stop",))
        await asyncio.gather(*(self._reap(wp) for wp in running))
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._feeder.slow_fd)
        await asyncio.to_thread(self._feeder.close)
        counts = self._feeder.counters()
        log.info(
            "the workers' rings carried %d requests to the engine's compiled path and %d to its Python path",
            counts.get("fast", 0),
            counts.get("slow", 0),
        )
        for group in self._sockets.values():
            for s in group:
                s.close()
        self._shared_memory.close()

    async def _reap(self, wp: WorkerProcess) -> None:
        try:
            await asyncio.wait_for(wp.process.wait(), GRPC_STOP_GRACE_S + WORKER_STOP_GRACE_S)
        except asyncio.TimeoutError:
            log.warning("worker %d (pid %d) did not stop; killing it", wp.index, wp.process.pid)
            with contextlib.suppress(ProcessLookupError):
                wp.process.kill()
            await wp.process.wait()
        for t in wp.tasks:
            t.cancel()


class WorkerCounts:
    """The front-end counts each worker last sent, summed for /metrics (``FrontEndMetrics``
    reads them as it reads one process's own)."""

    def __init__(self) -> None:
        self._by_worker: dict[int, FrontEndCounts] = {}
        self.metrics = FrontEndMetrics({}, None)

    def record(self, worker: int, counts: FrontEndCounts) -> None:
        self._by_worker[worker] = counts
        admissions: dict[str, ConnectionAdmission] = {}
        stats = StreamStats() if any(c.streams is not None for c in self._by_worker.values()) else None
        ring_full = [c.ring_full for c in self._by_worker.values()]
        self.metrics.ring_full = (sum(n for n, _ in ring_full), sum(s for _, s in ring_full))
        for c in self._by_worker.values():
            for protocol, (total, refused) in c.connections.items():
                a = admissions.setdefault(protocol, ConnectionAdmission(0))
                a.total += total
                for reason, n in refused.items():
                    a.refused[reason] = a.refused.get(reason, 0) + n
            if stats is not None and c.streams is not None:
                stats.refused_at_once += c.streams[0]
                stats.reading_paused += c.streams[1]
        self.metrics.admissions = admissions
        self.metrics.stream_stats = stats


def _engine_answers(server: Server, opts: ServeOptions, shared_memory: SharedMemoryRegistry) -> EngineAnswers:
    """The engine's own handlers, as one process builds them (restrictions are the workers')."""
    http = None
    if opts.http is not None:
        http = HttpFrontend(
            server,
            max_body_bytes=opts.http.max_body_bytes,
            body_timeout_s=opts.http.limits.body_timeout_s,
            shared_memory=shared_memory,
            header_forward=opts.http.header_forward,
        )
    methods = {}
    if opts.grpc is not None:
        grpc = opts.grpc
        inference = InferenceServicer(
            server,
            stream_scoped=grpc.stream_scoped,
            stream_stats=StreamStats(),
            streams=StreamDrain(),
            shared_memory=shared_memory,
            header_forward=grpc.header_forward,
            stream_backlog=grpc.limits.stream_backlog,
        )
        methods = method_table(inference, HealthServicer(server))
    return EngineAnswers(http, methods)
