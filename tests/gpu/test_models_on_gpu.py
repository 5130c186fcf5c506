"""Models on a GPU instance give the same answers as on the CPU, step by step: the demo LSTM
(TorchScript, Direct and Oldest), a batch-level Python model with torch on the device (DLPack
in and out) and a Triton-style Python model (pb_utils.Tensor.from_dlpack / to_dlpack /
is_cpu). Also: KIND_GPU errors, KIND_AUTO, and refused checkpoints of device state."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import numpy as np
import pytest

from seqserve.engine.errors import Code, InferenceError
from tests.support.gpu import copy_model

INPUT, HIDDEN = 8, 16
GPU = "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]"
CPU = "instance_group [ { count: 1 kind: KIND_CPU } ]"
OLDEST = "oldest { max_candidate_sequences: 16 }"


def lstm_repo(repo: Path) -> None:
    copy_model(repo, "lstm_torchscript", "lstm_cpu", replace={})
    copy_model(repo, "lstm_torchscript", "lstm_gpu", replace={CPU: GPU})
    copy_model(repo, "lstm_torchscript", "lstm_gpu_oldest", replace={CPU: GPU, "direct { }": OLDEST})


async def run_interleaved(s, names: list[str], sequences: int, seed: int) -> dict[tuple[str, int, int], np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 15, size=sequences)
    inputs = {sid: rng.standard_normal((int(n), INPUT)).astype(np.float32) for sid, n in enumerate(lengths, 1)}
    futures = {}
    for step in range(int(lengths.max())):
        for sid, xs in inputs.items():
            if step < len(xs):
                for name in names:
                    futures[(name, sid, step)] = s.submit(
                        name,
                        {"INPUT": xs[step : step + 1]},
                        sequence_id=sid,
                        sequence_start=step == 0,
                        sequence_end=step == len(xs) - 1,
                    )
    done = await asyncio.gather(*futures.values())
    return {k: r.outputs["OUTPUT"] for k, r in zip(futures, done, strict=True)}


async def test_torchscript_lstm_on_the_gpu_matches_the_cpu_per_step(repo, serve):
    lstm_repo(repo)
    s = await serve()
    names = ["lstm_cpu", "lstm_gpu", "lstm_gpu_oldest"]
    for name in names:
        assert s.is_model_ready(name), s.repository_index()
    out = await run_interleaved(s, names, sequences=24, seed=7)
    for (name, sid, step), value in out.items():
        if name != "lstm_cpu":
            np.testing.assert_allclose(value, out[("lstm_cpu", sid, step)], atol=1e-4, err_msg=f"{name} {sid} {step}")


async def test_checkpoints_of_device_state_are_refused(repo, serve):
    lstm_repo(repo)
    s = await serve()
    await s.infer("lstm_gpu", {"INPUT": np.zeros((1, INPUT), np.float32)}, sequence_id=5, sequence_start=True)
    with pytest.raises(InferenceError) as e:
        s.model("lstm_gpu").checkpoint_sequence(5, release=False)
    assert e.value.code == Code.UNSUPPORTED and "on the GPU" in str(e.value)


async def test_a_gpu_the_machine_lacks_is_a_load_error(repo, serve):
    copy_model(repo, "lstm_torchscript", "far", replace={CPU: "instance_group [ { kind: KIND_GPU gpus: [ 99 ] } ]"})
    s = await serve()
    index = {m["name"]: m for m in s.repository_index()}
    assert index["far"]["state"] == "UNAVAILABLE" and "asks for GPU 99" in index["far"]["reason"]


async def test_kind_auto_runs_on_the_gpu(repo, serve):
    copy_model(repo, "lstm_torchscript", "auto", replace={CPU: "instance_group [ { kind: KIND_AUTO } ]"})
    s = await serve()
    assert s.model("auto")._devices.any


BATCH_MODEL = textwrap.dedent(
    '''
    import torch


    class Model:
        """S keeps a running sum on the device; OUT is the new sum, returned as a device tensor."""

        def execute(self, batch):
            state = torch.from_dlpack(batch.states["S"])
            assert state.is_cuda
            x = torch.from_numpy(batch.inputs["X"]).to(state.device)
            new = state + x
            return {"S_OUT": new, "OUT": new.clone()}
    '''
)

TRITON_MODEL = textwrap.dedent(
    """
    import torch
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                s = pb_utils.get_input_tensor_by_name(r, "S")
                assert not s.is_cpu()
                state = torch.from_dlpack(s.to_dlpack())
                x = torch.from_numpy(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()).to(state.device)
                new = state + x
                out.append(
                    pb_utils.InferenceResponse(
                        [pb_utils.Tensor.from_dlpack("S_OUT", new), pb_utils.Tensor.from_dlpack("OUT", new.clone())]
                    )
                )
            return out
    """
)


def sum_config(name: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
sequence_batching {{
  oldest {{ max_candidate_sequences: 8 }}
  state [ {{ input_name: "S" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 2 ]
            initial_state {{ name: "z" data_type: TYPE_FP32 dims: [ 2 ] zero_data: true }} }} ]
}}
{GPU}
"""


@pytest.mark.parametrize("source", [BATCH_MODEL, TRITON_MODEL], ids=["batch-api", "triton-shim"])
async def test_python_model_with_device_state_keeps_running_sums(repo, serve, source):
    (repo / "sum" / "1").mkdir(parents=True)
    (repo / "sum" / "config.pbtxt").write_text(sum_config("sum"))
    (repo / "sum" / "1" / "model.py").write_text(source)
    s = await serve()
    assert s.is_model_ready("sum"), s.repository_index()
    totals = {sid: np.zeros(2, np.float32) for sid in range(1, 7)}
    for step in range(5):
        futs = {}
        for sid in totals:
            x = np.array([[sid, step]], np.float32)
            totals[sid] = totals[sid] + x[0]
            futs[sid] = s.submit("sum", {"X": x}, sequence_id=sid, sequence_start=step == 0, sequence_end=step == 4)
        for sid, fut in futs.items():
            np.testing.assert_allclose((await fut).outputs["OUT"][0], totals[sid])


async def test_onnx_lstm_on_the_gpu_matches_the_cpu_or_says_why_not(repo, serve):
    import onnxruntime

    copy_model(repo, "lstm_onnx", "onnx_cpu", replace={})
    cfg = (repo / "onnx_cpu" / "config.pbtxt").read_text()
    kind = "KIND_CPU" if "KIND_CPU" in cfg else None
    assert kind, "bench/models/lstm_onnx names its instance kind"
    copy_model(repo, "lstm_onnx", "onnx_gpu", replace={"KIND_CPU": "KIND_GPU"})
    s = await serve()
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        index = {m["name"]: m for m in s.repository_index()}
        assert index["onnx_gpu"]["state"] == "UNAVAILABLE"
        assert "onnxruntime-gpu" in index["onnx_gpu"]["reason"]
        return
    out = await run_interleaved(s, ["onnx_cpu", "onnx_gpu"], sequences=12, seed=3)
    for (name, sid, step), value in out.items():
        if name == "onnx_gpu":
            np.testing.assert_allclose(value, out[("onnx_cpu", sid, step)], atol=1e-4, err_msg=f"{sid} {step}")
