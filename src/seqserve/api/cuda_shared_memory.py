"""Triton's CUDA shared-memory extension: a region is device memory a local client shares
through a CUDA IPC handle (64 bytes, base64 in HTTP JSON, raw in gRPC), on a device this server
can use. Registered regions live in the same registry as system ones (``SharedMemoryRegistry``,
names unique across both, as in Triton), and tensors name them the same way; their bytes are
copied between the device and the host (``engine/device/ipc.py``), bounds-checked first.

Without a usable GPU (or without cuda-python, the ``gpu`` extra), registering fails with the
reason, as a client's error; status and unregister still answer.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from seqserve.api.kserve import bad, clip


class CudaRegion:
    """One registered CUDA region: the registry's region interface (read, write, status)."""

    __slots__ = ("_memory", "byte_size", "device_id", "name")

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        from seqserve.engine.device.ipc import CudaIpcError, CudaIpcMemory

        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        try:
            self._memory = CudaIpcMemory(raw_handle, device_id, byte_size)
        except ImportError:
            raise bad(
                f"Unable to register CUDA shared memory region '{clip(name)}': this server has no CUDA support "
                "(pip install 'seqserve[gpu]')"
            ) from None
        except CudaIpcError as e:
            raise bad(f"Unable to register CUDA shared memory region '{clip(name)}': {e}") from None

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def removed(self) -> bool:
        return False  # a client's exit does not show through an IPC handle: it unregisters

    def read(self, tensor: str, place: Any) -> bytes:
        self._fits(tensor, place.offset, place.byte_size)
        return self._memory.read(place.offset, place.byte_size)

    def write(self, tensor: str, place: Any, data: bytes) -> None:
        self._fits(tensor, place.offset, place.byte_size)
        if len(data) > place.byte_size:
            raise bad(
                f"shared memory size specified with the request for output '{clip(tensor)}' ({place.byte_size} "
                f"bytes) should be at least {len(data)} bytes to hold the results"
            )
        self._memory.write(place.offset, data)

    def close(self) -> None:
        self._memory.close()

    def _fits(self, tensor: str, offset: int, nbytes: int) -> None:
        if offset + nbytes > self.byte_size:
            raise bad(
                f"tensor '{clip(tensor)}': offset {offset} and byte size {nbytes} exceed the {self.byte_size} bytes "
                f"of CUDA shared memory region '{clip(self.name)}'"
            )


def raw_handle_from_json(doc: dict[str, Any]) -> bytes:
    """The IPC handle of an HTTP register request: ``{"raw_handle": {"b64": "..."}}``."""
    raw = doc.get("raw_handle")
    b64 = raw.get("b64") if isinstance(raw, dict) else None
    if not isinstance(b64, str):
        raise bad("Unable to parse 'raw_handle': expected an object with a base64 'b64' string")
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise bad("Unable to parse 'raw_handle': 'b64' is not base64") from None
