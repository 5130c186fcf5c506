"""gRPC floor on seqserve's builtin server: ``python bench/floors/grpc_builtin.py PORT [--host H]``.

The servicer is :class:`bench.floors.grpc_stream.FloorServicer` (decode, echo, encode), served
the way seqserve serves gRPC by default: ``seqserve.api.transport.grpc_server.BuiltinGrpcServer`` (HTTP/2
on the event loop) on uvloop, with its default limits, so the floor's CPU per step compares with
seqserve's and with grpc.aio's floor (``grpc-stream``).
"""

from __future__ import annotations

import socket
import sys

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors import common


async def serve(host: str, port: int) -> None:
    from bench.floors.grpc_stream import FloorServicer
    from seqserve._proto import grpc_service_pb2 as pb
    from seqserve.api.grpc.methods import methods_of
    from seqserve.api.limits import GrpcLimits
    from seqserve.api.transport.grpc_server import BuiltinGrpcServer

    methods = methods_of(FloorServicer(), pb.DESCRIPTOR.services_by_name["GRPCInferenceService"])
    server = BuiltinGrpcServer(methods, GrpcLimits())
    await server.start(socket.create_server((host, port), backlog=1024))
    stop = common.stop_on_signal()
    await stop.wait()
    await server.stop(0.5)


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("grpc_builtin.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
