"""CUDA IPC regions (engine/device/ipc.py) refuse bad registrations before touching CUDA."""

from __future__ import annotations

import pytest

from seqserve.engine.device.ipc import CudaIpcError, CudaIpcMemory


def test_a_handle_of_the_wrong_length_is_refused():
    with pytest.raises(CudaIpcError, match="64 bytes, not 3"):
        CudaIpcMemory(b"abc", 0, 16)


def test_a_region_needs_a_positive_size():
    with pytest.raises(CudaIpcError, match="positive byte_size"):
        CudaIpcMemory(bytes(64), 0, 0)


def test_a_device_the_server_cannot_use_is_refused():
    pytest.importorskip("cuda.bindings", reason="cuda-python (the gpu extra) is not installed")
    with pytest.raises(CudaIpcError, match="CUDA device 99 is not usable here"):
        CudaIpcMemory(bytes(64), 99, 16)
