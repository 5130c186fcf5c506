"""The device state table on a real GPU: the row-copy kernel against its reference, and the
table's resets, in-place reads, gathers and scatters (the CPU tests check the same with host
memory: tests/unit/test_device_state_table.py)."""

from __future__ import annotations

import ctypes

import numpy as np

from seqserve.engine._core import StateSpec
from seqserve.engine.device.rows import copy_rows_reference


def stream():
    from seqserve.engine.device.cuda import CudaStream

    return CudaStream(0)


def test_row_copy_kernel_matches_its_reference_for_every_row_size():
    s = stream()
    rng = np.random.default_rng(3)
    try:
        for row_bytes in (1, 4, 12, 16, 48, 8192, 8200):
            rows = 300
            src = rng.integers(0, 255, size=(rows, row_bytes), dtype=np.uint8)
            dst = rng.integers(0, 255, size=(rows, row_bytes), dtype=np.uint8)
            src_rows = rng.permutation(rows)[:200].astype(np.int32)
            dst_rows = rng.permutation(rows)[:200].astype(np.int32)
            d_src, d_dst = s.alloc(src.nbytes), s.alloc(dst.nbytes)
            d_si, d_di = s.alloc(src_rows.nbytes), s.alloc(dst_rows.nbytes)
            for dev, host in ((d_src, src), (d_dst, dst), (d_si, src_rows), (d_di, dst_rows)):
                s.copy_to_device(dev, host.ctypes.data, host.nbytes)
            s.synchronize()
            s.copy_rows(d_dst, d_di, d_src, d_si, len(src_rows), row_bytes)
            got = np.empty_like(dst)
            s.copy_to_host(got.ctypes.data, d_dst, got.nbytes)
            s.synchronize()
            copy_rows_reference(dst, dst_rows, src, src_rows)
            np.testing.assert_array_equal(got, dst, err_msg=f"row_bytes={row_bytes}")
    finally:
        s.close()


def spec(dims: list[int], initial: float, *, same_buffer: bool = False) -> StateSpec:
    init = np.full(dims, initial, np.float32)
    return StateSpec(
        input_name="S",
        output_name="S_OUT",
        dtype=np.dtype(np.float32),
        dims=dims,
        initial=init.tobytes(),
        initial_dims=dims,
        same_buffer=same_buffer,
    )


def test_table_keeps_many_sequences_apart_direct_and_oldest():
    import torch

    from seqserve.engine.device.state_table import DeviceStateTable

    s = stream()
    slots, dims = 64, [256]
    table = DeviceStateTable([spec(dims, 1.0)], slots=slots, max_rows=slots, batched=True, memory=s)
    expected = np.ones((slots, *dims), np.float32)
    rng = np.random.default_rng(5)
    try:
        torch_stream = torch.cuda.ExternalStream(s.handle)
        for step in range(40):
            direct = step % 2 == 0
            rows = np.arange(slots, dtype=np.int32) if direct else rng.permutation(slots)[:20].astype(np.int32)
            ready = rng.random(rows.size) < 0.8
            start = ready & (rng.random(rows.size) < 0.1)
            expected[rows[start]] = 1.0
            views = table.begin(rows, ready, start)
            with torch.cuda.stream(torch_stream):
                cur = torch.from_dlpack(views["S"])
                np.testing.assert_allclose(
                    cur.cpu().numpy()[ready], expected[rows[ready]], err_msg=f"step {step} (direct={direct})"
                )
                nxt = cur + torch.arange(rows.size, device=cur.device, dtype=torch.float32)[:, None]
                table.commit("S", nxt)
                table.finish()
            expected[rows[ready]] += np.arange(rows.size, dtype=np.float32)[ready][:, None]
        for slot in range(slots):
            np.testing.assert_allclose(table.read_slot("S", slot), expected[slot])
    finally:
        table.close()
        s.close()


def test_same_buffer_state_on_the_device_keeps_real_rows_only():
    import torch

    from seqserve.engine.device.state_table import DeviceStateTable

    s = stream()
    table = DeviceStateTable([spec([4], 0.0, same_buffer=True)], slots=4, max_rows=4, batched=True, memory=s)
    try:
        views = table.begin(np.arange(4, dtype=np.int32), np.array([1, 0, 1, 0], bool), np.zeros(4, bool))
        with torch.cuda.stream(torch.cuda.ExternalStream(s.handle)):
            torch.from_dlpack(views["S"]).add_(5.0)
        table.finish()
        assert [float(table.read_slot("S", i)[0]) for i in range(4)] == [5.0, 0.0, 5.0, 0.0]
    finally:
        table.close()
        s.close()


def test_pinned_memory_is_page_locked_host_memory():
    s = stream()
    try:
        ptr = s.alloc_pinned(4096)
        buf = (ctypes.c_uint8 * 4096).from_address(ptr)
        buf[0] = 7
        dev = s.alloc(4096)
        s.copy_to_device(dev, ptr, 4096)
        back = np.zeros(4096, np.uint8)
        s.copy_to_host(back.ctypes.data, dev, 4096)
        s.synchronize()
        assert back[0] == 7
    finally:
        s.close()


def test_gpu_metrics_read_every_gpu():
    from seqserve.engine.device.nvml import GpuMetricsReader

    reader = GpuMetricsReader()
    assert reader.available, reader.reason
    (first, *_) = reader.read()
    assert first.uuid.startswith("GPU-")
    assert first.values["nv_gpu_memory_total_bytes"] > first.values["nv_gpu_memory_used_bytes"] > 0
    assert 0.0 <= first.values["nv_gpu_utilization"] <= 1.0
