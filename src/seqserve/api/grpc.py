"""KServe v2 / Triton gRPC front-end (grpc.aio), on the same loop as the HTTP server: the
servicer, a thin adapter from the rpcs to ``engine.Server``. Messages are converted by
``grpc_codec``; a ModelStreamInfer call is a ``grpc_stream.StreamSession``."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from seqserve._proto import health_pb2, health_pb2_grpc
from seqserve.api import grpc_codec, grpc_wire, security
from seqserve.api.errors import internal_error
from seqserve.api.grpc_builtin import BuiltinGrpcServer, Method, methods_of
from seqserve.api.grpc_codec import Undecodable
from seqserve.api.grpc_stream import (
    REPLY_ORDER_HEADER,
    STREAM_SCOPED_HEADER,
    StreamDrain,
    StreamSession,
    StreamStats,
)
from seqserve.api.kserve import EXTENSIONS, SESSION_END_KEY, SESSION_ID_KEY, apply_session, clip, enqueue_single
from seqserve.api.limits import offload
from seqserve.api.serve_options import GrpcOptions
from seqserve.api.statistics import statistics_proto
from seqserve.engine import Code, InferenceError, SequenceScope, Server

GRPC_STATUS = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}


#: rpcs that take and return bytes: grpcio calls no (de)serializer, the servicer parses the
#: request itself and encodes the reply with ``grpc_wire``
RAW_RPCS = frozenset({"ModelInfer", "ModelStreamInfer"})


#: what the requests still queued in a stream-scoped sequence are told when its stream closes
_STREAM_CLOSED = "the gRPC stream that started it was closed"


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        server: Server,
        *,
        stream_scoped: bool = False,
        stream_stats: StreamStats | None = None,
        streams: StreamDrain | None = None,
    ) -> None:
        """stream_scoped: sequences started on a ModelStreamInfer stream end when it closes,
        unless the stream says otherwise (``seqserve-stream-scoped`` header). ``streams``: the
        open streams, which the shutdown ends with UNAVAILABLE (see ``StreamDrain``)."""
        self.server = server
        self.stream_scoped = stream_scoped
        self.stream_stats = stream_stats if stream_stats is not None else StreamStats()
        self.streams = streams if streams is not None else StreamDrain()

    async def _fail(self, context: grpc.aio.ServicerContext, e: InferenceError) -> None:
        # The message travels in a trailer: clients drop trailers over 16 KiB, so a message that
        # quotes a huge client string must be cut or the client never sees the answer.
        await context.abort(GRPC_STATUS.get(e.code, grpc.StatusCode.UNKNOWN), clip(e.message, 4000))

    # ------------------------------------------------------------------------- health

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.server.is_live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.server.is_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        # An unknown model is "not ready", not an error: is_model_ready() must not raise.
        return pb.ModelReadyResponse(ready=self.server.is_model_ready(request.name, request.version))

    # ----------------------------------------------------------------------- metadata

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        meta = self.server.metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        try:
            meta = self.server.model_metadata(request.name, request.version)
        except InferenceError as e:
            await self._fail(context, e)
            raise
        resp = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for t in meta["inputs"]:
            resp.inputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for t in meta["outputs"]:
            resp.outputs.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return resp

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        try:
            cfg = self.server.model_config(request.name, request.version)
        except InferenceError as e:
            await self._fail(context, e)
            raise
        resp = pb.ModelConfigResponse()
        resp.config.CopyFrom(cfg)
        return resp

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        try:
            stats = self.server.statistics(request.name, request.version)
        except InferenceError:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"requested model '{clip(request.name)}' is not available"
            )
            raise
        return statistics_proto(stats)

    # --------------------------------------------------------------------- repository

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        resp = pb.RepositoryIndexResponse()
        for e in self.server.repository_index():
            if request.ready and e["state"] != "READY":
                continue
            resp.models.add(name=e["name"], version=e["version"], state=e["state"], reason=e["reason"])
        return resp

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        config = None
        files: dict[str, bytes] = {}
        for key in request.parameters:
            p = request.parameters[key]
            if key == "config":
                config = p.string_param
            elif key.startswith("file:"):
                files[key[len("file:") :]] = p.bytes_param
        try:
            await self.server.request_load_model(request.model_name, config_json=config, files=files or None)
        except InferenceError as e:
            await self._fail(context, e)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        try:
            await self.server.request_unload_model(request.model_name)
        except InferenceError as e:
            await self._fail(context, e)
        return pb.RepositoryModelUnloadResponse()

    # -------------------------------------------------------------------------- infer

    async def ModelInfer(self, request: bytes | pb.ModelInferRequest, context: Any) -> bytes:
        """Registered with no deserializer and no serializer (``RAW_RPCS``): the request comes as
        bytes (or, called directly, as a message) and the reply goes back as bytes, encoded by
        ``grpc_wire`` without building a response message."""
        try:
            msg = grpc_codec.parse_infer_request(request) if isinstance(request, bytes) else request
            if isinstance(msg, Undecodable):
                raise msg.error()
            try:
                infer_request, _ = grpc_codec.decode_request(msg, inline=True)
            except grpc_codec.DecodeOffLoop:
                infer_request, _ = await offload(grpc_codec.decode_request, msg)
            metadata = context.invocation_metadata()
            if metadata:
                session = end = None
                for key, value in metadata:
                    if key == SESSION_ID_KEY:
                        session = value
                    elif key == SESSION_END_KEY:
                        end = value
                if session is not None or end is not None:
                    apply_session(self.server, infer_request, session, end)
            result = await enqueue_single(self.server, infer_request, "ModelInfer RPC")
            return grpc_wire.infer_response(result)
        except InferenceError as e:
            err = e
        except Exception as e:
            err = internal_error("gRPC ModelInfer", e)
        await self._fail(context, err)
        raise AssertionError("unreachable: abort raises")

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """See StreamSession. Headers: ``triton_grpc_error: true``, the first error ends the
        stream with its gRPC status; ``seqserve-reply-order: completion``, replies as they
        complete; ``seqserve-stream-scoped: true|false``, whether the sequences started on the
        stream end when it closes (default: the server's ``--stream-scoped-sequences``).

        While the server drains, a new stream gets UNAVAILABLE at once, and an open one ends
        with UNAVAILABLE once every request it submitted is answered (``StreamDrain``)."""
        if self.streams.refusal is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.streams.refusal)
        grpc_errors = False
        completion_order = False
        scoped = self.stream_scoped
        for key, value in context.invocation_metadata() or ():
            if key == "triton_grpc_error":
                grpc_errors = value == "true"
            elif key == REPLY_ORDER_HEADER:
                if value.lower() not in ("request", "completion"):
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"header '{REPLY_ORDER_HEADER}' must be 'request' or 'completion', got '{value}'",
                    )
                completion_order = value.lower() == "completion"
            elif key == STREAM_SCOPED_HEADER:
                if value.lower() not in ("true", "false"):
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"header '{STREAM_SCOPED_HEADER}' must be 'true' or 'false', got '{value}'",
                    )
                scoped = value.lower() == "true"
        stats = self.stream_stats
        stats.streams += 1
        stats.completion_order_streams += completion_order
        stats.stream_scoped_streams += scoped
        session = StreamSession(
            self.server,
            grpc_errors=grpc_errors,
            completion_order=completion_order,
            scope=SequenceScope(_STREAM_CLOSED) if scoped else None,
            stats=stats,
        )
        self.streams.add(session)
        try:
            # The requests are read with context.read (what request_iterator wraps in an async
            # generator) and the replies taken in batches: two async-generator hops less per message.
            session.start_calls(context.read, grpc.aio.EOF)
            while (batch := await session.next_replies()) is not None:
                for reply in batch:
                    if type(reply) is bytes:
                        yield reply
                    else:  # triton_grpc_error: the stream ends here
                        await self._fail(context, reply)  # type: ignore[arg-type]
            if session.drain_reason is not None:  # every request it submitted is answered
                await context.abort(grpc.StatusCode.UNAVAILABLE, session.drain_reason)
        finally:
            session.close()
            self.streams.discard(session)


def _unimplemented(what: str) -> Any:
    async def rpc(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, what)

    return rpc


# Shared-memory, trace and log-settings RPCs answer UNIMPLEMENTED with a message that says why
# and what to do, instead of grpcio's bare "Method not implemented!".
for _rpc in (
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
):
    setattr(InferenceServicer, _rpc, _unimplemented(f"{_rpc}: {grpc_codec.NO_SHM}"))
for _rpc in ("TraceSetting", "LogSettings"):
    setattr(InferenceServicer, _rpc, _unimplemented(f"{_rpc}: seqserve does not implement this extension"))


def _guarded(name: str, behaviour: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    """A unary rpc that answers an undecodable request with INVALID_ARGUMENT and an unexpected
    exception with INTERNAL and a request id (grpcio would say UNKNOWN)."""

    async def rpc(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if type(request) is Undecodable:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            return await behaviour(request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as e:
            err = internal_error(f"gRPC {name}", e)
        await context.abort(grpc.StatusCode.INTERNAL, err.message)

    return rpc


def guard_rpcs(servicer: Any, service: Any) -> None:
    """Wrap the instance's unary rpcs of ``service`` (a ServiceDescriptor) in ``_guarded``:
    all but ModelInfer, which checks for itself (one frame less on the hot path). Done before
    the restrictions wrap them, so that a refusal comes first."""
    for method in service.methods:
        if not (method.client_streaming or method.server_streaming) and method.name != "ModelInfer":
            setattr(servicer, method.name, _guarded(method.name, getattr(servicer, method.name)))


def add_service(g: grpc.aio.Server, servicer: Any, service: Any) -> None:
    """Register ``servicer``'s methods for ``service`` (a ServiceDescriptor) on grpc.aio, as the
    generated ``add_*_to_server`` does, but with the builtin server's method table
    (``grpc_builtin.methods_of``): deserializers that hand undecodable bytes on as an
    ``Undecodable`` (see ``guard_rpcs``, ``ModelInfer`` and ``StreamSession``), ``RAW_RPCS``
    without (de)serializers, and as a generic handler only, none as a "registered method":
    grpc.aio keeps a pending request-call future per registered method and runs ``asyncio.wait``
    over them and the generic one for every incoming call: registering none measured 6% less
    server CPU per unary call than registering ModelInfer and ModelStreamInfer (bench/README.md,
    "Where a unary call's time goes"). The methods are read from the instance, so wrappers set on
    it before this call stay in place."""
    methods: dict[bytes, Method] = {}
    methods_of(servicer, service, methods, RAW_RPCS)
    handlers = {}
    for path, m in methods.items():
        kind = grpc.stream_stream_rpc_method_handler if m.streaming else grpc.unary_unary_rpc_method_handler
        handlers[path.decode().rsplit("/", 1)[1]] = kind(
            m.behaviour, request_deserializer=m.deserialize, response_serializer=m.serialize
        )
    g.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


class HealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self, server: Server) -> None:
        self.server = server

    async def Check(self, request: Any, context: Any) -> health_pb2.HealthCheckResponse:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.server.is_live()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


async def start_grpc(
    server: Server,
    front_end: GrpcOptions,
    *,
    stream_stats: StreamStats | None = None,
    streams: StreamDrain | None = None,
    sock: socket.socket | None = None,
) -> grpc.aio.Server | BuiltinGrpcServer:
    """Serve as ``front_end`` says: on its host and port (``sock``, bound and listening, for the
    builtin server), with its TLS, the rpcs of its restricted groups guarded
    (security.restrict_grpc), within its limits, on its kind of server: "builtin"
    (grpc_builtin) or "grpcio" (grpc.aio). Both have ``stop(grace)``."""
    restrictions, tls = front_end.restricted, front_end.tls
    inference = InferenceServicer(
        server, stream_scoped=front_end.stream_scoped, stream_stats=stream_stats, streams=streams
    )
    health = HealthServicer(server)
    inference_service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    health_service = health_pb2.DESCRIPTOR.services_by_name["Health"]
    guard_rpcs(inference, inference_service)
    guard_rpcs(health, health_service)
    if restrictions:
        security.restrict_grpc(inference, inference_service, restrictions)
        security.restrict_grpc(health, health_service, restrictions)
    if front_end.kind == "builtin":
        methods: dict[bytes, Method] = {}
        methods_of(inference, inference_service, methods, RAW_RPCS)
        methods_of(health, health_service, methods, ())
        builtin = BuiltinGrpcServer(
            methods, front_end.limits, ssl_context=None if tls is None else security.builtin_tls(tls, alpn="h2")
        )
        if sock is None:
            sock = socket.create_server((front_end.host, front_end.port), backlog=1024)
        await builtin.start(sock)
        return builtin
    options = [*front_end.limits.options(), ("grpc.so_reuseport", 0)]
    g = grpc.aio.server(options=options)
    add_service(g, inference, inference_service)
    add_service(g, health, health_service)
    address = f"{front_end.host}:{front_end.port}"
    if tls is not None:
        bound = g.add_secure_port(address, security.grpc_credentials(tls))
    else:
        bound = g.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"gRPC: cannot bind {address}")
    await g.start()
    return g
