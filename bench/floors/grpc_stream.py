"""gRPC floor: a bare grpc.aio ``GRPCInferenceService`` on uvloop that only decodes and encodes.

    python bench/floors/grpc_stream.py PORT [--host 127.0.0.1]

ModelStreamInfer (and ModelInfer, for grpc-unary) answer every request at once with the
request's first input echoed as ``OUTPUT`` (same datatype, shape and raw bytes) and the
request's id; readiness and metadata calls answer as a server holding any model would.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Any

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from bench.floors import common
from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc

_ZERO = b"\x00\x00\x00\x00"


def reply(req: pb.ModelInferRequest) -> pb.ModelInferResponse:
    out = pb.ModelInferResponse(model_name=req.model_name, model_version=req.model_version or "1", id=req.id)
    name = req.outputs[0].name if req.outputs else common.OUTPUT_NAME
    t = out.outputs.add(name=name)
    if req.inputs:
        t.datatype = req.inputs[0].datatype
        t.shape.extend(req.inputs[0].shape)
        out.raw_output_contents.append(req.raw_input_contents[0] if req.raw_input_contents else _ZERO)
    else:
        t.datatype = common.DATATYPE
        t.shape.extend([1, 1])
        out.raw_output_contents.append(_ZERO)
    return out


def _tensor_meta(d: dict[str, Any]) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=d["name"], datatype=d["datatype"], shape=d["shape"])


class FloorServicer(pb_grpc.GRPCInferenceServiceServicer):
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="floor-grpc", version="0")

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        md = common.model_metadata(request.name)
        return pb.ModelMetadataResponse(
            name=md["name"],
            versions=md["versions"],
            platform=md["platform"],
            inputs=[_tensor_meta(t) for t in md["inputs"]],
            outputs=[_tensor_meta(t) for t in md["outputs"]],
        )

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        return reply(request)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async for req in request_iterator:
            yield pb.ModelStreamInferResponse(infer_response=reply(req))


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(FloorServicer(), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise SystemExit(f"floor: cannot bind {host}:{port}")
    await server.start()
    stop = common.stop_on_signal()
    await stop.wait()
    await server.stop(0.5)


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("grpc_stream.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
