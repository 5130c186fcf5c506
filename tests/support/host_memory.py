"""``HostMemory``: the device state table's ``DeviceMemory`` protocol in host memory, so that
the table's slot arithmetic, staging and DLPack views are checked on machines without a GPU.
Its ``copy_rows`` is the kernel's specification (engine/device/rows.copy_rows_reference); the
GPU tests check the real kernel against the same reference."""

from __future__ import annotations

import ctypes

import numpy as np

from seqserve.engine.device.memory import DLPACK_CPU
from seqserve.engine.device.rows import copy_rows_reference


class HostMemory:
    dlpack_device = (DLPACK_CPU, 0)

    def __init__(self) -> None:
        self.blocks: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.copies_to_device = 0
        self.row_copies: list[tuple[int, int]] = []  # (pairs, row_bytes) per launch
        self.fences = 0

    def alloc(self, nbytes: int) -> int:
        buf = ctypes.create_string_buffer(max(1, nbytes) + 16)
        ptr = (ctypes.addressof(buf) + 15) & ~15  # 16-byte aligned, as cudaMallocAsync's
        self.blocks[ptr] = buf
        return ptr

    alloc_pinned = alloc

    def free(self, ptr: int) -> None:
        del self.blocks[ptr]

    def copy_to_device(self, dst: int, src: int, nbytes: int) -> None:
        self.copies_to_device += 1
        ctypes.memmove(dst, src, nbytes)

    def copy_to_host(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def copy_on_device(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def copy_rows(self, dst: int, dst_rows: int, src: int, src_rows: int, pairs: int, row_bytes: int) -> None:
        self.row_copies.append((pairs, row_bytes))
        d_rows = _ints(dst_rows, pairs).copy()
        s_rows = _ints(src_rows, pairs).copy()
        rows_dst = int(d_rows.max()) + 1
        rows_src = int(s_rows.max()) + 1
        dst_arr = _bytes(dst, rows_dst * row_bytes).reshape(rows_dst, row_bytes)
        src_arr = _bytes(src, rows_src * row_bytes).reshape(rows_src, row_bytes).copy()
        copy_rows_reference(dst_arr, d_rows, src_arr, s_rows)

    def fence(self) -> None:
        self.fences += 1

    def wait_fence(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _ints(ptr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int32)), (n,))


def _bytes(ptr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint8)), (n,))
