"""The CPU-side arithmetic of GPU instances (docs/gpu.md): row plans, staging layouts, the
row-copy kernel's launch grid, and the kernel source itself compiled by nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from seqserve.engine.device.kernels import SOURCE, THREADS, launch_grid
from seqserve.engine.device.rows import StagingLayout, copy_rows_reference, plan_rows


def test_consecutive_slots_in_order_are_read_in_place():
    plan = plan_rows(np.array([2, 3, 4]), np.ones(3, bool), np.zeros(3, bool), in_place_allowed=True)
    assert plan.in_place_base == 2 and not plan.gathered
    assert plan.scatter_slots.tolist() == [2, 3, 4] and plan.scatter_rows.tolist() == [0, 1, 2]


def test_out_of_order_slots_are_gathered():
    plan = plan_rows(np.array([3, 1, 2]), np.ones(3, bool), np.zeros(3, bool), in_place_allowed=True)
    assert plan.gathered and plan.gather_slots.tolist() == [3, 1, 2]


def test_same_buffer_states_are_always_gathered():
    plan = plan_rows(np.array([0, 1]), np.ones(2, bool), np.zeros(2, bool), in_place_allowed=False)
    assert plan.gathered


def test_padding_rows_are_never_written_and_start_rows_reset():
    ready = np.array([True, False, True, True])
    start = np.array([True, True, False, True])  # a padding row's START flag means nothing
    plan = plan_rows(np.array([0, 1, 2, 3]), ready, start, in_place_allowed=True)
    assert plan.reset_slots.tolist() == [0, 3]
    assert plan.scatter_slots.tolist() == [0, 2, 3] and plan.scatter_rows.tolist() == [0, 2, 3]
    assert all(a.dtype == np.int32 for a in (plan.reset_slots, plan.scatter_slots, plan.scatter_rows))


def test_plans_refuse_rows_without_slots_and_mismatched_lengths():
    with pytest.raises(ValueError, match="no slot"):
        plan_rows(np.array([0, -1]), np.ones(2, bool), np.zeros(2, bool), in_place_allowed=True)
    with pytest.raises(ValueError, match="equal 1-D"):
        plan_rows(np.array([0, 1]), np.ones(3, bool), np.zeros(2, bool), in_place_allowed=True)


def test_staging_layout_aligns_every_piece_and_fills_it():
    layout = StagingLayout.of([3, 8, 0, 5])
    assert layout.offsets == (0, 16, 32, 32) and layout.total == 37
    buf = np.zeros(layout.total, np.uint8)
    pieces = [
        np.array([1, 2, 3], np.uint8),
        np.array([7, 9], np.int32),
        np.zeros(0, np.uint8),
        np.arange(5, dtype=np.uint8),
    ]
    layout.fill(buf, pieces)
    assert buf[:3].tolist() == [1, 2, 3]
    assert buf[16:24].view(np.int32).tolist() == [7, 9]
    assert buf[32:37].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="smaller"):
        layout.fill(np.zeros(10, np.uint8), pieces)


def test_copy_rows_reference_moves_whole_rows():
    src = np.arange(12, dtype=np.uint8).reshape(3, 4)
    dst = np.zeros((4, 4), np.uint8)
    copy_rows_reference(dst, np.array([3, 0]), src, np.array([1, 2]))
    assert dst[3].tolist() == [4, 5, 6, 7] and dst[0].tolist() == [8, 9, 10, 11] and not dst[1:3].any()


@pytest.mark.parametrize(
    ("pairs", "row_bytes", "grid"),
    [(1, 4, (1, 1)), (64, 8192, (2, 64)), (512, 16, (1, 512)), (70000, 1 << 20, (64, 65535))],
)
def test_launch_grid_covers_rows_within_limits(pairs, row_bytes, grid):
    assert launch_grid(pairs, row_bytes) == grid
    assert THREADS == 256


def test_kernel_source_compiles_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but nvcc is missing: the row-copy kernel's source must be compiled in CI")
        pytest.skip("nvcc is not installed: the kernel source is compiled at run time by NVRTC only")
    src = tmp_path / "rows.cu"
    src.write_text(SOURCE)
    done = subprocess.run(
        [nvcc, "--ptx", "-arch=compute_80", "-o", str(tmp_path / "rows.ptx"), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert ".entry seqserve_copy_rows" in (tmp_path / "rows.ptx").read_text()
