"""BLS in process: models calling models through the server (engine/backends/bls.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError
from tests.support.bls import bls_model
from tests.support.models import copy_demo_models, copy_model, write_model


def step(x: float) -> dict[str, np.ndarray]:
    return {"INPUT": np.array([[x]], np.float32)}


async def run_sequence(server, model: str, sid: int, values: list[float]) -> list[float]:
    sums = []
    for k, v in enumerate(values):
        r = await server.infer(
            model, step(v), sequence_id=sid, sequence_start=k == 0, sequence_end=k == len(values) - 1
        )
        sums.append(float(r.outputs["OUTPUT"].reshape(-1)[0]))
    return sums


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_bls_calls_accumulator_in_a_sequence(repo, serve, mode) -> None:
    copy_demo_models(repo, "accumulator")
    bls_model(repo, mode=mode)
    s = await serve()
    assert await run_sequence(s, "bls_sum", 11, [1, 2, 3]) == [1, 3, 6]
    # the accumulator's sequence was the caller's: same id, ended with it
    assert s.model("accumulator").sequence_slot(11) is None
    assert await run_sequence(s, "bls_sum", 12, [5, 5]) == [5, 10]


async def test_bls_sequences_interleaved(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    bls_model(repo)
    s = await serve()
    results = await asyncio.gather(*(run_sequence(s, "bls_sum", 100 + i, [i, 1, 1, 1]) for i in range(1, 9)))
    for i, sums in enumerate(results, start=1):
        assert sums == [i, i + 1, i + 2, i + 3]


async def test_bls_holds_the_callee_slot(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    bls_model(repo)
    s = await serve()
    await s.infer("bls_sum", step(2), sequence_id=7, sequence_start=True)
    assert s.model("accumulator").sequence_slot(7) is not None  # held between steps, as a client's
    r = await s.infer("bls_sum", step(3), sequence_id=7, sequence_end=True)
    assert float(r.outputs["OUTPUT"].reshape(-1)[0]) == 5


@pytest.mark.parametrize("mode", ["stream", "async_stream"])
async def test_bls_decoupled_callee(repo, serve, mode) -> None:
    copy_model(repo, "repeat")
    bls_model(repo, callee="repeat", mode=mode)
    s = await serve()
    r = await s.infer("bls_sum", step(4), sequence_id=1, sequence_start=True, sequence_end=True)
    assert float(r.outputs["OUTPUT"].reshape(-1)[0]) == 1 + 2 + 3 + 4


async def test_exec_without_decoupled_on_a_decoupled_callee(repo, serve) -> None:
    copy_model(repo, "repeat")
    bls_model(repo, callee="repeat", mode="sync")
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.infer("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    assert e.value.message.startswith("Model repeat is using the decoupled."), e.value.message
    assert "Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls" in e.value.message


async def test_bls_unknown_callee_fails_the_request_with_its_error(repo, serve) -> None:
    bls_model(repo, callee="nowhere")
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.infer("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    assert "nowhere" in e.value.message


async def test_bls_bad_input_is_the_callee_error(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    bls_model(repo, mode="bad_input")
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.infer("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    assert e.value.code == Code.INVALID_ARG
    assert e.value.message.endswith(
        "inference input 'INPUT' data-type is 'INT32', but model 'accumulator' expects 'FP32'"
    )


@pytest.mark.parametrize("mode", ["sync", "async"])  # async: the caller is known inside the task too
async def test_bls_self_call_is_refused(repo, serve, mode) -> None:
    bls_model(repo, callee="bls_sum", mode=mode)
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.infer("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    assert "called itself" in e.value.message
    assert s.is_live()


SLOW = """
import time

class Model:
    def execute(self, batch):
        time.sleep(2)
        return {"OUTPUT": batch.inputs["INPUT"]}
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


