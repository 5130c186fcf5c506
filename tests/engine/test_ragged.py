"""Ragged inputs (``allow_ragged_batch``) through the in-process API: each request keeps its
own extent in the batch (``batch.ragged``, ``batch.request_inputs``), and a model answers with
one array per request, each in its own shape."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, RaggedInput
from tests.support.models import write_model

RECORDING = """
import numpy as np
RECORD = []

class Model:
    def execute(self, batch):
        RECORD.append({
            "flat": batch.inputs["IN"].copy(),
            "shapes": {k: list(v.shapes) for k, v in batch.ragged.items()},
            "offsets": {k: v.offsets.tolist() for k, v in batch.ragged.items()},
            "ready": batch.ready.copy(),
            "size": batch.size,
            "fixed": batch.inputs["FIXED"].copy() if "FIXED" in batch.inputs else None,
        })
        parts = batch.request_inputs("IN")
        # each request's reply: its own input, doubled (BYTES: repeated)
        return {"OUT": [p * 2 for p in parts]}
"""


def seq_config(dtype: str = "TYPE_INT32", extra_input: str = "") -> str:
    return f"""
name: "m"
backend: "python"
max_batch_size: 4
input [ {{ name: "IN" data_type: {dtype} dims: [ -1 ] allow_ragged_batch: true }} {extra_input} ]
output [ {{ name: "OUT" data_type: {dtype} dims: [ -1 ] }} ]
sequence_batching {{
  control_input [ {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }} ]
}}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def record(model: str = "m") -> list[dict]:
    return sys.modules[f"seqserve_models.{model}.v1"].RECORD  # type: ignore[no-any-return]


async def test_ragged_with_padding_rows(repo, serve, monkeypatch):
    """Slots 0, 1 and 2 hold a sequence; then slot 1 has no step: its padding row takes the first
    real request's shape."""
    write_model(repo, "m", seq_config(), RECORDING)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "5")  # every request below is queued first
    s = await serve()
    steps = [
        (1, [[1, 1]], True),
        (2, [[2]], True),
        (3, [[3, 3, 3]], True),
        (1, [[7, 8, 9, 10]], False),
        (3, [[5]], False),
    ]
    tasks = []
    for sid, value, start in steps:
        x = {"IN": np.array(value, np.int32)}
        tasks.append(asyncio.ensure_future(s.infer("m", x, sequence_id=sid, sequence_start=start)))
        await asyncio.sleep(0)
    out = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert [r.outputs["OUT"].tolist() for r in out] == [[[2, 2]], [[4]], [[6, 6, 6]], [[14, 16, 18, 20]], [[10]]]
    first, second = record()
    assert first["shapes"] == {"IN": [(1, 2), (1, 1), (1, 3)]}
    assert first["offsets"] == {"IN": [0, 2, 3, 6]}
    assert first["flat"].tolist() == [1, 1, 2, 3, 3, 3]
    assert second["ready"].tolist() == [True, False, True]
    assert second["shapes"] == {"IN": [(1, 4), (1, 4), (1, 1)]}  # padding: the first real request's shape
    assert second["offsets"] == {"IN": [0, 4, 8, 9]}
    assert second["flat"].shape == (9,)
    assert second["flat"][:4].tolist() == [7, 8, 9, 10] and second["flat"][8] == 5


async def test_ragged_bytes_and_a_fixed_input(repo, serve, monkeypatch):
    fixed = ', { name: "FIXED" data_type: TYPE_FP32 dims: [ 2 ] }'
    write_model(repo, "m", seq_config("TYPE_STRING", fixed), RECORDING)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [
        asyncio.ensure_future(
            s.infer(
                "m",
                {"IN": np.array([words], dtype=object), "FIXED": np.full((1, 2), i, np.float32)},
                sequence_id=i + 1,
                sequence_start=True,
                sequence_end=True,
            )
        )
        for i, words in enumerate([[b"a", b"bc", b""], [b"xyz"]])
    ]
    out = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert out[0].outputs["OUT"].tolist() == [[b"aa", b"bcbc", b""]]
    assert out[1].outputs["OUT"].tolist() == [[b"xyzxyz"]]
    (b,) = record()
    assert b["flat"].tolist() == [b"a", b"bc", b"", b"xyz"]
    assert b["shapes"] == {"IN": [(1, 3), (1, 1)]}
    assert b["fixed"].tolist() == [[0, 0], [1, 1]]  # other inputs stay [B, ...]


