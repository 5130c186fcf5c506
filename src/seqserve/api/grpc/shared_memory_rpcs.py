"""The gRPC side of Triton's system and CUDA shared-memory extensions: their rpcs over one
registry, and the reply entries of outputs written into regions."""

from __future__ import annotations

from typing import Any

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.grpc.status import aborted
from seqserve.api.shared_memory import OFFSET_PARAM, REGION_PARAM, SIZE_PARAM, SharedMemoryRegistry
from seqserve.api.tensor_extensions import PlacedOutput
from seqserve.engine import InferenceError


class SharedMemoryRpcs:
    """SystemSharedMemoryStatus, Register and Unregister over ``registry``."""

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self.registry = registry

    def status(self, request: pb.SystemSharedMemoryStatusRequest) -> pb.SystemSharedMemoryStatusResponse:
        resp = pb.SystemSharedMemoryStatusResponse()
        self._status(request.name, resp, cuda=False)
        return resp

    def _status(self, name: str, resp: Any, *, cuda: bool) -> None:
        """The regions of one kind into a System- or CudaSharedMemoryStatusResponse."""
        try:
            regions = self.registry.status(name, cuda=cuda)
        except InferenceError as e:
            raise aborted(e) from None
        for r in regions:
            resp.regions[r["name"]].CopyFrom(type(resp).RegionStatus(**r))

    def register(self, request: pb.SystemSharedMemoryRegisterRequest) -> pb.SystemSharedMemoryRegisterResponse:
        try:
            self.registry.register(request.name, request.key, request.offset, request.byte_size)
        except InferenceError as e:
            raise aborted(e) from None
        return pb.SystemSharedMemoryRegisterResponse()

    def unregister(self, request: pb.SystemSharedMemoryUnregisterRequest) -> pb.SystemSharedMemoryUnregisterResponse:
        self.registry.unregister(request.name, cuda=False)
        return pb.SystemSharedMemoryUnregisterResponse()

    def cuda_status(self, request: pb.CudaSharedMemoryStatusRequest) -> pb.CudaSharedMemoryStatusResponse:
        resp = pb.CudaSharedMemoryStatusResponse()
        self._status(request.name, resp, cuda=True)
        return resp

    def cuda_register(self, request: pb.CudaSharedMemoryRegisterRequest) -> pb.CudaSharedMemoryRegisterResponse:
        try:
            self.registry.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
        except InferenceError as e:
            raise aborted(e) from None
        return pb.CudaSharedMemoryRegisterResponse()

    def cuda_unregister(self, request: pb.CudaSharedMemoryUnregisterRequest) -> pb.CudaSharedMemoryUnregisterResponse:
        self.registry.unregister(request.name, cuda=True)
        return pb.CudaSharedMemoryUnregisterResponse()


def placed_stream_entries(placed: dict[str, PlacedOutput]) -> bytes:
    """``placed_entries`` inside a ModelStreamInferResponse's ``infer_response``: appended to a
    serialized stream response, they merge into its response the same way."""
    if not placed:
        return b""
    resp = pb.ModelStreamInferResponse()
    resp.infer_response.MergeFromString(placed_entries(placed))
    return resp.SerializeToString()


def placed_entries(placed: dict[str, PlacedOutput]) -> bytes:
    """The ``outputs`` entries of the outputs written into shared memory, serialized as a
    ModelInferResponse that holds only them: appended to a serialized response, they follow its
    other outputs (protobuf merges repeated fields by appending). They have no
    ``raw_output_contents``, so the others' stay aligned with their entries."""
    resp = pb.ModelInferResponse()
    for name, out in placed.items():
        entry = resp.outputs.add(name=name, datatype=out.datatype, shape=out.shape)
        params: dict[str, Any] = {REGION_PARAM: out.place.region, SIZE_PARAM: out.byte_size}
        if out.place.offset:
            params[OFFSET_PARAM] = out.place.offset
        for key, value in params.items():
            if isinstance(value, str):
                entry.parameters[key].string_param = value
            else:
                entry.parameters[key].int64_param = value
    return resp.SerializeToString()
