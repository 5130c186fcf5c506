"""Device arrays as the engine meets them in model results: anything with
``__cuda_array_interface__`` (torch and cupy CUDA tensors) or a ``__dlpack_device__`` on a CUDA
device. ``to_host`` brings one to a numpy array (one synchronous copy: replies are host bytes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from seqserve.engine.device.memory import DLPACK_CPU


def is_device_array(value: Any) -> bool:
    if hasattr(value, "__cuda_array_interface__"):
        return True
    device = getattr(value, "__dlpack_device__", None)
    return device is not None and int(device()[0]) != DLPACK_CPU


def to_host(value: Any) -> np.ndarray:
    """A numpy copy of a device array; host arrays (numpy, or DLPack on the CPU) pass through."""
    if isinstance(value, np.ndarray):
        return value
    cpu = getattr(value, "cpu", None)  # torch: its own copy, ordered on its current stream
    if cpu is not None and hasattr(value, "numpy"):
        return cpu().detach().contiguous().numpy()  # type: ignore[no-any-return]
    get = getattr(value, "get", None)  # cupy
    if get is not None and hasattr(value, "__cuda_array_interface__"):
        return np.asarray(get())
    iface = getattr(value, "__cuda_array_interface__", None)
    if iface is not None:
        return _copy_interface(iface)
    if hasattr(value, "__dlpack_device__") and int(value.__dlpack_device__()[0]) == DLPACK_CPU:
        return np.from_dlpack(value)
    raise TypeError(f"cannot bring a {type(value).__name__} to the host: it is neither numpy, torch, cupy nor CUDA")


def _copy_interface(iface: dict[str, Any]) -> np.ndarray:
    from cuda.bindings import runtime

    if iface.get("strides") is not None:
        raise TypeError("a device array with strides cannot be copied to the host here: make it contiguous")
    out = np.empty(tuple(iface["shape"]), np.dtype(iface["typestr"]))
    (status,) = runtime.cudaMemcpy(
        out.ctypes.data, int(iface["data"][0]), out.nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost
    )
    if status != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaMemcpy (device to host) failed: {status}")
    return out