async def test_ragged_dynamic_batch_with_multi_row_requests(repo, serve, monkeypatch):
    write_model(
        repo,
        "m",
        """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 preferred_batch_size: [ 3 ] }
instance_group [ { kind: KIND_CPU count: 1 } ]
""",
        RECORDING,
    )
    s = await serve()
    a = np.arange(6, dtype=np.float32).reshape(2, 3)  # two rows of three
    b = np.array([[9]], np.float32)
    out = await asyncio.wait_for(asyncio.gather(s.infer("m", {"IN": a}), s.infer("m", {"IN": b})), 10)
    assert out[0].outputs["OUT"].tolist() == (a * 2).tolist()
    assert out[1].outputs["OUT"].tolist() == [[18]]
    (rec,) = record()
    assert rec["size"] == 3
    assert rec["shapes"] == {"IN": [(2, 3), (1, 1)]}
    assert rec["flat"].tolist() == [0, 1, 2, 3, 4, 5, 9]


async def test_per_request_outputs_are_checked(repo, serve):
    model = """
import numpy as np
class Model:
    def execute(self, batch):
        mode = int(batch.inputs["IN"][0])
        if mode == 0:
            return {"OUT": []}  # not one per request
        if mode == 1:
            return {"OUT": [np.zeros((2, 1), np.int32)]}  # batch dim 2 for a one-row request
        return {"OUT": [np.zeros((1, 5), np.float64)]}  # wrong dtype
"""
    write_model(repo, "m", seq_config(), model)
    s = await serve()
    expected = {
        0: "model 'm' produced output 'OUT' as a list of 0 arrays; expected one per request of the batch (1)",
        1: "model 'm' produced output 'OUT' with shape [2, 1] for a request of 1 row(s); expected batch dimension 1",
        2: "model 'm' produced output 'OUT' as float64, but its config says INT32",
    }
    for mode, message in expected.items():
        with pytest.raises(InferenceError) as ei:
            await s.infer(
                "m", {"IN": np.array([[mode]], np.int32)}, sequence_id=1, sequence_start=True, sequence_end=True
            )
        assert ei.value.code == Code.INTERNAL
        assert str(ei.value).startswith(message + " (request id ")  # the id its log line names


def test_ragged_input_extents():
    r = RaggedInput([(1, 2), (1, 0), (2, 3)])
    assert r.offsets.tolist() == [0, 2, 2, 8]
    assert r.lengths.tolist() == [2, 0, 6]
    parts = r.split(np.arange(8))
    assert [p.shape for p in parts] == [(1, 2), (1, 0), (2, 3)]
    assert parts[2].tolist() == [[2, 3, 4], [5, 6, 7]]


async def test_onnx_and_torch_refuse_ragged_inputs(repo, serve):
    for name, backend in (("onnx_ragged", "onnxruntime"), ("torch_ragged", "pytorch")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f"""
name: "{name}"
backend: "{backend}"
max_batch_size: 4
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""
        )
    s = await serve()
    reasons = {e["name"]: e["reason"] for e in s.repository_index()}
    for name, backend in (("onnx_ragged", "onnxruntime"), ("torch_ragged", "pytorch")):
        assert (
            f"model '{name}': input 'INPUT__0' has allow_ragged_batch, which backend '{backend}' does not support"
            in reasons[name]
        ), reasons[name]
