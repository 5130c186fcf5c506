"""Triton's system shared-memory extension: regions a local client registers by the key of a
POSIX shared-memory object (``/dev/shm/<key>``), and the input and output tensors that name a
region instead of carrying their bytes.

Regions are global to the server, as in Triton: registered over HTTP, usable over gRPC, and not
tied to the connection that registered them. They are bounded (``MAX_REGIONS`` regions and
``MAX_MAPPED_BYTES`` mapped in all), a region whose object its client removed (tritonclient's
``destroy_shared_memory_region`` unlinks it) is dropped at the next register or status call,
and every region is unmapped when the server stops (``close``). Every offset and size is
checked against the region, and the region against its object's current size, before a byte
is read or written: a mapping read past the end of its file would kill the process (SIGBUS).
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve.api.kserve import bad, clip, raw_bytes, tensor_from_raw
from seqserve.engine import Code, InferenceError

#: the most regions registered at once (Triton has no bound; a forgotten region costs a mapping)
MAX_REGIONS = 256
#: the most bytes mapped by all regions together (address space: the memory is the client's)
MAX_MAPPED_BYTES = 64 << 30
#: where Linux keeps POSIX shared-memory objects (what shm_open opens)
SHM_DIR = "/dev/shm"
#: the longest key (NAME_MAX, with its leading "/")
MAX_KEY = 255

#: the parameters that place a tensor in a region (HTTP JSON and gRPC alike)
REGION_PARAM = "shared_memory_region"
SIZE_PARAM = "shared_memory_byte_size"
OFFSET_PARAM = "shared_memory_offset"

#: what the CUDA shared-memory routes and rpcs answer (501 / UNIMPLEMENTED)
NO_CUDA_SHM = (
    "seqserve does not implement CUDA shared memory (it comes with GPU support): use system shared "
    "memory or send tensor data in the request"
)


@dataclass(frozen=True, slots=True)
class TensorPlace:
    """Where in a registered region one tensor's bytes are: from the tensor's parameters."""

    region: str
    byte_size: int
    offset: int = 0


def tensor_place(tensor: str, params: dict[str, Any]) -> TensorPlace | None:
    """The region a tensor's parameters name (``None``: none), refused unless the name is a
    string and the size and offset are non-negative integers."""
    region = params.get(REGION_PARAM)
    if region is None:
        for key in (SIZE_PARAM, OFFSET_PARAM):
            if key in params:
                raise bad(f"tensor '{clip(tensor)}': '{key}' needs '{REGION_PARAM}'")
        return None
    size = params.get(SIZE_PARAM)
    offset = params.get(OFFSET_PARAM, 0)
    if not isinstance(region, str) or not region:
        raise bad(f"tensor '{clip(tensor)}': '{REGION_PARAM}' must be a region name")
    if type(size) is not int or size < 0:
        raise bad(f"tensor '{clip(tensor)}': '{SIZE_PARAM}' must be given as a non-negative integer")
    if type(offset) is not int or offset < 0:
        raise bad(f"tensor '{clip(tensor)}': '{OFFSET_PARAM}' must be a non-negative integer")
    return TensorPlace(region, size, offset)


class Region:
    """One registered region: the mapping of ``byte_size`` bytes from ``offset`` of the object."""

    __slots__ = ("_fd", "_map", "byte_size", "inode", "key", "name", "offset")

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        path = object_path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise bad(f"Unable to open shared memory region: '{clip(key)}': {e.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise bad(f"shared memory key '{clip(key)}' is not a shared memory object")
            if offset + byte_size > info.st_size:
                raise bad(
                    f"shared memory region '{clip(name)}': offset {offset} and byte_size {byte_size} exceed the "
                    f"{info.st_size} bytes of '{clip(key)}'"
                )
            # mmap's offset must be page-aligned: map from 0 and index past ``offset``
            self._map = mmap.mmap(fd, offset + byte_size) if offset + byte_size else None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.inode = (info.st_dev, info.st_ino)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def removed(self) -> bool:
        """Whether the object's key no longer names it: its client destroyed the region."""
        try:
            info = os.stat(object_path(self.key), follow_symlinks=False)
        except OSError:
            return True
        return (info.st_dev, info.st_ino) != self.inode

    def span(self, tensor: str, place: TensorPlace) -> tuple[int, int]:
        """The [start, end) in the mapping of ``place``, checked against the region and against
        the object's size now (a client may have shrunk it since registering)."""
        if place.offset + place.byte_size > self.byte_size:
            raise bad(
                f"tensor '{clip(tensor)}': offset {place.offset} and byte size {place.byte_size} exceed the "
                f"{self.byte_size} bytes of shared memory region '{clip(self.name)}'"
            )
        start = self.offset + place.offset
        end = start + place.byte_size
        if end > os.fstat(self._fd).st_size:
            raise bad(f"shared memory region '{clip(self.name)}': its object '{clip(self.key)}' has been shrunk")
        return start, end

    def read(self, tensor: str, place: TensorPlace) -> bytes:
        start, end = self.span(tensor, place)
        return b"" if self._map is None else self._map[start:end]

    def write(self, tensor: str, place: TensorPlace, data: bytes) -> None:
        start, end = self.span(tensor, place)
        if len(data) > end - start:
            raise bad(
                f"shared memory size specified with the request for output '{clip(tensor)}' ({end - start} bytes) "
                f"should be at least {len(data)} bytes to hold the results"
            )
        if self._map is not None and data:
            self._map[start : start + len(data)] = data

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        os.close(self._fd)


