"""tests/gpu: GPU instances on a real CUDA device (docs/gpu.md). Without one every test here is
skipped with the reason; tools/gpu_check.sh sets SEQSERVE_REQUIRE_GPU=1, which turns a skip
into a failure (the device check must run all of them)."""

from __future__ import annotations

import os

import pytest

from seqserve.engine.device.probe import torch_gpu_missing


def gpu_missing() -> str:
    """Why these tests cannot run here ("" when they can)."""
    return torch_gpu_missing()


@pytest.fixture(autouse=True)
def _needs_gpu() -> None:
    why = gpu_missing()
    if why:
        if os.environ.get("SEQSERVE_REQUIRE_GPU") == "1":
            pytest.fail(f"SEQSERVE_REQUIRE_GPU=1 but no GPU: {why}")
        pytest.skip(f"no GPU: {why}")
