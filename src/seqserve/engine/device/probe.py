"""Whether this process can use a GPU, and why not when it cannot: asked once, through
cuda-python (the ``gpu`` extra), never imported on the CPU path until a GPU instance asks."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuProbe:
    """The usable CUDA devices (their names, by ordinal), or the reason there are none."""

    names: tuple[str, ...] = ()
    reason: str = ""

    @property
    def count(self) -> int:
        return len(self.names)


@functools.cache
def probe_gpus() -> GpuProbe:
    try:
        from cuda.bindings import runtime
    except ImportError:
        return GpuProbe(reason="cuda-python is not installed (pip install 'seqserve[gpu]')")
    try:
        err, count = runtime.cudaGetDeviceCount()
    except Exception as e:  # a broken driver install raises from the binding itself
        return GpuProbe(reason=f"the CUDA runtime failed: {type(e).__name__}: {e}")
    if err != runtime.cudaError_t.cudaSuccess:
        _, text = runtime.cudaGetErrorString(err)
        return GpuProbe(reason=f"no usable CUDA driver or device ({text.decode(errors='replace')})")
    if count == 0:
        return GpuProbe(reason="the CUDA driver reports no device")
    names: list[str] = []
    for ordinal in range(count):
        err, prop = runtime.cudaGetDeviceProperties(ordinal)
        name = prop.name if err == runtime.cudaError_t.cudaSuccess else b"?"
        names.append(name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name))
    return GpuProbe(names=tuple(names))


def torch_gpu_missing() -> str:
    """Why torch cannot run on a GPU here ("" when it can): the GPU tests' and the GPU bench's
    precondition (no GPU, torch missing, or torch without CUDA)."""
    probe = probe_gpus()
    if not probe.count:
        return probe.reason
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    return "" if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device"
