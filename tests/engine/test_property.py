"""Property tests: the real engine (Server -> _core -> python backend) against the oracle
(tests/support/oracle.py).

Determinism: the model's `execute` reports each batch on a queue and then blocks until the test
releases that instance. The test mirrors the oracle step by step: it submits one request at a
time (a request that reaches an idle instance starts a batch at once, and the test waits for
that batch before the next submit), then releases instances round-robin, each time waiting for
the next batch the oracle predicts. Only one executor thread moves at any moment, so every batch
is exactly predictable and is compared row by row (padding included).
"""

from __future__ import annotations

import asyncio
import queue
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqserve.engine import Server
from seqserve.engine.errors import Code, InferenceError
from tests.support.models import write_model
from tests.support.oracle import Batch, DirectOracle, Req

# Accumulator with implicit state. Padding rows write a sentinel state that must never leak.
GATED_ACCUMULATOR = """
import queue, threading
import numpy as np

ENTERED = queue.Queue()  # one record per batch, put before the batch blocks
PERMIT = {}  # instance -> Semaphore: one release lets one batch finish
FREE = threading.Event()  # cleanup: stop blocking
SENTINEL = 10**15

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index
        PERMIT[ctx.index] = threading.Semaphore(0)

    def execute(self, batch):
        b = batch.size
        x = batch.inputs["IN_X"]
        s = batch.states["S_IN"]
        ENTERED.put({
            "instance": self.instance, "size": b,
            "start": batch.start.tolist(), "end": batch.end.tolist(), "ready": batch.ready.tolist(),
            "corrid": batch.corrid.tolist(), "x": x.reshape(b).tolist(), "s": s.reshape(b).tolist(),
            "x_shape": x.shape, "s_shape": s.shape,
            "controls": {k: (v.shape, v.reshape(-1).tolist()) for k, v in batch.controls.items()},
        })
        if not FREE.is_set():
            PERMIT[self.instance].acquire(timeout=60)
        out = s + x
        state = np.where(batch.ready.reshape(s.shape[:1] + (1,) * (s.ndim - 1)), out, SENTINEL)
        return {"OUT_X": out, "S_OUT": state}
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
input [ {{ name: "IN_X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUT_X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 600000000
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 2.5 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }}
    {corrid}
  ]
  state [ {{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT64 dims: [ 1 ]
            initial_state {{ data_type: TYPE_INT64 dims: [ 1 ] zero_data: true name: "zero" }} }} ]
}}
"""
CORRID = {
    "int": ', { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }',
    "str": ', { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }',
    "mixed": "",  # a CORRID control has one type; mixed ids are checked through batch.corrid
}
TIMEOUT_S = 2.0  # per expected batch or reply; the engine needs milliseconds


def model_name(instances: int, mbs: int, ids: str) -> str:
    return f"acc_{instances}_{mbs}_{ids}"


@pytest.fixture(scope="module")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("models")
    for instances in (1, 2):
        for mbs in (0, 1, 4):
            for ids in CORRID:
                name = model_name(instances, mbs, ids)
                cfg = CONFIG.format(name=name, mbs=mbs, instances=instances, corrid=CORRID[ids])
                write_model(repo, name, cfg, GATED_ACCUMULATOR)
    return repo


@pytest.fixture(autouse=True, scope="module")
def _no_delay_hooks() -> Any:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TRITONSERVER_DELAY_SCHEDULER", raising=False)
        mp.delenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", raising=False)
        yield


# --------------------------------------------------------------------------- scenarios

INTS = st.one_of(st.integers(1, 12), st.integers(1, 2**64 - 1))
STRS = st.text(alphabet="ab5é", min_size=1, max_size=3)
ID_STRATEGY = {"int": INTS, "str": STRS, "mixed": st.one_of(INTS, STRS)}
# op weights: mostly continue open sequences so that they get long
OPS = ["start"] * 3 + ["step"] * 8 + ["end"] * 3 + ["restart", "single", "stray"]


@st.composite
def scenarios(draw: st.DrawFn, ids: str) -> tuple[int, int, list[list[Req]]]:
    instances = draw(st.sampled_from([1, 2]))
    mbs = draw(st.sampled_from([0, 1, 4]))
    pool = draw(st.lists(ID_STRATEGY[ids], min_size=1, max_size=10, unique_by=lambda v: (type(v), v)))
    open_: list[Any] = []
    waves: list[list[Req]] = []
    for _ in range(draw(st.integers(1, 5))):
        wave: list[Req] = []
        for _ in range(draw(st.integers(1, 14))):
            op = draw(st.sampled_from(OPS))
            value = draw(st.integers(1, 1000))
            if op in ("step", "end", "restart") and open_:
                sid = draw(st.sampled_from(open_))
                wave.append(Req(sid, start=op == "restart", end=op == "end", value=value))
                if op == "end":
                    open_.remove(sid)
                continue
            sid = draw(st.sampled_from(pool))
            if op == "stray":  # no START: an error unless the id happens to be open
                wave.append(Req(sid, end=draw(st.booleans()), value=value))
                if wave[-1].end and sid in open_:
                    open_.remove(sid)
            elif op == "single":
                wave.append(Req(sid, start=True, end=True, value=value))
                if sid in open_:
                    open_.remove(sid)
            else:
                wave.append(Req(sid, start=True, value=value))
                if sid not in open_:
                    open_.append(sid)
        waves.append(wave)
    return instances, mbs, waves


