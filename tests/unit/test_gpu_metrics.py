"""GPU metrics (engine/device/nvml.py) on a machine without a GPU: no families, and a reason."""

from __future__ import annotations

from seqserve.engine.device.nvml import GPU_FAMILIES, GpuMetricsReader


def test_without_a_gpu_there_are_no_samples_and_a_reason():
    reader = GpuMetricsReader()
    if reader.available:  # a GPU machine: tests/gpu checks the figures
        assert all(s.uuid for s in reader.read())
        return
    assert reader.read() == [] and reader.reason


def test_family_names_are_tritons():
    names = [n for n, _t, _h in GPU_FAMILIES]
    assert names == [
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
    ]