def object_path(key: str) -> str:
    """The file of a POSIX shared-memory key, refused unless it is one name (as shm_open
    refuses): no path can reach outside ``SHM_DIR``."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", "..") or "\0" in name or len(key) > MAX_KEY:
        raise bad(f"shared memory key '{clip(key)}' must be a name such as '/my_region' (one '/', at the start)")
    return os.path.join(SHM_DIR, name)


class SharedMemoryRegistry:
    """The registered system shared-memory regions of one server, by name."""

    __slots__ = ("_regions", "max_bytes", "max_regions")

    def __init__(self, *, max_regions: int = MAX_REGIONS, max_bytes: int = MAX_MAPPED_BYTES) -> None:
        self._regions: dict[str, Region] = {}
        self.max_regions = max_regions
        self.max_bytes = max_bytes

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise bad("a shared memory region needs a name")
        self._drop_removed()
        if name in self._regions:
            raise InferenceError(Code.ALREADY_EXISTS, f"shared memory region '{clip(name)}' already in manager")
        if len(self._regions) >= self.max_regions:
            raise InferenceError(
                Code.UNAVAILABLE,
                f"{self.max_regions} shared memory regions are registered, the most this server holds: "
                "unregister one first",
            )
        mapped = sum(r.offset + r.byte_size for r in self._regions.values())
        if mapped + offset + byte_size > self.max_bytes:
            raise InferenceError(
                Code.UNAVAILABLE,
                f"registering '{clip(name)}' would map {mapped + offset + byte_size} bytes of shared memory, "
                f"over this server's bound of {self.max_bytes}",
            )
        self._regions[name] = Region(name, key, offset, byte_size)

    def unregister(self, name: str = "") -> None:
        """One region (no error if it is not registered, as in Triton), or every one."""
        names = [name] if name else list(self._regions)
        for n in names:
            region = self._regions.pop(n, None)
            if region is not None:
                region.close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        self._drop_removed()
        if not name:
            return [r.status() for r in self._regions.values()]
        return [self.region(name).status()]

    def region(self, name: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise InferenceError(Code.NOT_FOUND, f"Unable to find system shared memory region: '{clip(name)}'")
        return region

    def close(self) -> None:
        """Unmap every region (the server stops)."""
        self.unregister()

    def __len__(self) -> int:
        return len(self._regions)

    def _drop_removed(self) -> None:
        for name in [n for n, r in self._regions.items() if r.removed()]:
            self.unregister(name)

    # ---------------------------------------------------------------- tensors

    def read_input(self, name: str, datatype: str, shape: list[int], place: TensorPlace) -> np.ndarray:
        """An input's bytes from its region, copied (the client may write the region again while
        the request waits), as the array its datatype and shape make."""
        data = self.region(place.region).read(name, place)
        return tensor_from_raw(name, datatype, shape, memoryview(data))

    def write_output(self, name: str, arr: np.ndarray, place: TensorPlace) -> int:
        """An output's raw bytes into its region; their size."""
        data = raw_bytes(arr)
        self.region(place.region).write(name, place, data)
        return len(data)
