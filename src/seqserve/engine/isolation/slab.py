"""Shared memory for one direction of one isolated instance: an anonymous file (``memfd`` on
Linux, an unlinked temporary file elsewhere) mapped by both processes.

The writer owns a slab and grows it by replacing it: a new, larger file whose descriptor
travels with the next message (``SCM_RIGHTS``); the reader maps it read-only, so the numpy
views it builds on it are read-only too. Nothing has a name in ``/dev/shm``: when both
processes have closed a slab (or died) the kernel frees it.
"""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np

#: tensors start on a cache line
ALIGN = 64
_MIN_SIZE = 64 * 1024


def aligned(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def capacity_for(needed: int) -> int:
    """The size of a slab that holds ``needed`` bytes: the next power of two (at least 64 KiB)."""
    size = _MIN_SIZE
    while size < needed:
        size *= 2
    return size


def _anonymous_fd(size: int) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("seqserve-slab", os.MFD_CLOEXEC)
    else:  # no memfd (macOS): an unlinked temporary file does the same
        fd, path = tempfile.mkstemp(prefix="seqserve-slab-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.unlink(path)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Slab:
    """One mapped region. ``mv`` is a memoryview of it (writable only in the writer)."""

    __slots__ = ("fd", "mm", "mv", "size", "writable")

    def __init__(self, fd: int, size: int, *, writable: bool) -> None:
        self.fd = fd
        self.size = size
        self.writable = writable
        self.mm = mmap.mmap(fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        self.mv = memoryview(self.mm)

    @classmethod
    def create(cls, needed: int) -> Slab:
        """A new writable slab of at least ``needed`` bytes; its ``fd`` goes to the reader."""
        size = capacity_for(needed)
        return cls(_anonymous_fd(size), size, writable=True)

    @classmethod
    def attach(cls, fd: int, size: int) -> Slab:
        """The reader's read-only mapping of a slab whose descriptor it received."""
        return cls(fd, size, writable=False)

    def array(self, dtype: np.dtype, shape: tuple[int, ...], offset: int) -> np.ndarray:
        """A numpy view (read-only for readers) of ``shape``/``dtype`` at ``offset``."""
        return np.ndarray(shape, dtype, self.mm, offset)

    def close(self) -> None:
        """Drop this side's descriptor and mapping. Views still held elsewhere keep the mapping
        alive until they go (the mapping is released with its last view)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.mv.release()
            self.mm.close()
        except BufferError:  # a view is still exported: the mapping goes with the last one
            pass
