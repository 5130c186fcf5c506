"""Triton's system shared-memory extension: regions a local client registers by the key of a
POSIX shared-memory object (``/dev/shm/<key>``), and the input and output tensors that name a
region instead of carrying their bytes.

Regions are global to the server, as in Triton: registered over HTTP, usable over gRPC, and not
tied to the connection that registered them. They are bounded (``MAX_REGIONS``, each an open
file), a region whose object its client removed (tritonclient's ``destroy_shared_memory_region``
unlinks it) is dropped at the next register or status call, and every region is closed when the
server stops (``close``). Every offset and size is checked against the region, and the region
against its object's current size, before a byte is read or written; the inputs of one request
copy at most ``MAX_REQUEST_INPUT_BYTES`` out of shared memory (HTTP bodies have their own bound).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve.api.cuda_shared_memory import CudaRegion
from seqserve.api.kserve import bad, clip, raw_bytes, tensor_from_raw
from seqserve.engine import Code, InferenceError

#: the most regions registered at once (Triton has no bound; a forgotten region keeps a file open)
MAX_REGIONS = 256
#: the most bytes the inputs of one request copy out of shared memory into the server's memory
MAX_REQUEST_INPUT_BYTES = 1 << 30
#: where Linux keeps POSIX shared-memory objects (what shm_open opens)
SHM_DIR = "/dev/shm"
#: the longest key (NAME_MAX, with its leading "/")
MAX_KEY = 255

#: the parameters that place a tensor in a region (HTTP JSON and gRPC alike)
REGION_PARAM = "shared_memory_region"
SIZE_PARAM = "shared_memory_byte_size"
OFFSET_PARAM = "shared_memory_offset"


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
    """One registered region: ``byte_size`` bytes from ``offset`` of the object, read and written
    with pread / pwrite on the object's open file rather than through a mapping: a client that
    shrinks its object then gets a short read, where a mapping would kill the server (SIGBUS)."""

    __slots__ = ("_fd", "byte_size", "inode", "key", "name", "offset")

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
        data = os.pread(self._fd, end - start, start) if end > start else b""
        if len(data) != end - start:  # shrunk since span() looked
            raise bad(f"shared memory region '{clip(self.name)}': its object '{clip(self.key)}' has been shrunk")
        return data

    def write(self, tensor: str, place: TensorPlace, data: bytes) -> None:
        start, end = self.span(tensor, place)
        if len(data) > end - start:
            raise bad(
                f"shared memory size specified with the request for output '{clip(tensor)}' ({end - start} bytes) "
                f"should be at least {len(data)} bytes to hold the results"
            )
        view = memoryview(data)
        while view:  # pwrite may write less than asked
            written = os.pwrite(self._fd, view, start)
            view, start = view[written:], start + written

    def close(self) -> None:
        os.close(self._fd)


def object_path(key: str) -> str:
    """The file of a POSIX shared-memory key, refused unless it is one name (as shm_open
    refuses): no path can reach outside ``SHM_DIR``."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", "..") or "\0" in name or len(key) > MAX_KEY:
        raise bad(f"shared memory key '{clip(key)}' must be a name such as '/my_region' (one '/', at the start)")
    return os.path.join(SHM_DIR, name)


class SharedMemoryRegistry:
    """The registered shared-memory regions of one server, by name: system regions (``Region``)
    and CUDA regions (``CudaRegion``, api/cuda_shared_memory.py), names unique across both."""

    __slots__ = ("_regions", "max_input_bytes", "max_regions")

    def __init__(self, *, max_regions: int = MAX_REGIONS, max_input_bytes: int = MAX_REQUEST_INPUT_BYTES) -> None:
        self._regions: dict[str, Region | CudaRegion] = {}
        self.max_regions = max_regions
        self.max_input_bytes = max_input_bytes

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._admit(name)
        self._regions[name] = Region(name, key, offset, byte_size)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._admit(name)
        self._regions[name] = CudaRegion(name, raw_handle, device_id, byte_size)

    def _admit(self, name: str) -> None:
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

    def unregister(self, name: str = "", *, cuda: bool | None = None) -> None:
        """One region (no error if it is not registered, as in Triton), or every one; ``cuda``:
        only regions of that kind (None: both)."""
        names = [name] if name else list(self._regions)
        for n in names:
            region = self._regions.get(n)
            if region is not None and (cuda is None or isinstance(region, CudaRegion) == cuda):
                del self._regions[n]
                region.close()

    def status(self, name: str = "", *, cuda: bool = False) -> list[dict[str, Any]]:
        """The status of every region of one kind, or of one named region of that kind."""
        self._drop_removed()
        if not name:
            return [r.status() for r in self._regions.values() if isinstance(r, CudaRegion) == cuda]
        region = self._regions.get(name)
        if region is None or isinstance(region, CudaRegion) != cuda:
            kind = "cuda" if cuda else "system"
            raise InferenceError(Code.NOT_FOUND, f"Unable to find {kind} shared memory region: '{clip(name)}'")
        return [region.status()]

    def region(self, name: str) -> Region | CudaRegion:
        region = self._regions.get(name)
        if region is None:
            raise InferenceError(Code.NOT_FOUND, f"Unable to find shared memory region: '{clip(name)}'")
        return region

    def close(self) -> None:
        """Close every region (the server stops)."""
        self.unregister()

    def __len__(self) -> int:
        return len(self._regions)

    def _drop_removed(self) -> None:
        for name in [n for n, r in self._regions.items() if r.removed()]:
            self.unregister(name)

    # ---------------------------------------------------------------- tensors

    def check_input_bytes(self, places: list[TensorPlace]) -> None:
        """Refuse a request whose shared-memory inputs add up to more than ``max_input_bytes``."""
        total = sum(p.byte_size for p in places)
        if total > self.max_input_bytes:
            raise bad(
                f"the request's shared memory inputs hold {total} bytes, over this server's bound of "
                f"{self.max_input_bytes} bytes per request"
            )

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
