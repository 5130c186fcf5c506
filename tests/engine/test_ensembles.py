"""Ensembles in the engine: Triton's config checks and messages, step models loaded with the
ensemble, sequences through a stateful step, errors, decoupled steps, cancellation,
max_inflight_requests, statistics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, Server
from seqserve.engine.config import load_model_config
from tests.support.ensemble_models import split_model
from tests.support.models import write_model

STEP_CFG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{rest}
"""

TIMES = """
import time
class Model:
    def execute(self, batch):
        time.sleep({delay})
        return {{"Y": batch.inputs["X"] * {n}}}
"""

SUM_STATE = """
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]
}
"""

RUNNING_SUM = """
class Model:
    def execute(self, batch):
        total = batch.states["S_IN"] + batch.inputs["X"]
        return {"Y": total, "S_OUT": total}
"""


def ensemble(
    name: str, steps: list[tuple[str, dict[str, str], dict[str, str]]], *, mbs: int = 4, rest: str = ""
) -> str:
    """An ensemble config INT32 IN -> OUT through ``steps`` (model, input_map, output_map)."""
    body = ",\n".join(
        f'{{ model_name: "{m}" model_version: -1 '
        + " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items())
        + " "
        + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items())
        + " }"
        for m, ins, outs in steps
    )
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{
  {rest}
  step [ {body} ]
}}
"""


def write_ensemble(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)


def step(repo: Path, name: str, n: int = 1, *, mbs: int = 4, delay: float = 0.0, rest: str = "") -> None:
    write_model(repo, name, STEP_CFG.format(name=name, mbs=mbs, rest=rest), TIMES.format(n=n, delay=delay))


def pipeline(repo: Path, name: str = "pipe", *, rest: str = "") -> None:
    """IN -> double (x2) -> sum (a running sum over the sequence) -> OUT."""
    step(repo, "double", 2)
    write_model(repo, "sum", STEP_CFG.format(name="sum", mbs=4, rest=SUM_STATE), RUNNING_SUM)
    write_ensemble(
        repo,
        name,
        ensemble(name, [("double", {"X": "IN"}, {"Y": "doubled"}), ("sum", {"X": "doubled"}, {"Y": "OUT"})], rest=rest),
    )


def x(v: int) -> dict[str, np.ndarray]:
    return {"IN": np.array([[v]], np.int32)}


def out(r: object) -> int:
    return int(r.outputs["OUT"].reshape(-1)[0])  # type: ignore[attr-defined]


# ----------------------------------------------------------------- config checks


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            ensemble("e", [("a", {"X": "IN"}, {"Y": "OUT"})]).replace(
                "ensemble_scheduling", "instance_group [ {} ]\nensemble_scheduling"
            ),
            "instance group should not be specified for ensemble 'e'",
        ),
        (ensemble("e", []).replace("step [  ]", ""), "must specify 'step' for ensemble 'e'"),
        (
            ensemble(
                "e",
                [("a", {"X": "IN"}, {"Y": "mid"}), ("b", {"X": "IN"}, {"Y": "mid"}), ("c", {"X": "mid"}, {"Y": "OUT"})],
            ),
            "ensemble tensor 'mid' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (ensemble("e", [("a", {"X": "OTHER"}, {"Y": "OUT"})]), "ensemble input 'IN' for ensemble e' is not used"),
        (
            ensemble("e", [("a", {"X": "IN"}, {"Y": "mid"}), ("b", {"X": "gap"}, {"Y": "OUT"})]),
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending tensors, 'gap', is not "
            "connected",
        ),
        (
            ensemble("e", [("a", {"X": "IN"}, {"Y": "OUT"}), ("b", {"X": "IN"}, {"Y": "spare"})]),
            "ensemble tensor 'spare' is unused in ensemble 'e'",
        ),
        (
            ensemble("e", [("a", {"X": "IN", "Z": "loop"}, {"Y": "OUT"}), ("b", {"X": "OUT"}, {"Y": "loop"})]),
            "output 'OUT' for ensemble 'e' is not written",
        ),
        (
            'name: "e"\nplatform: "ensemble"\n',
            "ensemble scheduling must be set for ensemble e whose platform is ensemble",
        ),
    ],
)
def test_configs_are_checked_with_tritons_messages(tmp_path: Path, config: str, message: str) -> None:
    d = tmp_path / "e"
    d.mkdir()
    (d / "config.pbtxt").write_text(config)
    with pytest.raises(InferenceError) as e:
        load_model_config(d)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([("missing", {"X": "IN"}, {"Y": "OUT"})], "ensemble 'e' depends on 'missing' which has no loaded version"),
        (
            [("a", {"W": "IN"}, {"Y": "OUT"})],
            "in ensemble e, ensemble tensor IN is mapping to non-existing input W in model a",
        ),
        (
            [("a", {"X": "IN"}, {"V": "OUT"})],
            "in ensemble e, ensemble tensor OUT is mapped from non-existing output V in model a",
        ),
        (
            [("fp", {"X": "IN"}, {"Y": "OUT"})],
            "in ensemble e, ensemble tensor IN: inconsistent data type: TYPE_INT32 is inferred from model e while "
            "TYPE_FP32 is inferred from model fp",
        ),
        (
            [("small", {"X": "IN"}, {"Y": "OUT"})],
            "ensemble e allows maximum batch size 4, but it contains model small which only allows maximum batch "
            "size to be 2",
        ),
    ],
)
async def test_steps_are_checked_against_the_step_models(repo, serve, steps, message) -> None:
    step(repo, "a")
    step(repo, "small", mbs=2)
    write_model(
        repo,
        "fp",
        STEP_CFG.format(name="fp", mbs=4, rest="").replace(
            "TYPE_INT32 dims: [ 1 ] } ]\noutput", "TYPE_FP32 dims: [ 1 ] } ]\noutput"
        ),
        TIMES.format(n=1, delay=0),
    )
    write_ensemble(repo, "e", ensemble("e", steps))
    server = await serve()
    reason = server.failed_models()["e"]
    assert message in reason, reason


async def test_explicit_mode_loads_the_steps_with_the_ensemble(repo) -> None:
    pipeline(repo)
    step(repo, "unrelated")
    server = Server(repo, model_control="explicit")
    await server.start(["pipe"])
    try:
        index = {e["name"]: e["state"] for e in server.repository_index()}
        assert index == {"double": "READY", "sum": "READY", "pipe": "READY", "unrelated": "UNAVAILABLE"}
        assert server.model_metadata("pipe")["platform"] == "ensemble"
        assert server.model_config_json("pipe")["ensemble_scheduling"]["step"][1]["model_name"] == "sum"
    finally:
        await server.shutdown(timeout_s=0)


async def test_ensembles_that_are_each_others_steps_do_not_load(repo) -> None:
    write_ensemble(repo, "a", ensemble("a", [("b", {"IN": "IN"}, {"OUT": "OUT"})]))
    write_ensemble(repo, "b", ensemble("b", [("a", {"IN": "IN"}, {"OUT": "OUT"})]))
    server = Server(repo, model_control="explicit")
    await server.start([])
    try:
        with pytest.raises(InferenceError, match="circular dependency between ensembles: a -> b -> a"):
            await server.load_model("a")
    finally:
        await server.shutdown(timeout_s=0)


# ------------------------------------------------------------------------ running


async def test_a_sequence_runs_through_the_stateful_step(repo, serve) -> None:
    pipeline(repo)
    server = await serve()
    sums = []
    for i, v in enumerate([1, 2, 3]):
        r = await server.infer("pipe", x(v), sequence_id="s1", sequence_start=i == 0, sequence_end=i == 2)
        sums.append(out(r))
    assert sums == [2, 6, 12]
    # the START reset the sum: a new sequence under the same id starts from zero
    r = await server.infer("pipe", x(5), sequence_id="s1", sequence_start=True, sequence_end=True)
    assert out(r) == 10
    stats = {s.name: s for s in server.statistics()}
    assert (stats["pipe"].inference_count, stats["pipe"].execution_count) == (4, 4)
    assert stats["sum"].inference_count == 4 and stats["double"].inference_count == 4
    assert [b.batch_size for b in stats["pipe"].batch_stats] == [1]


async def test_a_step_error_reaches_the_client_with_the_ensemble_name(repo, serve) -> None:
    pipeline(repo)
    server = await serve()
    with pytest.raises(InferenceError) as e:
        await server.infer("pipe", x(1), sequence_id=77)
    assert e.value.code == Code.INVALID_ARG
    assert str(e.value) == (
        "in ensemble 'pipe', inference request for sequence 77 to model 'sum' must specify the START flag on the "
        "first request of the sequence"
    )
    with pytest.raises(InferenceError, match="unexpected inference input 'NOPE' for model 'pipe'"):
        await server.infer("pipe", {"NOPE": np.array([[1]], np.int32)})
    assert server.statistics("pipe")[0].inference_stats.fail.count == 2


async def test_a_decoupled_step_runs_the_next_step_once_per_response(repo, serve) -> None:
    split_model(repo)
    step(repo, "triple", 3)
    config = ensemble("fanout", [("split", {"X": "IN"}, {"Y": "part"}), ("triple", {"X": "part"}, {"Y": "OUT"})], mbs=0)
    write_ensemble(repo, "fanout", config.replace("dims: [ 1 ] } ]\noutput", "dims: [ -1 ] } ]\noutput"))
    server = await serve()
    assert server.model("fanout").decoupled
    got = [
        int(r.outputs["OUT"].reshape(-1)[0])
        async for r in server.stream("fanout", {"IN": np.array([1, 2, 3], np.int32)})
    ]
    assert sorted(got) == [3, 6, 9]
    assert server.statistics("triple")[0].inference_count == 3


async def test_cancelling_a_request_cancels_its_steps(repo, serve) -> None:
    step(repo, "slow", 1, delay=0.3)
    step(repo, "fast", 1)
    write_ensemble(
        repo, "e", ensemble("e", [("slow", {"X": "IN"}, {"Y": "mid"}), ("fast", {"X": "mid"}, {"Y": "OUT"})])
    )
    server = await serve()
    first = server.submit("e", x(1))
    second = server.submit("e", x(2))  # queued behind the first in the slow step: leaves its queue
    await asyncio.sleep(0.05)
    second.cancel()
    assert out(await first) == 1
    await asyncio.sleep(0.4)
    assert server.statistics("fast")[0].inference_count == 1
    assert server.model("e").open_requests == 0


async def test_max_inflight_requests_bounds_each_step(repo, serve) -> None:
    batching = "dynamic_batching { max_queue_delay_microseconds: 100000 }"
    step(repo, "gather", 1, rest=batching)
    step(repo, "gather2", 1, rest=batching)
    write_ensemble(
        repo, "bounded", ensemble("bounded", [("gather", {"X": "IN"}, {"Y": "OUT"})], rest="max_inflight_requests: 1")
    )
    write_ensemble(repo, "free", ensemble("free", [("gather2", {"X": "IN"}, {"Y": "OUT"})]))
    server = await serve()
    for name in ("bounded", "free"):
        results = await asyncio.gather(*(server.infer(name, x(v)) for v in range(4)))
        assert [out(r) for r in results] == [0, 1, 2, 3]
    assert [b.batch_size for b in server.statistics("gather")[0].batch_stats] == [1]  # one at a time
    assert max(b.batch_size for b in server.statistics("gather2")[0].batch_stats) > 1  # batched together


async def test_a_request_cancelled_while_waiting_for_room_ends(repo, serve) -> None:
    step(repo, "slow", 1, delay=0.2)
    write_ensemble(
        repo, "bounded", ensemble("bounded", [("slow", {"X": "IN"}, {"Y": "OUT"})], rest="max_inflight_requests: 1")
    )
    server = await serve()
    first, second, third = (server.submit("bounded", x(v)) for v in (1, 2, 3))
    second.cancel()  # its step request waits for room behind the first
    assert [out(await first), out(await third)] == [1, 3]
    assert server.model("bounded").open_requests == 0
    assert server.statistics("slow")[0].inference_count == 2
