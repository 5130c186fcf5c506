"""The KServe v2 / Triton gRPC servicers, thin adapters from the rpcs to ``engine.Server``,
served by either gRPC server (``serve.start_grpc``) through the method table
(``methods.methods_of``). Requests are decoded by ``codec``, hot replies encoded by ``wire``;
a ModelStreamInfer call is a ``stream.StreamSession``. The servicers see seqserve's
``CallContext`` and end a call with a status by raising ``CallAborted`` (``status``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from seqserve._proto import health_pb2, health_pb2_grpc
from seqserve.api.grpc import codec, wire
from seqserve.api.grpc.codec import Undecodable
from seqserve.api.grpc.shared_memory_rpcs import SharedMemoryRpcs, placed_entries
from seqserve.api.grpc.status import aborted, unexpected
from seqserve.api.grpc.stream import (
    REPLY_ORDER_HEADER,
    STREAM_SCOPED_HEADER,
    StreamDrain,
    StreamSession,
    StreamStats,
)
from seqserve.api.header_forward import forward_headers, forwarded_metadata
from seqserve.api.kserve import EXTENSIONS, SESSION_END_KEY, SESSION_ID_KEY, apply_session, clip, enqueue_single
from seqserve.api.limits import DEFAULT_GRPC_STREAM_BACKLOG, offload
from seqserve.api.logs import log_settings_request
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.statistics import statistics_proto
from seqserve.api.tracing import grpc_trace_setting
from seqserve.api.transport.grpc_context import CallAborted, CallContext, Status
from seqserve.engine import InferenceError, SequenceScope, Server, peer_host

#: rpcs that take and return bytes: the server calls no (de)serializer, the servicer parses the
#: request itself and encodes the reply with ``wire``
RAW_RPCS = frozenset({"ModelInfer", "ModelStreamInfer"})
#: unary rpcs that answer any unexpected exception themselves (one frame less on the hot path)
CHECKS_ITSELF = frozenset({"ModelInfer"})

#: rpcs answered UNIMPLEMENTED with a message that says why and what to do, instead of
#: grpcio's bare "Method not implemented!"
UNIMPLEMENTED_RPCS: dict[str, str] = {}  # every rpc of Triton's service is served now


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
        shared_memory: SharedMemoryRegistry | None = None,
        header_forward: re.Pattern[str] | None = None,
        stream_backlog: int = DEFAULT_GRPC_STREAM_BACKLOG,
    ) -> None:
        """stream_scoped: sequences started on a ModelStreamInfer stream end when it closes,
        unless the stream says otherwise (``seqserve-stream-scoped`` header). ``streams``: the
        open streams, which the shutdown ends with UNAVAILABLE (see ``StreamDrain``).
        ``shared_memory``: the regions registered with the server (shared with HTTP).
        ``stream_backlog``: requests a stream may have read and not answered (see StreamSession)."""
        self.server = server
        self.header_forward = header_forward  # metadata forwarded as ModelInfer parameters
        self.stream_backlog = stream_backlog
        self.stream_scoped = stream_scoped
        self.stream_stats = stream_stats if stream_stats is not None else StreamStats()
        self.streams = streams if streams is not None else StreamDrain()
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemoryRegistry()
        self._shm_rpcs = SharedMemoryRpcs(self.shared_memory)

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
            raise aborted(e) from None
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
            raise aborted(e) from None
        resp = pb.ModelConfigResponse()
        resp.config.CopyFrom(cfg)
        return resp

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        try:
            stats = self.server.statistics(request.name, request.version)
        except InferenceError:
            raise CallAborted(
                Status.INVALID_ARGUMENT, f"requested model '{clip(request.name)}' is not available"
            ) from None
        return statistics_proto(stats)

    # --------------------------------------------------------------------- repository

    async def LogSettings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        """The logging extension: the settings given change, and all are returned."""
        changes = {
            name: getattr(v, v.WhichOneof("parameter_choice") or "string_param") for name, v in request.settings.items()
        }
        try:
            settings = log_settings_request(changes)
        except InferenceError as e:
            raise aborted(e) from None
        resp = pb.LogSettingsResponse()
        for name, value in settings.items():
            field = (
                "bool_param"
                if isinstance(value, bool)
                else "uint32_param"
                if isinstance(value, int)
                else "string_param"
            )
            setattr(resp.settings[name], field, value)
        return resp

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
            raise aborted(e) from None
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        try:
            await self.server.request_unload_model(request.model_name)
        except InferenceError as e:
            raise aborted(e) from None
        return pb.RepositoryModelUnloadResponse()

    # -------------------------------------------------------------------------- infer

    async def ModelInfer(self, request: bytes | pb.ModelInferRequest, context: CallContext) -> bytes:
        """Registered with no deserializer and no serializer (``RAW_RPCS``): the request comes as
        bytes (or, called directly, as a message) and the reply goes back as bytes, encoded by
        ``wire`` without building a response message."""
        try:
            msg = codec.parse_infer_request(request) if isinstance(request, bytes) else request
            if isinstance(msg, Undecodable):
                raise msg.error()
            try:
                infer_request, options = codec.decode_request(msg, inline=True)
            except codec.DecodeOffLoop:
                infer_request, options = await offload(codec.decode_request, msg)
            extensions = options.extensions  # shared memory, classification
            if extensions is not None:
                extensions.prepare(self.server, infer_request, self.shared_memory)
            metadata = context.metadata
            if metadata and self.header_forward is not None:
                forward_headers(infer_request, metadata, self.header_forward)
            if metadata:
                session = end = None
                for key, value in metadata:
                    if type(value) is not str:  # a "-bin" entry: none of these
                        continue
                    if key == SESSION_ID_KEY:
                        session = value
                    elif key == SESSION_END_KEY:
                        end = value
                    elif key == "traceparent":
                        infer_request.trace_parent = value
                if session is not None or end is not None:
                    infer_request.client = peer_host(context.peer())
                    apply_session(self.server, infer_request, session, end)
            result = await enqueue_single(self.server, infer_request, "ModelInfer RPC")
            if extensions is not None:
                placed = extensions.finish(self.server, result, self.shared_memory)
                return wire.infer_response(result) + placed_entries(placed)
            return wire.infer_response(result)
        except InferenceError as e:
            raise aborted(e) from None
        except Exception as e:
            raise unexpected("ModelInfer", e) from None

    # ------------------------------------------------------------------ shared memory

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        return self._shm_rpcs.status(request)

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        return self._shm_rpcs.register(request)

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        return self._shm_rpcs.unregister(request)

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        return self._shm_rpcs.cuda_status(request)

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        return self._shm_rpcs.cuda_register(request)

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return self._shm_rpcs.cuda_unregister(request)

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[bytes]:
        """See StreamSession. Headers: ``triton_grpc_error: true``, the first error ends the
        stream with its gRPC status; ``seqserve-reply-order: completion``, replies as they
        complete; ``seqserve-stream-scoped: true|false``, whether the sequences started on the
        stream end when it closes (default: the server's ``--stream-scoped-sequences``).

        While the server drains, a new stream gets UNAVAILABLE at once, and an open one ends
        with UNAVAILABLE once every request it submitted is answered (``StreamDrain``)."""
        if self.streams.refusal is not None:
            raise CallAborted(Status.UNAVAILABLE, self.streams.refusal)
        grpc_errors = False
        completion_order = False
        scoped = self.stream_scoped
        trace_parent = ""
        for key, value in context.metadata:
            if type(value) is not str:  # a "-bin" entry: none of these
                continue
            if key == "triton_grpc_error":
                grpc_errors = value == "true"
            elif key == REPLY_ORDER_HEADER:
                if value.lower() not in ("request", "completion"):
                    raise CallAborted(
                        Status.INVALID_ARGUMENT,
                        f"header '{REPLY_ORDER_HEADER}' must be 'request' or 'completion', got '{value}'",
                    )
                completion_order = value.lower() == "completion"
            elif key == STREAM_SCOPED_HEADER:
                if value.lower() not in ("true", "false"):
                    raise CallAborted(
                        Status.INVALID_ARGUMENT,
                        f"header '{STREAM_SCOPED_HEADER}' must be 'true' or 'false', got '{value}'",
                    )
                scoped = value.lower() == "true"
            elif key == "traceparent":
                trace_parent = value
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
            shared_memory=self.shared_memory,
            trace_parent=trace_parent,
            forwarded=forwarded_metadata(context.metadata, self.header_forward),
            max_backlog=self.stream_backlog,
        )
        self.streams.add(session)
        try:
            # The requests are read with context.read (what ``requests`` wraps in an async
            # generator) and the replies taken in batches: two async-generator hops less per message.
            session.start_calls(context.read)
            while (batch := await session.next_replies()) is not None:
                for reply in batch:
                    if isinstance(reply, bytes):
                        yield reply
                    else:  # triton_grpc_error: the stream ends here
                        raise aborted(reply)
            if session.drain_reason is not None:  # every request it submitted is answered
                raise CallAborted(Status.UNAVAILABLE, session.drain_reason)
        finally:
            session.close()
            self.streams.discard(session)

    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        try:
            return grpc_trace_setting(self.server, request)
        except InferenceError as e:
            raise aborted(e) from None


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
