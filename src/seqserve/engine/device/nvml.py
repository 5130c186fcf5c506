"""GPU metrics with Triton's names, read through NVML (``nvidia-ml-py``, the ``gpu`` extra) at
scrape time: utilization, memory, power and energy per GPU, labelled ``gpu_uuid`` as Triton
labels them. Without NVML or a GPU there are no GPU families (and one reason, logged once)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("seqserve.metrics")

#: (name, type, help) as Triton registers its GPU metrics
GPU_FAMILIES = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started."),
)


@dataclass(slots=True)
class GpuSample:
    uuid: str
    values: dict[str, float] = field(default_factory=dict)


class GpuMetricsReader:
    """Reads every GPU's figures on demand; ``reason`` says why there are none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._handles: list[tuple[str, Any]] = []
        self._energy_start: dict[str, float] = {}
        self.reason = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                self._handles.append((uuid, handle))
                self._energy_start[uuid] = _try(lambda h=handle: pynvml.nvmlDeviceGetTotalEnergyConsumption(h)) or 0.0
            self._nvml = pynvml
            if not self._handles:
                self.reason = "NVML reports no GPU"
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install 'seqserve[gpu]')"
        except Exception as e:  # no driver: NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self.reason = f"NVML is not usable: {type(e).__name__}: {e}"

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def read(self) -> list[GpuSample]:
        nvml = self._nvml
        out: list[GpuSample] = []
        with self._lock:
            for uuid, h in self._handles:
                s = GpuSample(uuid)
                util = _try(lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                if util is not None:
                    s.values["nv_gpu_utilization"] = util / 100.0
                mem = _try(lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h))
                if mem is not None:
                    s.values["nv_gpu_memory_total_bytes"] = float(mem.total)
                    s.values["nv_gpu_memory_used_bytes"] = float(mem.used)
                power = _try(lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))  # milliwatts
                if power is not None:
                    s.values["nv_gpu_power_usage"] = power / 1000.0
                limit = _try(lambda h=h: nvml.nvmlDeviceGetPowerManagementLimit(h))
                if limit is not None:
                    s.values["nv_gpu_power_limit"] = limit / 1000.0
                energy = _try(lambda h=h: nvml.nvmlDeviceGetTotalEnergyConsumption(h))  # millijoules
                if energy is not None:
                    s.values["nv_energy_consumption"] = (energy - self._energy_start.get(uuid, 0.0)) / 1000.0
                out.append(s)
        return out


def _try(read: Any) -> Any:
    """One NVML figure, or None where this GPU does not report it (NVMLError_NotSupported)."""
    try:
        return read()
    except Exception:
        return None