# ------------------------------------------------------------------------------ driver


def _typed(v: Any) -> tuple[str, Any]:
    return (type(v).__name__, v)


def expected_view(b: Batch, ids: str, mbs: int) -> dict[str, Any]:
    view: dict[str, Any] = {
        "instance": b.instance,
        "size": b.size,
        "start": [r.start for r in b.rows],
        "end": [r.end for r in b.rows],
        "ready": [r.ready for r in b.rows],
        # batch.corrid: the id (int or str) on real rows, 0 on padding rows
        "corrid": [_typed(0 if r.corrid is None else r.corrid) for r in b.rows],
        # padding rows' input and state data are meaningless
        "x": [r.value for r in b.rows],
        "s": [r.state for r in b.rows],
    }
    cshape = (b.size, 1) if mbs > 0 else (1,)
    view["controls"] = {
        "START": (cshape, [int(r.start) for r in b.rows]),
        "END": (cshape, [2.5 if r.end else 0.0 for r in b.rows]),
        "READY": (cshape, [r.ready for r in b.rows]),
    }
    if ids == "int":
        view["controls"]["CORRID"] = (cshape, [r.corrid or 0 for r in b.rows])
    elif ids == "str":
        view["controls"]["CORRID"] = (cshape, [(r.corrid or "").encode() for r in b.rows])
    return view


def seen_view(rec: dict[str, Any], mbs: int) -> dict[str, Any]:
    shape = (rec["size"], 1) if mbs > 0 else (1,)
    assert rec["x_shape"] == shape and rec["s_shape"] == shape, rec
    ready = rec["ready"]
    return {
        "instance": rec["instance"],
        "size": rec["size"],
        "start": rec["start"],
        "end": rec["end"],
        "ready": ready,
        "corrid": [_typed(c) for c in rec["corrid"]],
        "x": [v if r else None for v, r in zip(rec["x"], ready, strict=True)],
        "s": [v if r else None for v, r in zip(rec["s"], ready, strict=True)],
        "controls": rec["controls"],
    }


def _inputs(value: int, mbs: int) -> dict[str, np.ndarray]:
    return {"IN_X": np.array([[value]] if mbs > 0 else [value], np.int64)}


async def run_scenario(repo: Path, instances: int, mbs: int, ids: str, waves: list[list[Req]]) -> None:
    name = model_name(instances, mbs, ids)
    # Executor threads only: the test blocks the event loop while it waits for each batch (and
    # the model blocks until the loop releases it), which a batch run inline on the loop could
    # never satisfy. Inline execution is tested in test_inline.py.
    server = Server(repo, inline_max_batch_us=0)
    await server.start(models=[name])
    mod = sys.modules[f"seqserve_models.{name}.v1"]
    oracle = DirectOracle(instances, mbs, model=name)
    tasks: dict[int, asyncio.Task[Any]] = {}
    checked: set[int] = set()

    def expect(batch: Batch, why: str) -> None:
        try:
            rec = mod.ENTERED.get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"engine formed no batch ({why}); oracle expected {batch}") from None
        want = expected_view(batch, ids, mbs)
        assert seen_view(rec, mbs) == want, f"batch #{len(oracle.batches)} ({why})"

    try:
        for w, wave in enumerate(waves):
            for req in wave:
                k = len(oracle.reqs)
                started = oracle.submit(req)
                tasks[k] = asyncio.ensure_future(
                    server.infer(
                        name,
                        _inputs(req.value, mbs),
                        sequence_id=req.id,
                        sequence_start=req.start,
                        sequence_end=req.end,
                    )
                )
                await asyncio.sleep(0)  # runs the task up to its submit
                # expect() blocks this loop thread on purpose: nothing else may move meanwhile
                if k in oracle.errors:
                    assert tasks[k].done(), f"request {k} {req} should fail at once"
                    err = tasks[k].exception()
                    assert isinstance(err, InferenceError) and err.code == Code.INVALID_ARG, err
                    assert err.message == oracle.errors[k]
                elif started is not None:
                    expect(started, f"wave {w}: request {k} {req} reaches an idle instance")
            while any(oracle.held):
                for i in range(instances):
                    if oracle.held[i] is not None:
                        mod.PERMIT[i].release()
                        nxt = oracle.release(i)
                        if nxt is not None:
                            expect(nxt, f"wave {w}: instance {i} released")
            answered = [k for k in oracle.replies if k not in checked]
            results = await asyncio.wait_for(asyncio.gather(*(tasks[k] for k in answered)), TIMEOUT_S)
            got = {k: int(r.outputs["OUT_X"].reshape(-1)[0]) for k, r in zip(answered, results, strict=True)}
            assert got == {k: oracle.replies[k] for k in answered}, f"wave {w} replies"
            checked.update(answered)
            waiting = [k for k in tasks if k not in checked and k not in oracle.errors]
            assert not any(tasks[k].done() for k in waiting), f"wave {w}: a backlogged request was answered"
            assert mod.ENTERED.empty(), f"unexpected batch after wave {w}: {mod.ENTERED.get()}"
    finally:
        mod.FREE.set()
        for sem in mod.PERMIT.values():
            sem.release(1000)
        await server.shutdown(timeout_s=0)
        if tasks:
            await asyncio.wait(tasks.values(), timeout=TIMEOUT_S)
        for t in tasks.values():
            if t.done() and not t.cancelled():
                t.exception()  # retrieved: no "never retrieved" noise
    # whatever never ran was failed by the shutdown, not lost
    for k, t in tasks.items():
        if k not in checked and k not in oracle.errors:
            assert t.done() and isinstance(t.exception(), InferenceError), (k, t)
            assert t.exception().code == Code.UNAVAILABLE


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(scenario=scenarios("int"))
def test_engine_matches_oracle_int_ids(model_repo: Path, scenario: tuple[int, int, list[list[Req]]]) -> None:
    asyncio.run(run_scenario(model_repo, scenario[0], scenario[1], "int", scenario[2]))


