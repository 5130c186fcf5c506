"""KServe v2 / Triton gRPC front-end (grpc.aio), on the same loop as the HTTP server."""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from seqserve import __version__
from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from seqserve._proto import health_pb2, health_pb2_grpc
from seqserve.api import codec
from seqserve.api.http import EXTENSIONS
from seqserve.engine import Code, InferenceError, InferResult, Server

log = logging.getLogger("seqserve.grpc")

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

_NO_SHM = "seqserve does not implement shared memory: send tensor data in the request (raw_input_contents) instead"

# Typed InferTensorContents field per datatype, for KServe clients that do not send raw bytes.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _param_value(p: pb.InferParameter) -> Any:
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def decode_request(req: pb.ModelInferRequest) -> codec.Request:
    out = codec.Request(id=req.id)
    params = req.parameters
    for key in params:
        p = params[key]
        kind = p.WhichOneof("parameter_choice")
        if key == "sequence_id":
            if kind == "int64_param":
                out.sequence_id = p.int64_param & 0xFFFFFFFFFFFFFFFF  # the int64 carries a uint64's bits
            elif kind == "string_param":
                out.sequence_id = p.string_param
            elif kind == "uint64_param":
                out.sequence_id = p.uint64_param
            else:
                raise codec.bad("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.")
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise codec.bad(f"invalid value type for '{key}' parameter, expected bool_param.")
            setattr(out, key, p.bool_param)
        elif key == "priority":
            if kind not in ("uint64_param", "int64_param") or _param_value(p) < 0:
                raise codec.bad("invalid value type for 'priority' parameter, expected uint64_param.")
            out.priority = _param_value(p)
        elif key == "timeout":
            if kind not in ("int64_param", "uint64_param") or _param_value(p) < 0:
                raise codec.bad("invalid value type for 'timeout' parameter, expected int64_param.")
            out.timeout_us = _param_value(p)
        else:
            out.parameters[key] = _param_value(p)

    raw = req.raw_input_contents
    inputs = req.inputs
    if raw:
        if len(raw) > len(inputs):
            raise codec.bad(f"unexpected additional input data for model '{req.model_name}'")
        if len(raw) < len(inputs):
            raise codec.bad(f"expected raw_input_contents for input '{inputs[len(raw)].name}'")
        for t, data in zip(inputs, raw, strict=True):
            out.inputs[t.name] = _raw_input(t, data)
    else:
        for t in inputs:
            _check_input(t)
            out.inputs[t.name] = _typed_contents(t, list(t.shape))
    for o in req.outputs:
        if "shared_memory_region" in o.parameters:
            raise InferenceError(Code.UNSUPPORTED, _NO_SHM)
        out.outputs[o.name] = True
    return out


def _check_input(t: pb.ModelInferRequest.InferInputTensor) -> None:
    if t.parameters and "shared_memory_region" in t.parameters:
        raise InferenceError(Code.UNSUPPORTED, _NO_SHM)
    if t.datatype not in codec.NP_DTYPE:
        if t.datatype == "BF16":
            raise InferenceError(Code.UNSUPPORTED, f"input '{t.name}': BF16 tensors are not supported")
        raise codec.bad(f"input '{t.name}' has unknown datatype '{t.datatype}'")
    if any(d < 0 for d in t.shape):
        raise codec.bad(f"input '{t.name}' has a negative dimension in shape {list(t.shape)}")


def _raw_input(t: pb.ModelInferRequest.InferInputTensor, data: bytes) -> np.ndarray:
    """One raw_input_contents entry as an array (a zero-copy view for fixed-size types)."""
    if t.HasField("contents"):
        raise codec.bad("contents field must not be specified when using raw_input_contents")
    dtype = codec.NP_DTYPE.get(t.datatype)
    if dtype is None or dtype.kind == "O" or t.parameters:
        _check_input(t)
        return codec.binary_tensor(t.name, t.datatype, list(t.shape), memoryview(data))
    shape = tuple(t.shape)
    count = 1
    for d in shape:
        if d < 0:
            raise codec.bad(f"input '{t.name}' has a negative dimension in shape {list(shape)}")
        count *= d
    if len(data) != count * dtype.itemsize:
        raise codec.bad(
            f"unexpected size for input '{t.name}', expecting {count * dtype.itemsize} bytes but got {len(data)}"
        )
    return np.frombuffer(data, dtype).reshape(shape)


