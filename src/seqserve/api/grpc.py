"""KServe v2 / Triton gRPC front-end (grpc.aio), on the same loop as the HTTP server: the
servicer, a thin adapter from the rpcs to ``engine.Server``. Messages are converted by
``grpc_codec``; a ModelStreamInfer call is a ``grpc_stream.StreamSession``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from google.protobuf import json_format

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from seqserve._proto import health_pb2, health_pb2_grpc
from seqserve.api import grpc_codec, security
from seqserve.api.grpc_stream import StreamSession
from seqserve.api.kserve import EXTENSIONS, SESSION_END_KEY, SESSION_ID_KEY, apply_session, enqueue_single
from seqserve.engine import Code, InferenceError, Server

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


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, server: Server) -> None:
        self.server = server

    async def _fail(self, context: grpc.aio.ServicerContext, e: InferenceError) -> None:
        await context.abort(GRPC_STATUS.get(e.code, grpc.StatusCode.UNKNOWN), e.message)

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
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"requested model '{request.name}' is not available")
            raise
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

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

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        try:
            infer_request, _ = grpc_codec.decode_request(request)
            session = end = None
            for key, value in context.invocation_metadata() or ():
                if key == SESSION_ID_KEY:
                    session = value
                elif key == SESSION_END_KEY:
                    end = value
            if session is not None or end is not None:
                apply_session(self.server, infer_request, session, end)
            result = await enqueue_single(self.server, infer_request, "ModelInfer RPC")
        except InferenceError as e:
            await self._fail(context, e)
            raise
        return grpc_codec.encode_response(result)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """See StreamSession. With the ``triton_grpc_error: true`` header, the first error
        ends the stream with its gRPC status."""
        grpc_errors = any(k == "triton_grpc_error" and v == "true" for k, v in context.invocation_metadata() or ())
        session = StreamSession(self.server, grpc_errors=grpc_errors)
        reader = asyncio.create_task(session.read(request_iterator))
        try:
            async for reply in session.replies():
                if isinstance(reply, InferenceError):  # triton_grpc_error: the stream ends here
                    await self._fail(context, reply)
                else:
                    yield reply
        finally:
            reader.cancel()
            session.close()


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
    host: str,
    port: int,
    *,
    cert: str | None = None,
    key: str | None = None,
    client_ca: str | None = None,
    restrictions: Mapping[str, security.Restriction] | None = None,
) -> grpc.aio.Server:
    """Serve on host:port; TLS with cert and key (mutual TLS with client_ca), and the rpcs
    of restricted groups guarded (security.restrict_grpc)."""
    options = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ]
    g = grpc.aio.server(options=options)
    inference, health = InferenceServicer(server), HealthServicer(server)
    if restrictions:
        security.restrict_grpc(inference, pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], restrictions)
        security.restrict_grpc(health, health_pb2.DESCRIPTOR.services_by_name["Health"], restrictions)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(inference, g)
    health_pb2_grpc.add_HealthServicer_to_server(health, g)
    address = f"{host}:{port}"
    if cert:
        creds = security.grpc_credentials(security.TlsFiles(cert, key or "", client_ca))
        bound = g.add_secure_port(address, creds)
    else:
        bound = g.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"gRPC: cannot bind {address}")
    await g.start()
    return g