@PROPERTY
@given(scenario=scenarios("str"))
def test_engine_matches_oracle_string_ids(model_repo: Path, scenario: tuple[int, int, list[list[Req]]]) -> None:
    asyncio.run(run_scenario(model_repo, scenario[0], scenario[1], "str", scenario[2]))


@PROPERTY
@given(scenario=scenarios("mixed"))
def test_engine_matches_oracle_mixed_ids(model_repo: Path, scenario: tuple[int, int, list[list[Req]]]) -> None:
    asyncio.run(run_scenario(model_repo, scenario[0], scenario[1], "mixed", scenario[2]))


# ------------------------------------------------------------------ fixed scenarios


def test_backlog_handoff_and_restart(model_repo: Path) -> None:
    """Hand-checked: 1 instance, 1 slot; B waits in the backlog until A's END is batched,
    then moves in as a whole; a second START on B continues in place and resets state."""
    waves = [
        [
            Req(1, start=True, value=1),
            Req(2, start=True, value=10),
            Req(1, value=2),
            Req(2, value=20),
            Req(1, end=True, value=3),
            Req(2, start=True, value=100),
            Req(2, end=True, value=5),
            Req(2, value=7),
        ]
    ]
    oracle = DirectOracle(1, 1, model=model_name(1, 1, "int"))
    batches = oracle.run_wave(waves[0])
    assert [[r.req for r in b.rows] for b in batches] == [[0], [2], [4], [1], [3], [5], [6]]
    assert oracle.replies == {0: 1, 2: 3, 4: 6, 1: 10, 3: 30, 5: 100, 6: 105}
    assert set(oracle.errors) == {7}
    asyncio.run(run_scenario(model_repo, 1, 1, "int", waves))


def test_padding_and_slot_order_two_instances(model_repo: Path) -> None:
    """Hand-checked: slot 0 of both instances fills before slot 1; holes are padded."""
    reqs = [Req(s, start=True, value=s) for s in (1, 2, 3, 4, 5)] + [Req(5, value=1), Req(2, value=1)]
    oracle = DirectOracle(2, 4, model=model_name(2, 4, "int"))
    oracle.run_wave(reqs)
    first = [(b.instance, [r.corrid for r in b.rows]) for b in oracle.batches]
    # 1 -> (0,0) starts a batch; 2 -> (1,0) starts one; 3 -> (0,1), 4 -> (1,1), 5 -> (0,2) queue
    assert first == [(0, [1]), (1, [2]), (0, [None, 3, 5]), (1, [2, 4]), (0, [None, None, 5])]
    assert oracle.replies[5] == 6 and oracle.replies[6] == 3
    asyncio.run(run_scenario(model_repo, 2, 4, "int", [reqs]))


def test_int_and_string_ids_are_distinct_sequences(model_repo: Path) -> None:
    """5 and "5" are two sequences with their own slots and state; a batch holding both tells
    the model each row's id with its type (batch.corrid: int, str, and 0 on padding)."""
    reqs = [
        Req(5, start=True, value=1),
        Req("5", start=True, value=2),
        Req(5, value=3),
        Req("5", value=4),
        Req("5", end=True, value=5),
        Req(5, end=True, value=6),
    ]
    oracle = DirectOracle(1, 4, model=model_name(1, 4, "mixed"))
    oracle.run_wave(reqs)
    assert [[r.corrid for r in b.rows] for b in oracle.batches] == [[5], [5, "5"], [5, "5"], [None, "5"]]
    assert oracle.replies == {0: 1, 1: 2, 2: 4, 3: 6, 4: 11, 5: 10}
    asyncio.run(run_scenario(model_repo, 1, 4, "mixed", [reqs]))
