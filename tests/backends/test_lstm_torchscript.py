"""The TorchScript export of the demo LSTM (bench/models/lstm_torchscript) against the ONNX one
(bench/models/lstm_onnx), both built by tools/make_lstm.py from the same weights.

A few sequences (more than the 8 slots, so some wait in the Direct backlog) are submitted to the
in-process Server step by step, their steps interleaved round-robin, to both models; every
step's OUTPUT must agree. Skipped without torch (an optional extra), unless SEQSERVE_REQUIRE_TORCH=1.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import onnxruntime  # noqa: F401  (a runtime dependency: missing, it is an error, not a skip)
import pytest

from tests.support.checks import import_torch

import_torch()

BENCH_MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
MODELS = ("lstm_onnx", "lstm_torchscript")
SEQUENCES = 12
INPUT_SIZE, HIDDEN = 8, 16


@pytest.fixture
def lstm_repo(repo: Path) -> Path:
    for name in MODELS:
        shutil.copytree(BENCH_MODELS / name, repo / name)
    return repo


async def test_torchscript_matches_onnx_per_step(lstm_repo, serve):
    s = await serve()
    for name in MODELS:
        assert s.is_model_ready(name), name
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 20, size=SEQUENCES)
    inputs = {sid: rng.standard_normal((int(n), INPUT_SIZE)).astype(np.float32) for sid, n in enumerate(lengths, 1)}

    futures: dict[tuple[str, int, int], asyncio.Future] = {}
    for step in range(int(lengths.max())):
        for sid, xs in inputs.items():
            if step >= len(xs):
                continue
            for name in MODELS:
                futures[(name, sid, step)] = s.submit(
                    name,
                    {"INPUT": xs[step : step + 1]},
                    sequence_id=sid,
                    sequence_start=step == 0,
                    sequence_end=step == len(xs) - 1,
                )
    results = dict(zip(futures, await asyncio.gather(*futures.values()), strict=True))

    for sid, xs in inputs.items():
        for step in range(len(xs)):
            onnx_out, ts_out = (results[(name, sid, step)].outputs["OUTPUT"] for name in MODELS)
            assert onnx_out.shape == ts_out.shape == (1, HIDDEN)
            assert ts_out.dtype == np.float32
            np.testing.assert_allclose(ts_out, onnx_out, rtol=0, atol=1e-5, err_msg=f"seq {sid} step {step}")

    # the state was carried: the last step of the longest sequence differs from the same input after a fresh START
    sid = max(inputs, key=lambda k: len(inputs[k]))
    last = len(inputs[sid]) - 1
    fresh = await s.infer(
        "lstm_torchscript", {"INPUT": inputs[sid][last:]}, sequence_id=999, sequence_start=True, sequence_end=True
    )
    assert not np.allclose(fresh.outputs["OUTPUT"], results[("lstm_torchscript", sid, last)].outputs["OUTPUT"])
    for name in MODELS:
        (st,) = s.statistics(name)
        assert st.inference_count >= int(lengths.sum())
        assert st.execution_count < st.inference_count  # steps of different sequences shared batches
