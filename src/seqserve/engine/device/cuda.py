"""The CUDA calls of the device state path, through cuda-python (``cuda.bindings``): one
``CudaStream`` per GPU instance, its stream-ordered device memory, pinned host memory, async
copies and the row-copy kernel (compiled once per device with NVRTC). Every call checks its
status and raises ``CudaError`` with CUDA's own text.

Imported only when a GPU instance is created (``cuda.bindings`` is the optional ``gpu`` extra).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from cuda.bindings import driver, nvrtc, runtime

from seqserve.engine.device.kernels import KERNEL_NAME, SOURCE, THREADS, launch_grid
from seqserve.engine.device.memory import DLPACK_CUDA

_H2D = runtime.cudaMemcpyKind.cudaMemcpyHostToDevice
_D2H = runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
_D2D = runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice
_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit sync with the legacy stream
_EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming: a fence, not a clock


class CudaError(RuntimeError):
    pass


def _check(result: Any, what: str) -> Any:
    """cuda.bindings calls return (status, *values): the values, or CudaError."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if isinstance(status, runtime.cudaError_t):
        if status != runtime.cudaError_t.cudaSuccess:
            _, text = runtime.cudaGetErrorString(status)
            raise CudaError(f"{what}: {text.decode(errors='replace')}")
    elif isinstance(status, driver.CUresult):
        if status != driver.CUresult.CUDA_SUCCESS:
            _, text = driver.cuGetErrorString(status)
            raise CudaError(f"{what}: {text.decode(errors='replace') if text else status}")
    elif isinstance(status, nvrtc.nvrtcResult) and status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CudaError(f"{what}: {status}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class RowCopyKernel:
    """The row-copy kernel, compiled for one device (NVRTC to PTX, loaded in the device's
    primary context)."""

    _lock = threading.Lock()
    _by_device: dict[int, RowCopyKernel] = {}

    def __init__(self, ordinal: int) -> None:
        major = _check(
            runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, ordinal), "cc"
        )
        minor = _check(
            runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, ordinal), "cc"
        )
        prog = _check(nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"seqserve_rows.cu", 0, [], []), "nvrtcCreateProgram")
        opts = [f"--gpu-architecture=compute_{major}{minor}".encode(), b"--std=c++17"]
        status = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CudaError(f"compiling the row-copy kernel failed: {log.decode(errors='replace')}")
        size = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * size
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        nvrtc.nvrtcDestroyProgram(prog)
        _check(runtime.cudaSetDevice(ordinal), "cudaSetDevice")
        _check(runtime.cudaFree(0), "cudaFree(0)")  # makes the primary context current
        self._module = _check(driver.cuModuleLoadData(ptx), "cuModuleLoadData")
        self._function = _check(driver.cuModuleGetFunction(self._module, KERNEL_NAME.encode()), "cuModuleGetFunction")

    @classmethod
    def for_device(cls, ordinal: int) -> RowCopyKernel:
        with cls._lock:
            kernel = cls._by_device.get(ordinal)
            if kernel is None:
                kernel = cls._by_device[ordinal] = cls(ordinal)
            return kernel

    def launch(self, stream: int, dst: int, dst_rows: int, src: int, src_rows: int, pairs: int, row_bytes: int) -> None:
        if pairs <= 0:
            return
        gx, gy = launch_grid(pairs, row_bytes)
        args = (
            (dst, dst_rows, src, src_rows, pairs, row_bytes),
            (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong),
        )
        _check(
            driver.cuLaunchKernel(self._function, gx, gy, 1, THREADS, 1, 1, 0, driver.CUstream(stream), args, 0),
            "cuLaunchKernel(seqserve_copy_rows)",
        )


class CudaStream:
    """One GPU instance's stream and the memory it allocates. Not thread-safe: the instance's
    executor thread is its only user after creation."""

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal
        _check(runtime.cudaSetDevice(ordinal), f"cudaSetDevice({ordinal})")
        self.handle: int = int(
            _check(runtime.cudaStreamCreateWithFlags(_STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags")
        )
        self.kernel = RowCopyKernel.for_device(ordinal)
        self.dlpack_device = (DLPACK_CUDA, ordinal)
        self._device_blocks: list[int] = []
        self._host_blocks: list[int] = []
        self._fence = _check(runtime.cudaEventCreateWithFlags(_EVENT_DISABLE_TIMING), "cudaEventCreateWithFlags")
        self._fenced = False

    def make_current(self) -> None:
        _check(runtime.cudaSetDevice(self.ordinal), f"cudaSetDevice({self.ordinal})")

    def alloc(self, nbytes: int) -> int:
        """Device memory from the stream-ordered pool (freed at close)."""
        ptr = int(_check(runtime.cudaMallocAsync(max(1, nbytes), self.handle), f"cudaMallocAsync({nbytes})"))
        self._device_blocks.append(ptr)
        return ptr

    def alloc_pinned(self, nbytes: int) -> int:
        """Page-locked host memory (async copies from it do not stage through the driver)."""
        ptr = int(_check(runtime.cudaHostAlloc(max(1, nbytes), 0), f"cudaHostAlloc({nbytes})"))
        self._host_blocks.append(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        if ptr in self._device_blocks:
            self._device_blocks.remove(ptr)
            _check(runtime.cudaFreeAsync(ptr, self.handle), "cudaFreeAsync")
        elif ptr in self._host_blocks:
            self.synchronize()  # no queued copy may still read it
            self._host_blocks.remove(ptr)
            _check(runtime.cudaFreeHost(ptr), "cudaFreeHost")

    def copy_to_device(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            _check(runtime.cudaMemcpyAsync(dst, src, nbytes, _H2D, self.handle), "cudaMemcpyAsync(H2D)")

    def copy_to_host(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            _check(runtime.cudaMemcpyAsync(dst, src, nbytes, _D2H, self.handle), "cudaMemcpyAsync(D2H)")

    def copy_on_device(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            _check(runtime.cudaMemcpyAsync(dst, src, nbytes, _D2D, self.handle), "cudaMemcpyAsync(D2D)")

    def copy_rows(self, dst: int, dst_rows: int, src: int, src_rows: int, pairs: int, row_bytes: int) -> None:
        """Row dst_rows[i] of dst becomes row src_rows[i] of src (index lists in device memory)."""
        self.kernel.launch(self.handle, dst, dst_rows, src, src_rows, pairs, row_bytes)

    def fence(self) -> None:
        _check(runtime.cudaEventRecord(self._fence, self.handle), "cudaEventRecord")
        self._fenced = True

    def wait_fence(self) -> None:
        if self._fenced:
            _check(runtime.cudaEventSynchronize(self._fence), "cudaEventSynchronize")
            self._fenced = False

    def synchronize(self) -> None:
        _check(runtime.cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def close(self) -> None:
        for ptr in list(self._device_blocks):
            self.free(ptr)
        self.synchronize()
        for ptr in list(self._host_blocks):
            _check(runtime.cudaFreeHost(ptr), "cudaFreeHost")
        self._host_blocks.clear()
        _check(runtime.cudaEventDestroy(self._fence), "cudaEventDestroy")
        _check(runtime.cudaStreamDestroy(self.handle), "cudaStreamDestroy")