async def test_bls_timeout(repo, serve) -> None:
    write_model(repo, "slow", SLOW_CONFIG, SLOW)
    bls_model(repo, callee="slow", timeout_us="100000")
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.infer("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    assert e.value.code == Code.UNAVAILABLE
    assert e.value.message.startswith("Request timeout expired"), e.value.message


async def test_bls_decoupled_callee_bare_final_flag(repo, serve) -> None:
    copy_model(repo, "repeat")
    bls_model(repo, callee="repeat", mode="stream")
    s = await serve()
    # IN = 1..0 is empty: repeat sends the final flag alone, an empty response to the iterator
    r = await s.infer("bls_sum", step(0), sequence_id=1, sequence_start=True, sequence_end=True)
    assert float(r.outputs["OUTPUT"].reshape(-1)[0]) == 0


async def test_a_calling_model_never_runs_inline(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    bls_model(repo)
    s = await serve(inline_max_batch_us=1_000_000)  # every batch counts as cheap
    assert await run_sequence(s, "bls_sum", 3, [1.0] * 30) == [float(k) for k in range(1, 31)]
    stats = s.model("bls_sum").inline_stats
    assert stats.inline_batches == 0 and not stats.active


BATCH_CALLER = """
import numpy as np


class Model:
    def initialize(self, ctx):
        self.ctx = ctx

    def execute(self, batch):
        out = np.zeros_like(batch.inputs["INPUT"])
        for i in range(batch.size):
            if not batch.ready[i]:
                continue
            r = self.ctx.infer(
                "accumulator",
                {"INPUT": batch.inputs["INPUT"][i : i + 1]},
                sequence_id=int(batch.corrid[i]),
                sequence_start=bool(batch.start[i]),
                sequence_end=bool(batch.end[i]),
            )
            out[i] = r.outputs["OUTPUT"][0]
            if batch.end[i]:  # a decoupled callee's responses, one by one
                out[i] += sum(float(x.outputs["OUT"][0]) for x in self.ctx.stream(
                    "repeat", {"IN": np.array([100, 200], np.int32), "MODE": np.array([1], np.int32)}))
        return {"OUTPUT": out}
"""


async def test_batch_api_context_calls(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    copy_model(repo, "repeat")
    d = copy_model(repo, "bls_sum", "batch_caller", model_py=BATCH_CALLER)
    assert d.is_dir()
    s = await serve()
    assert await run_sequence(s, "batch_caller", 9, [1, 2, 3]) == [1, 3, 6 + 300]


async def test_shutdown_with_a_call_in_flight(repo, serve) -> None:
    write_model(repo, "slow", SLOW_CONFIG, SLOW)
    bls_model(repo, callee="slow")
    s = await serve()
    pending = s.submit("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    await asyncio.sleep(0.2)  # the call is in the slow model's execute
    await asyncio.wait_for(s.shutdown(timeout_s=10), 30)
    result = await pending  # the callee finished its batch before it closed, so the caller got it
    assert float(result.outputs["OUTPUT"].reshape(-1)[0]) == 1.0
    assert s.hung_instances == []


async def test_process_isolated_models_cannot_call(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    cfg = bls_model(repo) / "config.pbtxt"
    cfg.write_text(
        cfg.read_text().replace(
            "parameters [", 'parameters [\n  { key: "isolation" value: { string_value: "process" } },'
        )
    )
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.infer("bls_sum", step(1), sequence_id=1, sequence_start=True, sequence_end=True)
    assert "process-isolated models cannot call models" in e.value.message


CALLS_IN_INITIALIZE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.InferenceRequest(
            model_name="accumulator", inputs=[pb_utils.Tensor("INPUT", np.ones((1, 1), np.float32))],
            requested_output_names=["OUTPUT"],
        ).exec()

    def execute(self, requests):
        return []
"""


async def test_no_calls_from_initialize(repo, serve) -> None:
    copy_demo_models(repo, "accumulator")
    copy_model(repo, "bls_sum", model_py=CALLS_IN_INITIALIZE)
    s = await serve()
    assert "BLS is only supported during the 'execute' function." in s.failed_models()["bls_sum"]
    assert s.model("accumulator") is not None


async def test_a_circle_through_another_model_is_refused(repo, serve) -> None:
    """ping (one instance) calls pong, whose execute calls ping: ping's only instance is waiting."""
    for name, callee in (("ping", "pong"), ("pong", "ping")):
        cfg = bls_model(repo, name, callee=callee) / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace("count: 2", "count: 1"))
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await asyncio.wait_for(s.infer("ping", step(1), sequence_id=1, sequence_start=True, sequence_end=True), 30)
    assert e.value.code == Code.UNAVAILABLE
    assert "model 'pong' called model 'ping': refused, since every instance of 'ping', 'pong' would wait" in str(
        e.value
    )
    assert s.is_live()
