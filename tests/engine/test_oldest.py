"""Oldest sequence batching through the in-process API (reference sections 3, 4.5 and 8).

Batches are made deterministic with TRITONSERVER_DELAY_SCHEDULER (hold the first batch until N
requests sit in slot queues / the instance's batcher) and, where sequences wait in the backlog,
TRITONSERVER_BACKLOG_DELAY_SCHEDULER: every request of a scenario is queued first, then the
batches form one after another. The property test instead holds the model's first batch on a
gate, so that everything else queues behind it, and checks invariants that hold for any timing.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqserve.engine import Code, InferenceError, Server
from tests.support.checks import expect_error, start_error
from tests.support.models import ACC_STATE, ACCUM_MODEL, RECORDING_MODEL, ctl, in_x_config, recorded, rows, write_model

# ----------------------------------------------------------------------------- helpers

CONTROLS = ", ".join(
    [
        *(ctl(n, n, "int32_false_true: [ 0, 1 ]") for n in ("START", "END", "READY")),
        ctl("CORRID", "CORRID", "data_type: TYPE_UINT64"),
    ]
)


def config(
    *,
    mbs: int = 4,
    oldest: str = "",
    seq: str = "",
    extra: str = "",
    strategy: str = "oldest",
    name: str = "m",
    dims: str = "[ 1 ]",
) -> str:
    block = f"{strategy} {{ {oldest} }}" if strategy else ""
    scheduling = f"""
