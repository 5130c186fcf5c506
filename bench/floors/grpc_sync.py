"""gRPC floor on grpcio's *synchronous* server (a thread pool), for the gRPC unary question.

    python bench/floors/grpc_sync.py PORT [--host 127.0.0.1] [--handoff]

Serves what ``grpc_stream.py`` serves (ModelInfer echoes the first input; readiness and metadata
answer as for any model), from grpcio's ``grpc.server`` with 16 worker threads instead of
grpc.aio. With ``--handoff`` each ModelInfer reply is made on an asyncio event loop running in
another thread, and the handler thread waits for it: the least a design on the synchronous server
pays to reach an engine that lives on an event loop (seqserve's does; see bench/docs/front-ends.md, "gRPC
unary: the floors of each way to serve it").
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from concurrent import futures
from typing import Any

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from bench.floors.common import result_of
from bench.floors.grpc_stream import FloorServicer, reply
from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc

WORKERS = 16


class SyncFloorServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._floor = FloorServicer()
        self._loop = loop  # --handoff: replies are made there

    def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return result_of(self._floor.ServerLive(request, context))

    def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return result_of(self._floor.ServerReady(request, context))

    def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return result_of(self._floor.ModelReady(request, context))

    def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return result_of(self._floor.ServerMetadata(request, context))

    def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        return result_of(self._floor.ModelMetadata(request, context))

    def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        if self._loop is None:
            return reply(request)
        done: futures.Future[pb.ModelInferResponse] = futures.Future()
        self._loop.call_soon_threadsafe(_reply_into, done, request)
        return done.result()


def _reply_into(done: futures.Future[pb.ModelInferResponse], request: pb.ModelInferRequest) -> None:
    """On the loop's thread: the reply, or what went wrong, for the waiting handler thread."""
    try:
        done.set_result(reply(request))
    except Exception as e:
        done.set_exception(e)


def _loop_thread() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - the bench extra installs it
        loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="floor-loop", daemon=True).start()
    return loop


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="grpc_sync.py", description=__doc__.split("\n\n")[0])
    p.add_argument("port", type=int)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--handoff", action="store_true", help="make each ModelInfer reply on an event loop thread")
    args = p.parse_args(argv)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS), options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(
        SyncFloorServicer(_loop_thread() if args.handoff else None), server
    )
    if server.add_insecure_port(f"{args.host}:{args.port}") == 0:
        raise SystemExit(f"floor: cannot bind {args.host}:{args.port}")
    server.start()
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
