"""Start the gRPC front-end: the servicers' method table (``methods.methods_of``, with the
guards and restrictions composed once) served by the builtin server (the default) or by
grpc.aio (``--grpc-server grpcio``)."""

from __future__ import annotations

import socket
from collections.abc import Mapping

import grpc

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import health_pb2
from seqserve.api import security
from seqserve.api.grpc import aio
from seqserve.api.grpc.methods import methods_of
from seqserve.api.grpc.servicer import (
    CHECKS_ITSELF,
    RAW_RPCS,
    UNIMPLEMENTED_RPCS,
    HealthServicer,
    InferenceServicer,
)
from seqserve.api.grpc.stream import StreamDrain, StreamStats
from seqserve.api.limits import ConnectionAdmission
from seqserve.api.serve_options import GrpcOptions
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.transport.grpc_context import Method
from seqserve.api.transport.grpc_server import BuiltinGrpcServer
from seqserve.engine import Server

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]


def method_table(
    inference: InferenceServicer,
    health: HealthServicer,
    restrictions: Mapping[str, security.Restriction] | None = None,
) -> dict[bytes, Method]:
    """Every rpc of both services by path, as both servers serve them."""
    return {
        **methods_of(
            inference,
            INFERENCE_SERVICE,
            raw=RAW_RPCS,
            unimplemented=UNIMPLEMENTED_RPCS,
            guarded=True,
            checks_itself=CHECKS_ITSELF,
            restrictions=restrictions,
        ),
        **methods_of(health, HEALTH_SERVICE, guarded=True, restrictions=restrictions),
    }


async def start_grpc(
    server: Server,
    front_end: GrpcOptions,
    *,
    stream_stats: StreamStats | None = None,
    streams: StreamDrain | None = None,
    sock: socket.socket | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
    admission: ConnectionAdmission | None = None,
) -> grpc.aio.Server | BuiltinGrpcServer:
    """Serve as ``front_end`` says: on its host and port (``sock``, bound and listening, for the
    builtin server), with its TLS, the rpcs of its restricted groups guarded
    (security.restrict_grpc), within its limits, on its kind of server: "builtin"
    (api/transport) or "grpcio" (grpc.aio). Both have ``stop(grace)``. ``admission``: the
    builtin server's connection caps, shared with the metrics (grpc.aio has none)."""
    limits, tls = front_end.limits, front_end.tls
    inference = InferenceServicer(
        server,
        stream_scoped=front_end.stream_scoped,
        stream_stats=stream_stats,
        streams=streams,
        shared_memory=shared_memory,
        header_forward=front_end.header_forward,
        stream_backlog=limits.stream_backlog,
    )
    methods = method_table(inference, HealthServicer(server), front_end.restricted)
    if front_end.kind == "builtin":
        builtin = BuiltinGrpcServer(
            methods,
            limits,
            ssl_context=None if tls is None else security.builtin_tls(tls, alpn="h2"),
            admission=admission,
        )
        if sock is None:
            sock = socket.create_server((front_end.host, front_end.port), backlog=1024)
        await builtin.start(sock)
        return builtin
    options = [*limits.options(), ("grpc.so_reuseport", 0)]
    g = grpc.aio.server(options=options)
    aio.add_service(g, INFERENCE_SERVICE, methods)
    aio.add_service(g, HEALTH_SERVICE, methods)
    address = f"{front_end.host}:{front_end.port}"
    if tls is not None:
        bound = g.add_secure_port(address, security.grpc_credentials(tls))
    else:
        bound = g.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"gRPC: cannot bind {address}")
    await g.start()
    return g