def _typed_contents(t: pb.ModelInferRequest.InferInputTensor, shape: list[int]) -> np.ndarray:
    field = _CONTENTS_FIELD.get(t.datatype)
    if field is None:
        raise codec.bad(f"input '{t.name}': datatype {t.datatype} must be sent in raw_input_contents")
    values = getattr(t.contents, field)
    if t.datatype == "BYTES":
        arr = np.empty(len(values), dtype=object)
        arr[:] = list(values)
    else:
        arr = np.array(values, dtype=codec.NP_DTYPE[t.datatype])
    if arr.size != codec.element_count(shape):
        raise codec.bad(f"unexpected number of elements in the contents of input '{t.name}'")
    return arr.reshape(shape)


def _set_param(p: pb.InferParameter, value: Any) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value if value < 2**63 else value - 2**64
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def encode_response(result: InferResult) -> pb.ModelInferResponse:
    resp = pb.ModelInferResponse(model_name=result.model_name, model_version=result.model_version, id=result.id)
    raw = resp.raw_output_contents
    for name, arr in result.outputs.items():
        resp.outputs.add(name=name, datatype=codec.wire_datatype(arr), shape=arr.shape)
        raw.append(codec.raw_bytes(arr))
    for key, value in result.parameters.items():
        _set_param(resp.parameters[key], value)
    return resp


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
        return pb.ServerMetadataResponse(name="seqserve", version=__version__, extensions=EXTENSIONS)

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
            result = await codec.submit(
                self.server, request.model_name, request.model_version, decode_request(request), "ModelInfer RPC"
            )
        except InferenceError as e:
            await self._fail(context, e)
            raise
        return encode_response(result)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests are submitted in arrival order (so each sequence keeps its order) and
        answered as their responses come: one per request for most models, any number for
        decoupled ones. Every response carries ``triton_final_response``. A final flag that
        comes without a response is sent as an empty response only when the request set
        ``triton_enable_empty_final_response``. A failing request gets an error_message
        response and the stream stays open, unless the client sent the ``triton_grpc_error:
        true`` header: then the first error ends the stream with its gRPC status. Requests
        still running when the stream ends early (client cancel or disconnect) are cancelled:
        models see ``is_cancelled()``."""
        grpc_errors = any(k == "triton_grpc_error" and v == "true" for k, v in context.invocation_metadata() or ())
        # (reply or None, ends_a_request); a bare None marks the end of the request stream.
        # The writer counts requests down as it dequeues, so no reply is left behind.
        replies: asyncio.Queue[_StreamItem | None] = asyncio.Queue()
        outstanding = 0  # requests read whose final reply has not been written
        live: dict[int, Callable[[], None]] = {}  # cancel() of requests without their final response yet
        # As in Triton, replies to non-decoupled requests (and refusals) go out in the order the
        # requests came; a decoupled request's responses go out as they come.
        in_order: collections.deque[list[_StreamItem | None]] = collections.deque()

        def put(slot: list[_StreamItem | None] | None, item: _StreamItem) -> None:
            if slot is None:
                replies.put_nowait(item)
                return
            slot[0] = item
            while in_order and in_order[0][0] is not None:
                replies.put_nowait(in_order.popleft()[0])

        def on_response(
            head: tuple[str, str, str],  # the request's id, model name and version (as requested)
            empty_final: bool,
            key: int,
            slot: list[_StreamItem | None] | None,
            response: InferResult | InferenceError | None,
            final: bool,
        ) -> None:
            if final:
                live.pop(key, None)
            if isinstance(response, InferenceError):
                put(slot, (response if grpc_errors else _stream_error(*head, response, final), final))
            elif response is not None:
                resp = encode_response(response)
                resp.parameters["triton_final_response"].bool_param = final
                put(slot, (pb.ModelStreamInferResponse(infer_response=resp), final))
            elif empty_final:  # a final flag alone, written only when the client asked for it
                resp = pb.ModelInferResponse(id=head[0], model_name=head[1], model_version=head[2])
                resp.parameters["triton_final_response"].bool_param = True
                put(slot, (pb.ModelStreamInferResponse(infer_response=resp), final))
            else:  # a bare final flag: nothing to write
                put(slot, (None, final))

        keys = itertools.count()

        async def read() -> None:
            nonlocal outstanding
            async for req in request_iterator:
                outstanding += 1
                slot: list[_StreamItem | None] | None = None
                try:
                    if not self.server.model(req.model_name, req.model_version).decoupled:
                        slot = [None]
                        in_order.append(slot)
                    decoded = decode_request(req)
                    empty_final = decoded.parameters.pop("triton_enable_empty_final_response", False) is True
                    key = next(keys)
                    live[key] = codec.submit_streaming(
                        self.server,
                        req.model_name,
                        req.model_version,
                        decoded,
                        functools.partial(
                            on_response, (req.id, req.model_name, req.model_version), empty_final, key, slot
                        ),
                    )
                except Exception as e:  # refused: one error reply, and the stream goes on
                    err = e if isinstance(e, InferenceError) else _internal(e)
                    if slot is None:  # an unknown model: Triton orders its reply too
                        slot = [None]
                        in_order.append(slot)
                    put(
                        slot,
                        (err if grpc_errors else _stream_error(req.id, req.model_name, req.model_version, err), True),
                    )
            replies.put_nowait(None)

        reader = asyncio.create_task(read())
        reading = True
        try:
            while reading or outstanding:
                item = await replies.get()
                if item is None:
                    reading = False
                    continue
                reply, ends_request = item
                if ends_request:
                    outstanding -= 1
                if isinstance(reply, InferenceError):  # triton_grpc_error: the stream ends here
                    await self._fail(context, reply)
                elif reply is not None:
                    yield reply
        finally:
            reader.cancel()
            for cancel in live.values():  # the stream ended before these did
                cancel()


_StreamItem = tuple[pb.ModelStreamInferResponse | InferenceError | None, bool]


def _stream_error(
    request_id: str, model: str, version: str, err: InferenceError, final: bool | None = None
) -> pb.ModelStreamInferResponse:
    """An error on the stream; ``final`` (for errors a model sent) marks whether the request
    is over, as on every response."""
    resp = pb.ModelInferResponse(id=request_id, model_name=model, model_version=version)
    if final is not None:
        resp.parameters["triton_final_response"].bool_param = final
    return pb.ModelStreamInferResponse(error_message=err.message, infer_response=resp)


def _internal(e: Exception) -> InferenceError:
    log.exception("stream request failed")
    return InferenceError(Code.INTERNAL, f"{type(e).__name__}: {e}")


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
    setattr(InferenceServicer, _rpc, _unimplemented(f"{_rpc}: {_NO_SHM}"))
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
    server: Server, host: str, port: int, *, cert: str | None = None, key: str | None = None
) -> grpc.aio.Server:
    options = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ]
    g = grpc.aio.server(options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(server), g)
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(server), g)
    address = f"{host}:{port}"
    if cert:
        with open(cert, "rb") as f_cert, open(key or "", "rb") as f_key:
            creds = grpc.ssl_server_credentials([(f_key.read(), f_cert.read())])
        bound = g.add_secure_port(address, creds)
    else:
        bound = g.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"gRPC: cannot bind {address}")
    await g.start()
    return g