sequence_batching {{
  {block}
  control_input [ {CONTROLS} ]
  {ACC_STATE}
  {seq}
}}"""
    return in_x_config(extra + scheduling, name=name, mbs=mbs, dims=dims)


def x_in(value: int, mbs: int = 4) -> dict[str, np.ndarray]:
    return {"IN_X": np.array([[value]] if mbs > 0 else [value], np.int32)}


async def send(s, seq_id, value=0, *, start=False, end=False, mbs=4, timeout_us=0) -> asyncio.Future:
    """Submit without waiting for the result; returns once the request has been queued."""
    task = asyncio.ensure_future(
        s.infer(
            "m", x_in(value, mbs), sequence_id=seq_id, sequence_start=start, sequence_end=end, timeout_us=timeout_us
        )
    )
    await asyncio.sleep(0)  # the task runs up to its submit
    return task


async def call(s, seq_id, value=0, *, start=False, end=False, mbs=4) -> int:
    r = await s.infer("m", x_in(value, mbs), sequence_id=seq_id, sequence_start=start, sequence_end=end)
    return int(r.outputs["OUT_X"].reshape(-1)[0])


async def results(tasks, timeout=10.0) -> list[int]:
    out = await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    return [int(r.outputs["OUT_X"].reshape(-1)[0]) for r in out]


def flat(rec: list[dict], kind: str, name: str) -> list[list]:
    return [b[kind][name].reshape(-1).tolist() for b in rec]


A, B, C, D, E = 101, 102, 103, 104, 105


# --------------------------------------------------- one request per sequence per batch


async def test_batch_never_holds_two_requests_of_a_sequence(repo, serve, monkeypatch):
    write_model(repo, "m", config(), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    assert s.model("m").strategy_name == "oldest"
    tasks = [
        await send(s, A, 1, start=True),
        await send(s, A, 2),
        await send(s, A, 3, end=True),
        await send(s, B, 10, start=True),
        await send(s, B, 20, end=True),
        await send(s, C, 100, start=True, end=True),
    ]
    assert await results(tasks) == [1, 3, 6, 10, 30, 100]
    rec = recorded(s, "m")
    # Direct would have put A's three requests in one slot queue and B's two in another and
    # needed three batches too, but with padding; oldest packs the ready requests densely.
    assert [b["size"] for b in rec] == [3, 2, 1]
    assert rows(rec, "corrid") == [[A, B, C], [A, B], [A]]
    assert [b["inputs"]["IN_X"].reshape(-1).tolist() for b in rec] == [[1, 10, 100], [2, 20], [3]]
    assert rows(rec, "ready") == [[True] * 3, [True] * 2, [True]]  # no padding, ever
    assert rows(rec, "start") == [[True, True, True], [False, False], [False]]
    assert rows(rec, "end") == [[False, False, True], [False, True], [True]]
    assert flat(rec, "controls", "READY") == [[1, 1, 1], [1, 1], [1]]
    assert flat(rec, "controls", "START") == [[1, 1, 1], [0, 0], [0]]
    assert flat(rec, "controls", "END") == [[0, 0, 1], [0, 1], [1]]
    assert flat(rec, "controls", "CORRID") == [[A, B, C], [A, B], [A]]
    for b in rec:
        assert len(set(b["corrid"].tolist())) == b["size"]
        assert b["controls"]["READY"].shape == (b["size"], 1)


async def test_statistics_count_real_rows_only(repo, serve, monkeypatch):
    write_model(repo, "m", config(), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [await send(s, A, 1, start=True), await send(s, A, 2, end=True), await send(s, B, 3, start=True, end=True)]
    assert await results(tasks) == [1, 3, 3]
    st = s.statistics("m")[0]
    assert st.execution_count == 2 and st.inference_count == 3
    assert {b.batch_size: b.compute_infer.count for b in st.batch_stats} == {2: 1, 1: 1}


# ----------------------------------------------------------- implicit state (gather/scatter)


async def test_state_is_gathered_by_slot_not_by_batch_row(repo, serve, monkeypatch):
    # 3 slots, batches of 2: the second batch holds C (slot 2) in row 0 and A (slot 0) in row 1.
    write_model(repo, "m", config(mbs=2, oldest="max_candidate_sequences: 3"), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "7")
    s = await serve()
    tasks = [
        await send(s, A, 1, start=True),
        await send(s, B, 10, start=True),
        await send(s, C, 100, start=True),
        await send(s, A, 2),
    ]
    assert s.model("m").scheduler_state()["sequences"] == {str(A): 0, str(B): 1, str(C): 2}
    tasks += [await send(s, B, 20, end=True), await send(s, C, 200, end=True), await send(s, A, 3, end=True)]
    assert await results(tasks) == [1, 10, 100, 3, 30, 300, 6]
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[A, B], [C, A], [B, C], [A]]
    assert [b["states"]["ACC"].reshape(-1).tolist() for b in rec] == [[0, 0], [0, 1], [10, 100], [3]]
    assert [b["states"]["ACC"].shape for b in rec] == [(2, 1), (2, 1), (2, 1), (1, 1)]


async def test_restart_resets_state_of_its_own_row_only(repo, serve, monkeypatch):
    write_model(repo, "m", config(), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    tasks = [
        await send(s, A, 5, start=True),
        await send(s, B, 7, start=True),
        await send(s, A, 1),
        await send(s, B, 40, start=True),  # a second START on B: new sequence, same slot
        await send(s, A, 1, end=True),
        await send(s, B, 2, end=True),
    ]
    assert await results(tasks) == [5, 7, 6, 40, 7, 42]
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[A, B], [A, B], [A, B]]
    assert [b["states"]["ACC"].reshape(-1).tolist() for b in rec] == [[0, 0], [5, 0], [6, 40]]


async def test_model_without_state_keys_by_corrid(repo, serve, monkeypatch):
    # READY is always true and there is no padding, so CORRID identifies every row.
    model = """
    import numpy as np
    SUMS = {}

    class Model:
        def execute(self, batch):
            out = []
            for cid, start, x in zip(batch.controls["CORRID"].reshape(-1), batch.start, batch.inputs["IN_X"][:, 0]):
                SUMS[int(cid)] = (0 if start else SUMS[int(cid)]) + int(x)
                out.append([SUMS[int(cid)]])
            return {"OUT_X": np.array(out, np.int32)}
    """
    cfg = config().replace(ACC_STATE, "")
    write_model(repo, "m", cfg, model)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    tasks = []
    for step in range(3):
        for sid in (A, B):
            tasks.append(await send(s, sid, sid * (step + 1), start=step == 0, end=step == 2))
    assert await results(tasks) == [A, B, 3 * A, 3 * B, 6 * A, 6 * B]


# ----------------------------------------------------------- slots, candidates, backlog (§3.1)


async def test_candidate_sequences_default_to_max_batch_size(repo, serve):
    write_model(repo, "m", config(mbs=2), ACCUM_MODEL)
    s = await serve()
    m = s.model("m")
    oldest = m.config.sequence_batching.oldest
    assert oldest.max_candidate_sequences == 2
    assert list(oldest.preferred_batch_size) == [2]
    assert oldest.max_queue_delay_microseconds == 0 and not oldest.preserve_ordering
    assert await call(s, A, 1, start=True) == 1
    assert await call(s, B, 2, start=True) == 2
    waiting = await send(s, C, 3, start=True, end=True)
    assert m.scheduler_state()["backlog_sequences"] == 1
    assert await call(s, A, 1, end=True) == 2
    assert await results([waiting]) == [3]


async def test_more_candidate_sequences_than_max_batch_size(repo, serve, monkeypatch):
    write_model(repo, "m", config(mbs=2, oldest="max_candidate_sequences: 3"), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    monkeypatch.setenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", "1")
    s = await serve()
    m = s.model("m")
    tasks = [
        await send(s, A, 1, start=True),
        await send(s, B, 2, start=True),
        await send(s, C, 3, start=True),
        await send(s, D, 4, start=True, end=True),  # no fourth slot: backlog
    ]
    st = m.scheduler_state()
    assert st["free_slots"] == 0 and st["backlog_sequences"] == 1
    assert st["sequences"] == {str(A): 0, str(B): 1, str(C): 2}
    tasks.append(await send(s, C, 1, end=True))  # releases the hold
    assert await results(tasks) == [1, 2, 3, 4, 4]
    rec = recorded(s, "m")
    assert all(b["size"] <= 2 for b in rec)
    assert rows(rec, "corrid") == [[A, B], [C], [C], [D]]
    assert await call(s, A, 1, end=True) == 2
    assert await call(s, B, 1, end=True) == 3


async def test_end_frees_slot_but_successor_waits_for_release(repo, serve, monkeypatch):
    # One candidate, batches of 2: B takes the slot as soon as A's END is handed on, but its
    # first request must not share a batch (and the slot's state) with A's END.
    write_model(repo, "m", config(mbs=2, oldest="max_candidate_sequences: 1"), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    monkeypatch.setenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [
        await send(s, A, 5, start=True),
        await send(s, A, 6, end=True),
        await send(s, B, 100, start=True),
        await send(s, B, 1, end=True),
    ]
    assert await results(tasks) == [5, 11, 100, 101]
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[A], [A], [B], [B]]
    assert [b["states"]["ACC"].reshape(-1).tolist() for b in rec] == [[0], [5], [0], [100]]


async def test_max_batch_size_zero_one_request_per_batch(repo, serve, monkeypatch):
    write_model(repo, "m", config(mbs=0, oldest="max_candidate_sequences: 2"), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [
        await send(s, A, 1, start=True, mbs=0),
        await send(s, B, 10, start=True, mbs=0),
        await send(s, A, 2, end=True, mbs=0),
        await send(s, B, 20, end=True, mbs=0),
    ]
    assert s.model("m").scheduler_state()["backlog_sequences"] == 0  # two slots on one instance
    assert await results(tasks) == [1, 10, 3, 30]
    rec = recorded(s, "m")
    assert [b["size"] for b in rec] == [1, 1, 1, 1]
    assert [b["states"]["ACC"].shape for b in rec] == [(1,)] * 4  # no batch dim
    assert [b["controls"]["START"].shape for b in rec] == [(1,)] * 4
    assert rows(rec, "corrid") == [[A], [B], [A], [B]]


async def test_two_instances_keep_sequences_apart(repo, serve, monkeypatch):
    extra = "instance_group [ { count: 2 kind: KIND_CPU } ]"
    write_model(repo, "m", config(mbs=2, extra=extra), ACCUM_MODEL)
    s = await serve()
    m = s.model("m")
    ids = [A, B, C, D]
    for sid in ids:
        assert await call(s, sid, sid, start=True) == sid
    seqs = m.scheduler_state()["sequences"]
    assert sorted(seqs.values()) == [0, 1, 2, 3]  # 2 instances x 2 candidates, no backlog
    tasks = []
    for step in (1, 2, 3):
        for sid in ids:
            tasks.append(await send(s, sid, step, end=step == 3))
    assert await results(tasks) == [sid + step * (step + 1) // 2 for step in (1, 2, 3) for sid in ids]
    rec = recorded(s, "m")
    for b in rec:
        for cid in b["corrid"].tolist():
            assert seqs[str(cid)] // 2 == b["instance"]  # a batch never mixes instances
        assert len(set(b["corrid"].tolist())) == b["size"]
    assert {b["instance"] for b in rec} == {0, 1}


# ------------------------------------------------ preferred sizes and queue delay (§3.1, §9)


async def test_preferred_batch_size_sent_before_delay(repo, serve, monkeypatch):
    oldest = "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000"
    write_model(repo, "m", config(oldest=oldest), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [await send(s, sid, sid, start=True, end=True) for sid in (A, B, C, D)]
    assert await results(tasks, timeout=5) == [A, B, C, D]  # long before the 20 s delay
    assert [b["size"] for b in recorded(s, "m")] == [2, 2]


async def test_lone_request_waits_for_queue_delay(repo, serve):
    write_model(repo, "m", config(oldest="max_queue_delay_microseconds: 300000"), ACCUM_MODEL)
    s = await serve()
    t0 = time.monotonic()
    assert await asyncio.wait_for(call(s, A, 7, start=True, end=True), 5) == 7
    assert time.monotonic() - t0 >= 0.29
    # A second request reaching the preferred size (max_batch_size 4 here) is not needed: the
    # delay alone sends the batch.
    assert [b["size"] for b in recorded(s, "m")] == [1]


async def test_delay_zero_sends_at_once(repo, serve):
    write_model(repo, "m", config(oldest="max_queue_delay_microseconds: 0"), ACCUM_MODEL)
    s = await serve()
    t0 = time.monotonic()
    for v in range(1, 6):
        assert await call(s, A, v, start=v == 1, end=v == 5) == v * (v + 1) // 2
    assert time.monotonic() - t0 < 2


async def test_full_batch_goes_without_waiting(repo, serve, monkeypatch):
    oldest = "max_queue_delay_microseconds: 20000000"  # preferred: [4] (max_batch_size)
    write_model(repo, "m", config(oldest=oldest), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    # START without END: a START+END sequence frees its slot at once, and the next sequence
    # would take that slot and wait for the first one's release.
    tasks = [await send(s, sid, 1, start=True) for sid in (A, B, C, D)]
    assert await results(tasks, timeout=5) == [1, 1, 1, 1]
    tasks = [await send(s, sid, 2, end=True) for sid in (A, B, C, D)]
    assert await results(tasks, timeout=5) == [3, 3, 3, 3]
    assert [b["size"] for b in recorded(s, "m")] == [4, 4]


async def test_single_request_sequences_share_the_lowest_slot(repo, serve, monkeypatch):
    # A START+END request frees its slot when it is handed on; the next new sequence takes the
    # same (lowest) slot and waits until the first one has been released.
    oldest = "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000"
    write_model(repo, "m", config(oldest=oldest), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [await send(s, sid, sid, start=True, end=True) for sid in (A, B, C, D)]
    assert await results(tasks, timeout=5) == [A, B, C, D]
    assert rows(recorded(s, "m"), "corrid") == [[A, C], [B, D]]


async def test_preserve_ordering_loads_and_serves(repo, serve, monkeypatch):
    write_model(repo, "m", config(oldest="preserve_ordering: true"), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    assert s.model("m").config.sequence_batching.oldest.preserve_ordering
    tasks = [
        await send(s, A, 1, start=True),
        await send(s, B, 2, start=True),
        await send(s, A, 3, end=True),
        await send(s, B, 4, end=True),
    ]
    assert await results(tasks) == [1, 2, 4, 6]


# ---------------------------------------------------------------- idle expiry (§3.2, §4.4)


async def test_idle_expiry_hands_slot_to_backlog_without_end(repo, serve):
    seq = "max_sequence_idle_microseconds: 150000"
    write_model(repo, "m", config(mbs=2, oldest="max_candidate_sequences: 1", seq=seq), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 7, start=True) == 7
    waiting = await send(s, B, 3, start=True)
    assert await results([waiting], timeout=5) == [3]  # fresh state on the same slot
    await expect_error(call(s, A, 1), Code.INVALID_ARG, start_error(A))
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[A], [B]]
    assert not any(b["end"].any() for b in rec)


async def test_requests_ahead_of_expiry_still_run(repo, serve):
    # §4.2: A is reaped while its first request runs (slow model) and its second waits in the
    # slot; the queued request still runs, later ones need START.
    model = """
    import time
    import numpy as np

    class Model:
        def execute(self, batch):
            time.sleep(0.25)
            new = batch.states["ACC"] + batch.inputs["IN_X"]
            return {"OUT_X": new, "ACC_OUT": new}
    """
    write_model(repo, "m", config(seq="max_sequence_idle_microseconds: 150000"), model)
    s = await serve()
    tasks = [await send(s, A, 1, start=True), await send(s, A, 2)]
    assert await results(tasks) == [1, 3]
    await expect_error(call(s, A, 3, end=True), Code.INVALID_ARG, start_error(A))
    assert await call(s, A, 4, start=True, end=True) == 4


async def test_queue_delay_counts_from_hand_off(repo, serve):
    # §3.2: a request reaches the batcher only when its predecessor has been released, and
    # its delay starts then, not at its arrival.
    write_model(repo, "m", config(oldest="max_queue_delay_microseconds: 300000"), ACCUM_MODEL)
    s = await serve()
    t0 = time.monotonic()
    tasks = [await send(s, A, 1, start=True), await send(s, A, 2, end=True)]
    first = await asyncio.wait_for(tasks[0], 5)
    t1 = time.monotonic() - t0
    assert await results(tasks, timeout=5) == [1, 3] and first is not None
    t2 = time.monotonic() - t0
    assert t1 >= 0.29 and t2 >= 0.58, (t1, t2)


async def test_input_shapes_must_match_within_a_batch(repo, serve, monkeypatch):
    write_model(repo, "m", config(dims="[ -1 ]").replace(ACC_STATE, ""), RECORDING_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()

    def inp(n):
        return {"IN_X": np.ones((1, n), np.int32)}

    shapes = ((A, 2), (B, 3), (C, 2), (D, 2))
    for end in (False, True):  # START only first, so that every sequence holds its own slot
        tasks = []
        for sid, n in shapes:
            tasks.append(
                asyncio.ensure_future(s.infer("m", inp(n), sequence_id=sid, sequence_start=not end, sequence_end=end))
            )
            await asyncio.sleep(0)
        out = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert [r.outputs["OUT_X"].shape for r in out] == [(1, 2), (1, 3), (1, 2), (1, 2)]
    rec = recorded(s, "m")
    # batch forming stops at the first request whose shape differs
    assert [b["inputs"]["IN_X"].shape for b in rec][:3] == [(1, 2), (1, 3), (2, 2)]
    assert rows(rec, "corrid")[:3] == [[A], [B], [C, D]]


async def test_variable_state_shapes_batch_separately(repo, serve, monkeypatch):
    model = """
    import numpy as np
    RECORD = []

    class Model:
        def execute(self, batch):
            st = batch.states["HIST"]
            RECORD.append((batch.corrid.tolist(), st.shape))
            new = np.concatenate([st, batch.inputs["IN_X"]], axis=1)
            return {"OUT_X": new.sum(axis=1, keepdims=True).astype(np.int32), "HIST_OUT": new}
    """
    state = """
      state [ { input_name: "HIST" output_name: "HIST_OUT" data_type: TYPE_INT32 dims: [ -1 ]
                initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" } } ]
    """
    write_model(repo, "m", config().replace(ACC_STATE, state), model)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [await send(s, A, 1, start=True), await send(s, B, 10, start=True)]
    assert await results(tasks) == [1, 10]  # one batch: both states are 1 long
    assert await call(s, A, 2) == 3  # A's state is now one longer than B's
    tasks = [await send(s, A, 3), await send(s, B, 20)]
    assert await results(tasks) == [6, 30]
    seen = sys.modules["seqserve_models.m.v1"].RECORD
    assert seen[:2] == [([A, B], (2, 1)), ([A], (1, 2))]
    assert sorted(seen[2:]) == [([A], (1, 3)), ([B], (1, 2))]  # 3 and 2 long: never one batch
    # B has caught up: both states are 3 long again.
    tasks = [await send(s, A, 4, end=True), await send(s, B, 30, end=True)]
    assert await results(tasks) == [10, 60]


# --------------------------------------------------- request timeout in the backlog (§4.5)

EXPIRED = "timeout of the corresponding sequence has been expired"


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_backlogged_sequence_expires_as_a_whole(repo, serve, strategy):
    write_model(repo, "m", config(mbs=1, strategy=strategy), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    t0 = time.monotonic()
    first = await send(s, B, 2, start=True)  # no timeout of its own
    second = await send(s, B, 3, timeout_us=100_000)  # sets the backlog queue's expiry
    third = await send(s, B, 4)
    assert s.model("m").scheduler_state()["backlog_sequences"] == 1
    done = await asyncio.wait_for(asyncio.gather(first, second, third, return_exceptions=True), 3)
    assert time.monotonic() - t0 >= 0.09
    for e in done:
        assert isinstance(e, InferenceError), e
        assert e.code == Code.UNAVAILABLE
        assert str(e) == EXPIRED
    assert s.model("m").scheduler_state()["backlog_sequences"] == 0
    await expect_error(call(s, B, 5), Code.INVALID_ARG, start_error(B))
    await expect_error(call(s, B, 5, end=True), Code.INVALID_ARG, start_error(B))
    assert await call(s, A, 5, end=True) == 6  # the slot holder is unaffected
    assert rows(recorded(s, "m"), "corrid") == [[A], [A]]
    # The id can start again.
    assert await call(s, B, 9, start=True, end=True) == 9


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_backlog_timeout_counts_as_failed_requests(repo, serve, strategy):
    # §11: asynchronous failures are request failures (Triton: UpdateFailure, reason REJECTED).
    write_model(repo, "m", config(mbs=1, strategy=strategy), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    doomed = [await send(s, B, 2, start=True, timeout_us=50_000), await send(s, B, 3)]
    done = await asyncio.wait_for(asyncio.gather(*doomed, return_exceptions=True), 3)
    assert all(isinstance(e, InferenceError) and str(e) == EXPIRED for e in done), done
    assert await call(s, A, 1, end=True) == 2
    st = s.statistics("m")[0]
    assert st.inference_stats.success.count == 2
    assert st.inference_stats.fail.count == 2


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_backlog_timeout_only_for_the_expiring_sequence(repo, serve, strategy):
    write_model(repo, "m", config(mbs=1, strategy=strategy), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    doomed = await send(s, B, 2, start=True, timeout_us=100_000)
    patient = [await send(s, C, 3, start=True), await send(s, C, 4, end=True)]  # no timeout: waits
    with pytest.raises(InferenceError) as ei:
        await asyncio.wait_for(doomed, 3)
    assert ei.value.code == Code.UNAVAILABLE and str(ei.value) == EXPIRED
    await asyncio.sleep(0.2)
    assert not any(t.done() for t in patient)
    assert await call(s, A, 1, end=True) == 2
    assert await results(patient) == [3, 7]


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_request_timeout_ignored_once_sequence_holds_a_slot(repo, serve, strategy, monkeypatch):
    write_model(repo, "m", config(mbs=1, strategy=strategy), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [
        await send(s, A, 1, start=True, timeout_us=1000),
        await send(s, A, 2, timeout_us=1000),
    ]
    await asyncio.sleep(0.1)  # way past the timeouts, still held
    tasks.append(await send(s, A, 3, end=True, timeout_us=1000))
    assert await results(tasks) == [1, 3, 6]


async def test_backlog_timeout_after_handoff_does_not_fire(repo, serve):
    # The sequence gets a slot before its timeout: it is no longer in the backlog.
    write_model(repo, "m", config(mbs=1), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    waiting = [await send(s, B, 2, start=True, timeout_us=300_000), await send(s, B, 3)]
    assert await call(s, A, 1, end=True) == 2
    assert await results(waiting) == [2, 5]
    await asyncio.sleep(0.4)
    assert await call(s, B, 4, end=True) == 9


# ------------------------------------------------------------------ property-based (§3.2)

GATED_MODEL = """
import threading
import numpy as np
RECORD = []
GATE = threading.Event()
LOCK = threading.Lock()

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        GATE.wait(30)  # the first batch waits until the test has queued everything
        acc = batch.states["ACC"]
        x = batch.inputs["IN_X"]
        with LOCK:
            RECORD.append({
                "instance": self.instance,
                "corrid": [int(c) for c in batch.controls["CORRID"].reshape(-1)],
                "start": batch.start.tolist(), "end": batch.end.tolist(), "ready": batch.ready.tolist(),
                "x": x.reshape(-1).tolist(), "acc": acc.reshape(-1).tolist(),
            })
        new = (acc + x).astype(acc.dtype)
        return {"OUT_X": new, "ACC_OUT": new}
"""


@st.composite
def interleavings(draw):
    """(mbs, candidates, instances, preferred, requests): many sequences' steps interleaved at
    random. A request is (id, start, end, value); a sequence may restart (a second START)."""
    mbs = draw(st.integers(1, 4))
    candidates = draw(st.integers(1, 6))
    instances = draw(st.integers(1, 2))
    preferred = draw(st.lists(st.integers(1, mbs), max_size=2, unique=True))
    nseq = draw(st.integers(1, 10))
    queues = []
    for k in range(nseq):
        n = draw(st.integers(1, 5))
        steps = []
        for i in range(n):
            restart = i > 0 and draw(st.integers(0, 9)) == 0
            steps.append((1000 + k, i == 0 or restart, i == n - 1, draw(st.integers(-50, 50))))
        queues.append(steps)
    order = draw(st.permutations([k for k, q in enumerate(queues) for _ in q]))
    cursor = [0] * nseq
    requests = []
    for k in order:
        requests.append(queues[k][cursor[k]])
        cursor[k] += 1
    return mbs, candidates, instances, preferred, requests


def oracle(requests):
    """Running sums per sequence, reset at START: the only correct answer whatever the batching."""
    sums: dict[int, int] = {}
    out = []
    for sid, start, _end, value in requests:
        sums[sid] = (0 if start else sums[sid]) + value
        out.append(sums[sid])
    return out


async def run_interleaving(mbs, candidates, instances, preferred, requests) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        pref = f"preferred_batch_size: {preferred}" if preferred else ""
        oldest = f"max_candidate_sequences: {candidates} {pref}"
        extra = f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]"
        write_model(repo, "m", config(mbs=mbs, oldest=oldest, extra=extra), GATED_MODEL)
        server = Server(repo)
        await server.start()
        mod = sys.modules["seqserve_models.m.v1"]
        try:
            blocker = asyncio.ensure_future(
                server.infer("m", x_in(0), sequence_id=1, sequence_start=True, sequence_end=True)
            )
            await asyncio.sleep(0)
            tasks = [
                asyncio.ensure_future(
                    server.infer("m", x_in(v), sequence_id=sid, sequence_start=start, sequence_end=end)
                )
                for sid, start, end, v in requests
            ]
            await asyncio.sleep(0)  # every request is queued, in order
            mod.GATE.set()
            got = await asyncio.wait_for(asyncio.gather(*tasks), 20)
            await blocker
        finally:
            mod.GATE.set()
            await server.shutdown(timeout_s=0)
        assert [int(r.outputs["OUT_X"].reshape(-1)[0]) for r in got] == oracle(requests)

        rec = [b for b in mod.RECORD if b["corrid"] != [1]]
        seen: dict[int, list[int]] = {}
        where: dict[int, int] = {}
        for b in rec:
            size = len(b["corrid"])
            assert 1 <= size <= mbs
            assert b["ready"] == [True] * size  # no padding
            assert len(set(b["corrid"])) == size, b  # never two requests of one sequence
            for cid, x, start in zip(b["corrid"], b["x"], b["start"], strict=True):
                seen.setdefault(cid, []).append((x, start))
                if start:
                    where.pop(cid, None)
                # a running sequence stays on its instance
                assert where.setdefault(cid, b["instance"]) == b["instance"]
        for sid in {r[0] for r in requests}:
            # every request ran exactly once, in the order it was sent
            assert seen[sid] == [(v, start) for i, start, _e, v in requests if i == sid]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=interleavings())
def test_random_interleavings_match_running_sum_oracle(scenario):
    asyncio.run(run_interleaving(*scenario))
