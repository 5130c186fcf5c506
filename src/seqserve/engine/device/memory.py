"""What the device state table needs from a device: the ``DeviceMemory`` protocol. A
``CudaStream`` (engine/device/cuda.py) is the real one; the CPU tests drive the same table with
host memory, so its arithmetic is checked where there is no GPU."""

from __future__ import annotations

from typing import Protocol

#: DLPack device types
DLPACK_CPU = 1
DLPACK_CUDA = 2


class DeviceMemory(Protocol):
    #: (DLPack device type, ordinal) of the memory ``alloc`` returns
    dlpack_device: tuple[int, int]

    def alloc(self, nbytes: int) -> int: ...
    def alloc_pinned(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def copy_to_device(self, dst: int, src: int, nbytes: int) -> None: ...
    def copy_to_host(self, dst: int, src: int, nbytes: int) -> None: ...
    def copy_on_device(self, dst: int, src: int, nbytes: int) -> None: ...
    def copy_rows(self, dst: int, dst_rows: int, src: int, src_rows: int, pairs: int, row_bytes: int) -> None: ...
    def fence(self) -> None:
        """Mark the work queued so far (the staging buffer's copies)."""

    def wait_fence(self) -> None:
        """Wait until the work marked by the last ``fence`` is done (the staging buffer is free)."""

    def synchronize(self) -> None: ...
