"""A front-end worker process (``python -m seqserve.api.workers.worker INDEX CONTROL_FD``),
started by the engine process of ``seqserve serve --workers N``: it runs the HTTP and gRPC
front-ends on the listening sockets the engine bound, sends inference requests through its
rings and relays everything else. It ends when the engine says so (after the engine's drain)
or when the engine is gone."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import replace
from typing import Any, cast

from seqserve.api import security
from seqserve.api.app import FrontEndParts, FrontEnds, StartupError, exit_now
from seqserve.api.grpc.methods import methods_of
from seqserve.api.grpc.serve import HEALTH_SERVICE, INFERENCE_SERVICE
from seqserve.api.grpc.servicer import CHECKS_ITSELF, UNIMPLEMENTED_RPCS, InferenceServicer
from seqserve.api.grpc.stream import StreamDrain, StreamStats
from seqserve.api.http.routes import HttpFrontend, close_when_exiting
from seqserve.api.limits import ConnectionAdmission
from seqserve.api.logs import log_control
from seqserve.api.serve_options import GrpcOptions, HttpOptions, ServeOptions
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.transport.exchange import Handler
from seqserve.api.transport.read_gate import ReadGate
from seqserve.api.workers.channel import Channel, ChannelClosed
from seqserve.api.workers.relay import RelayingServicer, WorkerHttp, raw_rpcs
from seqserve.api.workers.remote_engine import RemoteEngine
from seqserve.api.workers.ring_client import RingClient
from seqserve.api.workers.snapshot import FrontEndCounts, Snapshot, mirror_regions
from seqserve.engine import Server
from seqserve.engine.workers import ShmRegion

log = logging.getLogger("seqserve")


class WorkerParts(FrontEndParts):
    """The front-ends of a worker: infer here, the rest relayed to the engine."""

    def __init__(self, control: Channel, read_gate: ReadGate) -> None:
        self._control = control
        self.read_gate = read_gate  # closed while the request ring is full: no connection reads

    def http_handler(self, server: Server, http: HttpOptions, shared_memory: SharedMemoryRegistry) -> Handler:
        frontend = HttpFrontend(
            server,
            max_body_bytes=http.max_body_bytes,
            body_timeout_s=http.limits.body_timeout_s,
            shared_memory=shared_memory,
            header_forward=http.header_forward,
        )
        handler = security.restrict_http(
            WorkerHttp(frontend, self._control).handle,
            http.restricted,
            max_body_bytes=http.max_body_bytes,
            body_timeout_s=http.limits.body_timeout_s,
        )
        return close_when_exiting(handler, server)

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
        from seqserve.api.transport.grpc_server import BuiltinGrpcServer

        if sock is None:
            raise StartupError("--workers needs the builtin gRPC server (--grpc-server builtin)")
        local = InferenceServicer(
            server,
            stream_scoped=grpc.stream_scoped,
            stream_stats=stream_stats,
            streams=streams,
            shared_memory=shared_memory,
            header_forward=grpc.header_forward,
            stream_backlog=grpc.limits.stream_backlog,
        )
        restrictions = grpc.restricted
        methods = {
            **methods_of(
                RelayingServicer(local, self._control, INFERENCE_SERVICE.full_name),
                INFERENCE_SERVICE,
                raw=raw_rpcs(INFERENCE_SERVICE),
                unimplemented=UNIMPLEMENTED_RPCS,
                guarded=True,
                checks_itself=CHECKS_ITSELF,
                restrictions=restrictions,
            ),
            **methods_of(
                RelayingServicer(None, self._control, HEALTH_SERVICE.full_name),
                HEALTH_SERVICE,
                raw=raw_rpcs(HEALTH_SERVICE),
                guarded=True,
                restrictions=restrictions,
            ),
        }
        tls = grpc.tls
        builtin = BuiltinGrpcServer(
            methods,
            grpc.limits,
            ssl_context=None if tls is None else security.builtin_tls(tls, alpn="h2"),
            admission=admission,
            read_gate=self.read_gate,
        )
        await builtin.start(sock)
        return builtin


async def run_worker(index: int, control_fd: int) -> int:
    control = await Channel.open(socket.socket(fileno=control_fd))
    kind, init = await control.receive()
    assert kind == "init"
    opts: ServeOptions = init["opts"]
    log_control.configure(init["log_settings"])
    log_control.redact.add(*init["redact"])
    engine_pid: int = init["engine_pid"]
    region = ShmRegion.attach(init["region_fd"], init["engine_eventfd"], init["worker_eventfds"])
    ring = RingClient(region, index, control, init.get("handle_base", 0), ReadGate())
    engine = RemoteEngine(ring, control, init["snapshot"])
    streams = StreamDrain()
    sockets = {what: socket.socket(fileno=fd) for what, fd in init["sockets"].items()}
    front_ends = FrontEnds(cast(Server, engine), streams, sockets=sockets, parts=WorkerParts(control, ring.read_gate))
    mirror_regions(front_ends.shared_memory, engine.snapshot.regions)

    def take_at_once(message: Any) -> bool:
        """The engine's snapshots, drain notices and whole replies, applied as they are read."""
        kind = message[0]
        if kind == "snapshot":
            snapshot = cast(Snapshot, message[1])
            if snapshot.regions != engine.snapshot.regions:
                mirror_regions(front_ends.shared_memory, snapshot.regions)
            engine.update(snapshot)
        elif kind == "reply":
            _, handle, head, parts, final = message
            ring.deliver_whole(handle, head, parts, final)
        elif kind == "exiting":
            engine.note_exiting()
        elif kind == "drain":
            streams.begin(handoff=message[1])
        else:
            return False
        return True

    # from now on, and for what came since the init message (the engine tells starting workers too)
    control.take_with(take_at_once)
    ring.start()
    try:
        await front_ends.start(replace(opts, metrics=None))
    except StartupError as e:
        log.error("worker %d: %s", index, e)
        return 1
    control.send(("ready", os.getpid()))
    counting = asyncio.create_task(_send_counts(front_ends, ring.read_gate, control))

    while True:
        try:
            message = await control.receive()
        except ChannelClosed:
            ring.fail_all("the engine process is gone")
            log.error(
                "worker %d (pid %d): the engine process (pid %d) is gone; exiting", index, os.getpid(), engine_pid
            )
            exit_now(1)
        kind = message[0]
        if kind == "stop":
            counting.cancel()
            await front_ends.stop()
            ring.stop()
            # at once: the engine's exit backstop is running, and nothing here needs a teardown
            exit_now(0)


#: how often a worker sends its front-end counts (when they changed) for /metrics
COUNTS_EVERY_S = 0.5


async def _send_counts(front_ends: FrontEnds, gate: ReadGate, control: Channel) -> None:
    last = None
    while True:
        stats = front_ends.stream_stats
        counts = FrontEndCounts(
            {p: (a.total, dict(a.refused)) for p, a in front_ends.admissions.items()},
            None if stats is None else (stats.refused_at_once, stats.reading_paused),
            (gate.closings, round(gate.closed_for(), 3)),
        )
        if counts != last:
            control.send(("counts", counts))
            last = counts
        await asyncio.sleep(COUNTS_EVERY_S)


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the whole process group and a supervisor's SIGTERM may too: the engine
    # process alone decides when the workers stop (after its drain)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    index, control_fd = int(argv[1]), int(argv[2])
    try:
        import uvloop

        return uvloop.run(run_worker(index, control_fd))
    except ImportError:
        return asyncio.run(run_worker(index, control_fd))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
