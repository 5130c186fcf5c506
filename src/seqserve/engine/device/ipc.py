"""Device memory another process shares through a CUDA IPC handle (Triton's CUDA shared-memory
extension): opened once at registration, read and written with bounds-checked copies, closed at
unregistration. The server never maps a region it was not given a handle for; a handle from a
process that exited fails at open with CUDA's own message."""

from __future__ import annotations

import ctypes
from typing import Any

#: bytes of a cudaIpcMemHandle_t
IPC_HANDLE_BYTES = 64


class CudaIpcError(ValueError):
    """A handle that cannot be opened, or an access outside the region: the client's error."""


class CudaIpcMemory:
    """One registered region: ``byte_size`` bytes of device ``device_id``'s memory."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise CudaIpcError(f"a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, not {len(raw_handle)}")
        if byte_size <= 0:
            raise CudaIpcError("a CUDA shared memory region needs a positive byte_size")
        from cuda.bindings import runtime

        from seqserve.engine.device.probe import probe_gpus

        probe = probe_gpus()
        if not 0 <= device_id < probe.count:
            raise CudaIpcError(
                f"CUDA device {device_id} is not usable here ({probe.count} usable"
                + (f": {probe.reason}" if probe.reason else "")
                + ")"
            )
        self._rt = runtime
        self.device_id = device_id
        self.byte_size = byte_size
        self._check(runtime.cudaSetDevice(device_id), "cudaSetDevice")
        handle = runtime.cudaIpcMemHandle_t()
        handle.reserved = raw_handle
        self._ptr = int(
            self._check(
                runtime.cudaIpcOpenMemHandle(handle, runtime.cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"
            )
        )

    def read(self, offset: int, nbytes: int) -> bytes:
        self._bounds(offset, nbytes)
        out = ctypes.create_string_buffer(nbytes)
        rt = self._rt
        kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(rt.cudaMemcpy(ctypes.addressof(out), self._ptr + offset, nbytes, kind), "cudaMemcpy")
        return out.raw

    def write(self, offset: int, data: bytes) -> None:
        self._bounds(offset, len(data))
        rt = self._rt
        src = ctypes.create_string_buffer(data, len(data))
        kind = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(rt.cudaMemcpy(self._ptr + offset, ctypes.addressof(src), len(data), kind), "cudaMemcpy")

    def close(self) -> None:
        if self._ptr:
            self._rt.cudaIpcCloseMemHandle(self._ptr)
            self._ptr = 0

    def _bounds(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.byte_size:
            raise CudaIpcError(f"{nbytes} bytes at offset {offset} do not fit in the region's {self.byte_size} bytes")
        if not self._ptr:
            raise CudaIpcError("the region is closed")

    def _check(self, result: Any, what: str) -> Any:
        status, *values = result
        if status != self._rt.cudaError_t.cudaSuccess:
            _, text = self._rt.cudaGetErrorString(status)
            raise CudaIpcError(f"{what}: {text.decode(errors='replace')}")
        return values[0] if values else None
