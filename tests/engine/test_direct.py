"""Direct sequence batching through the in-process API (reference sections 1-6, 8, 11, 12).

Batches are made deterministic with TRITONSERVER_DELAY_SCHEDULER (hold batch formation until
N requests sit in slot queues) and TRITONSERVER_BACKLOG_DELAY_SCHEDULER (and M in the backlog):
every request of a scenario is queued first, then the batches form one after another.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, ModelStatistics
from tests.support.checks import expect_error, holds_sequence, start_error, wait_reaped, wait_until
from tests.support.models import ACC_STATE, ACCUM_MODEL, ctl, in_x_config, model_module, recorded, rows, write_model

# ----------------------------------------------------------------------------- helpers


def flag_controls(spec: str) -> str:
    return ", ".join(ctl(n, n, spec) for n in ("START", "END", "READY"))


INT_CONTROLS = flag_controls("int32_false_true: [ 0, 1 ]")


def config(
    name: str = "m",
    *,
    mbs: int = 4,
    controls: str = INT_CONTROLS,
    seq: str = "",
    extra: str = "",
    dims: str = "[ 1 ]",
    out_dims: str | None = None,
) -> str:
    scheduling = f"""
sequence_batching {{
  control_input [ {controls} ]
  {seq}
}}"""
    return in_x_config(extra + scheduling, name=name, mbs=mbs, dims=dims, out_dims=out_dims)


def x_in(value: int | list[int], mbs: int = 4) -> dict[str, np.ndarray]:
    row = value if isinstance(value, list) else [value]
    return {"IN_X": np.array([row] if mbs > 0 else row, np.int32)}


async def send(s, seq_id, value=0, *, model="m", start=False, end=False, mbs=4) -> asyncio.Future:
    """Submit without waiting for the result; returns once the request has been queued."""
    task = asyncio.ensure_future(
        s.infer(model, x_in(value, mbs), sequence_id=seq_id, sequence_start=start, sequence_end=end)
    )
    await asyncio.sleep(0)  # the task runs up to its submit
    return task


async def call(s, seq_id, value=0, *, model="m", start=False, end=False, mbs=4) -> list:
    r = await s.infer(model, x_in(value, mbs), sequence_id=seq_id, sequence_start=start, sequence_end=end)
    return r.outputs["OUT_X"].tolist()


async def results(tasks, timeout=10.0) -> list:
    out = await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    return [r.outputs["OUT_X"].reshape(-1).tolist() for r in out]


async def settled_stats(s, model: str = "m", *, requests: int) -> ModelStatistics:
    """Statistics once `requests` requests are accounted for (success + fail)."""

    def settled() -> bool:
        st = s.statistics(model)[0].inference_stats
        return st.success.count + st.fail.count >= requests

    await wait_until(settled, f"{requests} requests are in the statistics")
    return s.statistics(model)[0]


# ---------------------------------------------------------------- control tensors (§5)

# One batch of [A START, B START, C START+END, D START], then [A -, B END, padding, D -].
SCENARIO_FLAGS = {
    "start": [[1, 1, 1, 1], [0, 0, 0, 0]],
    "end": [[0, 0, 1, 0], [0, 1, 0, 0]],
    "ready": [[1, 1, 1, 1], [1, 1, 0, 1]],
}


async def run_flag_scenario(s, ids) -> list[dict]:
    a, b, c, d = ids
    tasks = [
        await send(s, a, 1, start=True),
        await send(s, b, 2, start=True),
        await send(s, c, 3, start=True, end=True),
        await send(s, d, 4, start=True),
        await send(s, a, 5),
        await send(s, b, 6, end=True),
        await send(s, d, 7),
    ]
    assert await results(tasks) == [[1], [2], [3], [4], [5], [6], [7]]
    rec = recorded(s, "m")
    assert [b["size"] for b in rec] == [4, 4]
    assert rows(rec, "start") == [[bool(v) for v in r] for r in SCENARIO_FLAGS["start"]]
    assert rows(rec, "end") == [[bool(v) for v in r] for r in SCENARIO_FLAGS["end"]]
    assert rows(rec, "ready") == [[bool(v) for v in r] for r in SCENARIO_FLAGS["ready"]]
    return rec


@pytest.mark.parametrize(
    ("spec", "dtype", "false", "true"),
    [
        ("int32_false_true: [ 0, 1 ]", np.int32, 0, 1),
        ("int32_false_true: [ 9, -3 ]", np.int32, 9, -3),
        ("fp32_false_true: [ 0.0, 1.0 ]", np.float32, 0.0, 1.0),
        ("fp32_false_true: [ 5.0, 7.0 ]", np.float32, 5.0, 7.0),
        ("fp32_false_true: [ -0.5, 2.25 ]", np.float32, -0.5, 2.25),
        ("bool_false_true: [ false, true ]", np.bool_, False, True),
        ("bool_false_true: [ true, false ]", np.bool_, True, False),
    ],
    ids=["int32", "int32_unusual", "fp32", "fp32_5_7", "fp32_fraction", "bool", "bool_inverted"],
)
async def test_control_values_per_request_kind(repo, serve, monkeypatch, spec, dtype, false, true):
    write_model(repo, "m", config(controls=flag_controls(spec)))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "7")
    s = await serve()
    rec = await run_flag_scenario(s, [11, 12, 13, 14])
    for name in ("START", "END", "READY"):
        for batch, flags in zip(rec, SCENARIO_FLAGS[name.lower()], strict=True):
            got = batch["controls"][name]
            assert got.dtype == dtype
            assert got.shape == (4, 1)
            assert got.reshape(-1).tolist() == [true if f else false for f in flags], name


BIG = 2**63 + 5  # >= 2^63: negative as INT64
WIDE = 2**32 + 7  # low 32 bits: 7
ALL_ONES_32 = 0xFFFFFFFF  # INT32: -1


@pytest.mark.parametrize(
    ("dtype", "np_dtype", "expected"),
    [
        ("TYPE_UINT64", np.uint64, [BIG, WIDE, ALL_ONES_32, 3]),
        ("TYPE_INT64", np.int64, [BIG - 2**64, WIDE, ALL_ONES_32, 3]),
        ("TYPE_UINT32", np.uint32, [5, 7, ALL_ONES_32, 3]),
        ("TYPE_INT32", np.int32, [5, 7, -1, 3]),
    ],
)
async def test_corrid_numeric_encoding(repo, serve, monkeypatch, dtype, np_dtype, expected):
    controls = INT_CONTROLS + ", " + ctl("CORRID", "CORRID", f"data_type: {dtype}")
    write_model(repo, "m", config(controls=controls))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "7")
    s = await serve()
    ids = [BIG, WIDE, ALL_ONES_32, 3]
    rec = await run_flag_scenario(s, ids)
    b1, b2 = (b["controls"]["CORRID"] for b in rec)
    assert b1.dtype == np_dtype and b1.shape == (4, 1)
    assert b1.reshape(-1).tolist() == expected
    assert b2.reshape(-1).tolist() == [expected[0], expected[1], 0, expected[3]]  # padding: 0
    # ExecuteBatch.corrid carries the full uint64 id whatever the CORRID type.
    assert rec[0]["corrid"].dtype == np.uint64
    assert rows(rec, "corrid") == [ids, [BIG, WIDE, 0, 3]]


async def test_corrid_string_encoding(repo, serve, monkeypatch):
    controls = INT_CONTROLS + ", " + ctl("CORRID", "CORRID", "data_type: TYPE_STRING")
    write_model(repo, "m", config(controls=controls))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "7")
    s = await serve()
    ids = ["alpha", "7", "x" * 128, "seq-\u00e9"]
    rec = await run_flag_scenario(s, ids)
    b1, b2 = (b["controls"]["CORRID"] for b in rec)
    assert b1.shape == (4, 1)
    assert b1.reshape(-1).tolist() == [i.encode() for i in ids]
    assert b2.reshape(-1).tolist() == [ids[0].encode(), ids[1].encode(), b"", ids[3].encode()]  # padding: ""
    # ExecuteBatch.corrid: the str ids on real rows, 0 on padding rows.
    assert rows(rec, "corrid") == [ids, [ids[0], ids[1], 0, ids[3]]]


async def test_controls_shape_without_batching(repo, serve):
    controls = INT_CONTROLS + ", " + ctl("CORRID", "CORRID", "data_type: TYPE_UINT64")
    write_model(repo, "m", config(mbs=0, controls=controls))
    s = await serve()
    assert await call(s, 9, 1, start=True, mbs=0) == [1]
    assert await call(s, 9, 2, mbs=0) == [2]
    assert await call(s, 9, 3, end=True, mbs=0) == [3]
    assert await call(s, 10, 4, start=True, end=True, mbs=0) == [4]
    rec = recorded(s, "m")
    assert [b["size"] for b in rec] == [1, 1, 1, 1]
    for b in rec:
        assert b["inputs"]["IN_X"].shape == (1,)
        for name in ("START", "END", "READY", "CORRID"):
            assert b["controls"][name].shape == (1,), name
    assert [b["controls"]["START"].tolist() for b in rec] == [[1], [0], [0], [1]]
    assert [b["controls"]["END"].tolist() for b in rec] == [[0], [0], [1], [1]]
    assert [b["controls"]["READY"].tolist() for b in rec] == [[1], [1], [1], [1]]
    assert [b["controls"]["CORRID"].tolist() for b in rec] == [[9], [9], [9], [10]]


# ------------------------------------------------------------------ padding rows (§2.4)


async def test_padding_rows_fill_holes_below_highest_ready_slot(repo, serve, monkeypatch):
    write_model(repo, "m", config(seq=ACC_STATE), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [await send(s, sid, v, start=True) for sid, v in ((1, 10), (2, 20), (3, 30))]
    assert await results(tasks) == [[10], [20], [30]]
    assert await call(s, 3, 1) == [[31]]  # batch [pad, pad, 3]
    assert await call(s, 1, 1) == [[11]]  # batch [1]: size = highest ready slot + 1
    assert await call(s, 2, 2, end=True) == [[22]]  # batch [pad, 2]
    rec = recorded(s, "m")
    assert [b["size"] for b in rec] == [3, 3, 1, 2]
    assert rows(rec, "ready")[1:] == [[False, False, True], [True], [False, True]]
    assert rows(rec, "corrid")[1:] == [[0, 0, 3], [1], [0, 2]]
    assert [b["controls"]["READY"].reshape(-1).tolist() for b in rec[1:]] == [[0, 0, 1], [1], [0, 1]]
    # The model wrote -1000 into every padding row's state: no real sequence saw it.
    assert await call(s, 1, 1, end=True) == [[12]]
    assert await call(s, 3, 1, end=True) == [[32]]


async def test_padding_counts_in_batch_stats_not_in_inference_count(repo, serve, monkeypatch):
    # Triton QA test_queue_delay_half_min_util: batches [1, 2] and [null, 2].
    seq = "direct { max_queue_delay_microseconds: 5000000 minimum_slot_utilization: 0.5 }"
    write_model(repo, "m", config(mbs=2, seq=seq))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [
        await send(s, 1, 1, start=True, end=True),
        await send(s, 2, 2, start=True),
        await send(s, 2, 3, end=True),
    ]
    assert await results(tasks) == [[1], [2], [3]]
    assert rows(recorded(s, "m"), "ready") == [[True, True], [False, True]]
    st = await settled_stats(s, requests=3)
    assert st.execution_count == 2
    assert st.inference_count == 3
    assert {b.batch_size: b.compute_infer.count for b in st.batch_stats} == {2: 2}


# ----------------------------------------------------------- slots and backlog (§2.1, §2.2)


async def test_lowest_free_slot_first(repo, serve):
    write_model(repo, "m", config())
    s = await serve()
    m = s.model("m")
    for sid in (1, 2, 3):
        await call(s, sid, sid, start=True)
    assert m.scheduler_state()["sequences"] == {"1": 0, "2": 1, "3": 2}
    await call(s, 2, 0, end=True)  # frees slot 1
    await call(s, 4, 4, start=True)  # takes slot 1, not slot 3
    assert m.scheduler_state()["sequences"] == {"1": 0, "3": 2, "4": 1}
    await call(s, 1, 0, end=True)  # frees slot 0
    await call(s, 5, 5, start=True)
    await call(s, 6, 6, start=True)
    assert m.scheduler_state()["sequences"] == {"3": 2, "4": 1, "5": 0, "6": 3}
    rec = recorded(s, "m")
    # Batch position == slot index: sequence 4's first request ran in row 1 behind a padding row.
    assert rec[4]["corrid"].tolist() == [0, 4]
    assert rec[4]["ready"].tolist() == [False, True]
    assert rec[-1]["corrid"].tolist() == [0, 0, 0, 6]


async def test_backlog_moves_whole_sequences_fifo(repo, serve, monkeypatch):
    write_model(repo, "m", config(mbs=2))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    monkeypatch.setenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", "5")
    s = await serve()
    m = s.model("m")
    A, B, C, D = 101, 102, 103, 104
    tasks = [
        await send(s, A, 1, start=True),  # slot 0
        await send(s, B, 2, start=True),  # slot 1
        await send(s, C, 3, start=True),  # backlog (first)
        await send(s, C, 4),
        await send(s, D, 5, start=True),  # backlog (second)
        await send(s, C, 6, end=True),
        await send(s, D, 7, end=True),
    ]
    st = m.scheduler_state()
    assert st["backlog_sequences"] == 2 and st["free_slots"] == 0
    assert st["sequences"] == {str(A): 0, str(B): 1}  # the ENDs of C and D dropped their mappings
    assert not any(t.done() for t in tasks)
    tasks.append(await send(s, B, 8, end=True))  # releases the hold
    assert await results(tasks) == [[v] for v in (1, 2, 3, 4, 5, 6, 7, 8)]
    assert await call(s, A, 9, end=True) == [[9]]
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[A, B], [0, B], [0, C], [0, C], [0, C], [0, D], [0, D], [A]]
    assert rows(rec, "start") == [
        [True, True],
        [False, False],
        [False, True],
        [False, False],
        [False, False],
        [False, True],
        [False, False],
        [False],
    ]
    assert rows(rec, "end") == [
        [False, False],
        [False, True],
        [False, False],
        [False, False],
        [False, True],
        [False, False],
        [False, True],
        [True],
    ]
    assert [b["inputs"]["IN_X"][-1, 0] for b in rec] == [2, 8, 3, 4, 6, 5, 7, 9]


async def test_backlog_sequence_continues_after_handoff(repo, serve):
    write_model(repo, "m", config(mbs=1, seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    assert await call(s, 1, 5, start=True) == [[5]]
    waiting = await send(s, 2, 100, start=True)  # no slot: backlog
    assert s.model("m").scheduler_state()["backlog_sequences"] == 1
    assert await call(s, 1, 1, end=True) == [[6]]
    assert await results([waiting]) == [[100]]
    assert s.model("m").scheduler_state()["sequences"] == {"2": 0}
    assert await call(s, 2, 1) == [[101]]  # later requests go straight to the slot
    assert await call(s, 2, 1, end=True) == [[102]]


async def test_second_start_while_in_backlog(repo, serve):
    write_model(repo, "m", config(mbs=1, seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    assert await call(s, 1, 0, start=True) == [[0]]
    tasks = [
        await send(s, 2, 1, start=True),
        await send(s, 2, 2),
        await send(s, 2, 10, start=True),  # same backlog queue, behind the first START
        await send(s, 2, 5, end=True),
    ]
    assert s.model("m").scheduler_state()["backlog_sequences"] == 1
    await call(s, 1, 0, end=True)
    assert await results(tasks) == [[1], [3], [10], [15]]
    rec = recorded(s, "m")[2:]
    assert rows(rec, "corrid") == [[2]] * 4
    assert rows(rec, "start") == [[True], [False], [True], [False]]


async def test_backlog_request_timeout_expires_whole_sequence(repo, serve):
    write_model(repo, "m", config(mbs=1))
    s = await serve()
    await call(s, 1, 1, start=True)
    t0 = time.monotonic()
    first = asyncio.ensure_future(s.infer("m", x_in(2), sequence_id=2, sequence_start=True, timeout_us=100_000))
    await asyncio.sleep(0)
    second = await send(s, 2, 3)  # no timeout of its own: expires with its sequence
    done = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 3)
    assert time.monotonic() - t0 >= 0.09
    for e in done:
        assert isinstance(e, InferenceError), e
        assert e.code == Code.UNAVAILABLE
        assert str(e) == "timeout of the corresponding sequence has been expired"
    await expect_error(call(s, 2, 4), Code.INVALID_ARG, start_error(2))
    assert await call(s, 1, 5, end=True) == [[5]]  # the slot holder is unaffected
    assert rows(recorded(s, "m"), "corrid") == [[1], [1]]


async def test_ragged_inputs_run_in_separate_batches(repo, serve, monkeypatch):
    write_model(repo, "m", config(dims="[ -1 ]"))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [
        await send(s, 1, [1, 2], start=True, end=True),
        await send(s, 2, [3, 4, 5], start=True, end=True),
        await send(s, 3, [6, 7], start=True, end=True),
    ]
    assert await results(tasks) == [[1, 2], [3, 4, 5], [6, 7]]
    rec = recorded(s, "m")
    # The mismatching slot gets a padding row and runs in a later batch.
    assert rows(rec, "ready") == [[True, False, True], [False, True]]
    assert [b["inputs"]["IN_X"].shape for b in rec] == [(3, 2), (2, 3)]
    assert rows(rec, "corrid") == [[1, 0, 3], [0, 2]]


# ------------------------------------------------------------------- idle reaper (§4)

IDLE = "max_sequence_idle_microseconds: 150000"


async def test_idle_sequence_needs_start_again(repo, serve):
    write_model(repo, "m", config(seq=IDLE))
    s = await serve()
    await call(s, 42, 1, start=True)
    t0 = time.monotonic()
    await call(s, 42, 2)
    await wait_reaped(s, 42)
    assert time.monotonic() - t0 >= 0.14  # not before its idle limit
    await expect_error(call(s, 42, 3), Code.INVALID_ARG, start_error(42))
    assert await call(s, 42, 4, start=True, end=True) == [[4]]  # START begins a new sequence


async def test_idle_reaped_slot_goes_to_backlog_without_end(repo, serve):
    write_model(repo, "m", config(mbs=1, seq=ACC_STATE + IDLE), ACCUM_MODEL)
    s = await serve()
    t0 = time.monotonic()
    assert await call(s, 1, 7, start=True) == [[7]]
    waiting = await send(s, 2, 3, start=True)  # backlog until 1 is reaped
    assert await results([waiting], timeout=5) == [[3]]  # fresh state: 0 + 3
    assert time.monotonic() - t0 >= 0.14
    await expect_error(call(s, 1, 1), Code.INVALID_ARG, start_error(1))
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[1], [2]]
    assert rows(rec, "start") == [[True], [True]]
    assert not any(b["end"].any() for b in rec)  # the reaped sequence was never sent END


async def test_string_id_reaped_message(repo, serve):
    write_model(repo, "m", config(seq=IDLE))
    s = await serve()
    await call(s, "user-7", 1, start=True)
    await wait_reaped(s, "user-7")
    await expect_error(call(s, "user-7", 1), Code.INVALID_ARG, start_error("user-7"))


async def test_backlogged_sequence_not_reaped_for_its_wait(repo, serve):
    # Different on purpose from Triton (§4.4, where a sequence that waited in the backlog past
    # its idle limit is reaped ~50 ms after it gets a slot): the idle clock starts when the
    # START has been answered, so the wait in the backlog does not count. Sequence 1 is kept
    # alive by arrivals far closer together than the 1 s idle limit, so a loaded machine cannot
    # make it expire; 2 waits in the backlog beyond its own limit.
    idle_s = 1.0
    write_model(repo, "m", config(mbs=1, seq=f"max_sequence_idle_microseconds: {int(idle_s * 1e6)}"))
    s = await serve()
    await call(s, 1, 1, start=True)
    sent = time.monotonic()
    waiting = await send(s, 2, 2, start=True)
    while time.monotonic() - sent < 1.2 * idle_s:
        await asyncio.sleep(0.05)
        await call(s, 1, 1)  # keeps 1 alive
    assert holds_sequence(s, 2) and not waiting.done()  # not reaped while in the backlog
    await call(s, 1, 1, end=True)
    assert await results([waiting]) == [[2]]  # requests moved with it still run
    await asyncio.sleep(0.25 * idle_s)  # the client's pause: far more than Triton's 50 ms
    assert await call(s, 2, 3) == [[3]]
    last = time.monotonic()
    await wait_reaped(s, 2)  # an idle period after its last request, as usual
    assert time.monotonic() - last > 0.75 * idle_s
    await expect_error(call(s, 2, 4), Code.INVALID_ARG, start_error(2))


GATED_MODEL = """
import threading
GATE = threading.Event()
GATE.set()

class Model:
    def execute(self, batch):
        GATE.wait(20)
        return {"OUT_X": batch.inputs["IN_X"].copy()}
"""


async def test_idle_clock_counts_from_last_arrival_not_execution(repo, serve):
    # §4.2: once its START has been answered, a sequence whose requests wait behind a slow
    # model is reaped anyway; the queued requests still run (they are ahead of the force-end
    # marker), later ones need START. The model holds the second batch until the test has seen
    # the sequence reaped.
    write_model(repo, "m", config(seq="max_sequence_idle_microseconds: 150000"), GATED_MODEL)
    s = await serve()
    assert await call(s, 1, 1, start=True) == [[1]]
    gate = model_module("m").GATE
    gate.clear()
    try:
        tasks = [await send(s, 1, 2), await send(s, 1, 3)]
        await wait_reaped(s, 1)  # while its second request is still executing
        assert not any(t.done() for t in tasks)
    finally:
        gate.set()
    assert await results(tasks) == [[2], [3]]
    await expect_error(call(s, 1, 4, end=True), Code.INVALID_ARG, start_error(1))


async def test_idle_clock_waits_for_the_start_to_be_answered(repo, serve):
    # Different on purpose from Triton: a START that runs longer than the idle limit does not
    # get its sequence reaped; the clock starts when it has been answered.
    write_model(repo, "m", config(seq="max_sequence_idle_microseconds: 150000"), GATED_MODEL)
    s = await serve()
    gate = model_module("m").GATE
    gate.clear()
    try:
        task = await send(s, 1, 1, start=True)
        await asyncio.sleep(0.45)  # three idle periods while the START runs
        assert holds_sequence(s, 1) and not task.done()
    finally:
        gate.set()
    assert await results([task]) == [[1]]
    assert await call(s, 1, 2) == [[2]]  # at once after the answer: still live
    await wait_reaped(s, 1)


# ------------------------------------------------------------- START / END (§1.4, §1.5)


async def test_second_start_resets_state_in_same_slot(repo, serve):
    # Triton QA test_no_sequence_end: start(1), 2, start(42), end(9) -> 51.
    write_model(repo, "m", config(seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    await call(s, 8, 0, start=True)  # another sequence holds slot 0
    assert await call(s, 5, 1, start=True) == [[1]]
    assert await call(s, 5, 2) == [[3]]
    assert await call(s, 5, 42, start=True) == [[42]]
    assert await call(s, 5, 9, end=True) == [[51]]
    rec = recorded(s, "m")[1:]
    assert rows(rec, "corrid") == [[0, 5]] * 4  # always slot 1
    assert rows(rec, "start") == [[False, True], [False, False], [False, True], [False, False]]
    assert rows(rec, "end") == [[False, False]] * 3 + [[False, True]]
    assert [b["states"]["ACC"][1, 0] for b in rec] == [0, 1, 0, 42]


async def test_end_drops_id_at_enqueue(repo, serve, monkeypatch):
    write_model(repo, "m", config(mbs=2))
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    first = await send(s, 7, 1, start=True)
    end = await send(s, 7, 2, end=True)
    # The END has not run (the scheduler is held), yet the id is already gone.
    await expect_error(call(s, 7, 3), Code.INVALID_ARG, start_error(7))
    assert not end.done()
    again = await send(s, 7, 4, start=True)  # a new sequence, in the next free slot
    assert await results([first, end, again]) == [[1], [2], [4]]
    assert await call(s, 7, 5, end=True) == [[5]]
    rec = recorded(s, "m")
    assert rows(rec, "corrid") == [[7, 7], [7], [0, 7]]
    assert rows(rec, "start") == [[True, True], [False], [False, False]]
    assert rows(rec, "end") == [[False, False], [True], [False, True]]


async def test_length_one_sequence_frees_slot(repo, serve):
    write_model(repo, "m", config(mbs=1))
    s = await serve()
    for sid in (1, 2, 3):
        assert await call(s, sid, sid, start=True, end=True) == [[sid]]
    assert s.model("m").scheduler_state()["free_slots"] == 1
    await expect_error(call(s, 1, 0), Code.INVALID_ARG, start_error(1))


# ------------------------------------------------------------ ids and validation (§1)


async def test_numeric_and_string_ids_are_different_sequences(repo, serve):
    write_model(repo, "m", config(seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    assert await call(s, 5, 1, start=True) == [[1]]
    assert await call(s, "5", 100, start=True) == [[100]]
    assert await call(s, 5, 2) == [[3]]
    assert await call(s, "5", 3, end=True) == [[103]]
    await expect_error(call(s, "5", 1), Code.INVALID_ARG, start_error("5"))
    assert await call(s, 5, 4, end=True) == [[7]]
    await expect_error(call(s, 5, 1), Code.INVALID_ARG, start_error(5))


async def test_mixed_id_batch_keeps_numeric_corrid(repo, serve, monkeypatch):
    # ExecuteBatch.corrid becomes an object array when a string id is in the batch; a numeric
    # id in that batch must still be identifiable (it used to come out as "").
    write_model(repo, "m", config())
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [await send(s, 5, 1, start=True, end=True), await send(s, "five", 2, start=True, end=True)]
    assert await results(tasks) == [[1], [2]]
    (b,) = recorded(s, "m")
    assert b["ready"].tolist() == [True, True]
    assert b["corrid"][1] == "five"
    assert b["corrid"][0] == 5 and isinstance(b["corrid"][0], int), b["corrid"].tolist()


async def test_string_id_longer_than_128_characters(repo, serve):
    write_model(repo, "m", config())
    s = await serve()
    await expect_error(
        call(s, "x" * 129, 1, start=True),
        Code.INVALID_ARG,  # a client fault (Triton says UNSUPPORTED), with Triton's message
        "string correlation ID cannot be longer than 128 characters",  # no request-id prefix in Triton
    )
    assert await call(s, "x" * 128, 1, start=True, end=True) == [[1]]


@pytest.mark.parametrize("missing", [0, ""], ids=["zero", "empty_string"])
@pytest.mark.parametrize("start", [True, False], ids=["start", "continue"])
async def test_missing_correlation_id(repo, serve, missing, start):
    write_model(repo, "m", config())
    s = await serve(auto_sequence_ids=False)  # Triton's strict behaviour
    await expect_error(
        call(s, missing, 1, start=start, end=start),
        Code.INVALID_ARG,
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID",
    )


@pytest.mark.parametrize(
    ("corrid_type", "seq_id", "got", "want"),
    [
        ("TYPE_UINT64", "abc", "BYTES", "UINT64"),
        ("TYPE_INT32", "abc", "BYTES", "INT32"),
        ("TYPE_STRING", 17, "UINT64", "BYTES"),
        ("TYPE_STRING", 0, "UINT64", "BYTES"),  # no id: the dtype message, not the missing-id one
    ],
    ids=["str_to_uint64", "str_to_int32", "int_to_string", "none_to_string"],
)
async def test_corrid_dtype_mismatch(repo, serve, corrid_type, seq_id, got, want):
    controls = INT_CONTROLS + ", " + ctl("CORRID_T", "CORRID", f"data_type: {corrid_type}")
    write_model(repo, "m", config(controls=controls))
    s = await serve(auto_sequence_ids=False)
    msg = f"sequence batching control 'CORRID_T' data-type is '{got}', but model 'm' expects '{want}'"
    await expect_error(call(s, seq_id, 1, start=True), Code.INVALID_ARG, f"[request id: <id_unknown>] {msg}")
    r = s.infer("m", x_in(1), sequence_id=seq_id, sequence_start=True, request_id="r9")
    await expect_error(r, Code.INVALID_ARG, f"[request id: r9] {msg}")


async def test_sequence_request_must_have_batch_size_one(repo, serve):
    write_model(repo, "m", config())
    s = await serve()
    two = {"IN_X": np.array([[1], [2]], np.int32)}
    await expect_error(
        s.infer("m", two, sequence_id=1, sequence_start=True),
        Code.INVALID_ARG,
        "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher",
    )
    # Checked before the correlation id.
    await expect_error(
        s.infer("m", two),
        Code.INVALID_ARG,
        "inference request to model 'm' must specify batch-size 1 due to requirements of sequence batcher",
    )
    five = {"IN_X": np.arange(5, dtype=np.int32).reshape(5, 1)}
    await expect_error(
        s.infer("m", five, sequence_id=1, sequence_start=True),
        Code.INVALID_ARG,
        "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'm'",
    )


async def test_stateless_model_ignores_sequence_fields(repo, serve):
    write_model(
        repo,
        "plain",
        in_x_config(name="plain"),
    )
    s = await serve()
    assert await call(s, 0, 1, model="plain") == [[1]]
    assert await call(s, 5, 2, model="plain") == [[2]]  # no START needed
    assert await call(s, 5, 3, model="plain", end=True) == [[3]]
    assert await call(s, 5, 4, model="plain") == [[4]]  # END is not remembered
    assert await call(s, "id", 5, model="plain", start=True) == [[5]]
    two = {"IN_X": np.array([[6], [7]], np.int32)}
    r = await s.infer("plain", two, sequence_id=9, sequence_start=True)
    assert r.outputs["OUT_X"].tolist() == [[6], [7]]


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (
            {"IN_Y": np.array([[1]], np.int32)},
            None,
            "unexpected inference input 'IN_Y' for model 'm'",  # Model::GetInput: no request-id prefix
        ),
        (
            {},
            None,
            "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'm'. Got input(s) [], "
            "but missing required input(s) ['IN_X']. Please provide all required input(s).",
        ),
        (
            {"IN_X": np.array([[1.0]], np.float32)},
            None,
            "[request id: <id_unknown>] inference input 'IN_X' data-type is 'FP32', but model 'm' expects 'INT32'",
        ),
        (
            {"IN_X": np.array([[1, 2]], np.int32)},
            None,
            "[request id: <id_unknown>] unexpected shape for input 'IN_X' for model 'm'. Expected [-1,1], got [1,2]",
        ),
        (
            {"IN_X": np.array([[1]], np.int32)},
            ["OUT_X", "OUT_Z"],
            "unexpected inference output 'OUT_Z' for model 'm'",  # Model::GetOutput: no request-id prefix
        ),
    ],
    ids=["unknown_input", "missing_input", "wrong_dtype", "wrong_shape", "unknown_output"],
)
async def test_request_validation(repo, serve, inputs, outputs, message):
    write_model(repo, "m", config())
    s = await serve()
    e = await expect_error(s.infer("m", inputs, sequence_id=1, sequence_start=True, outputs=outputs), Code.INVALID_ARG)
    if "unexpected shape" in message:
        # Triton appends a NOTE about max_batch_size after this text.
        assert str(e).startswith(message)
    else:
        assert str(e) == message
    # Nothing was queued: the sequence was never started.
    await expect_error(call(s, 1, 1), Code.INVALID_ARG, start_error(1))
    assert recorded(s, "m") == []


async def test_missing_inputs_listed_like_triton(repo, serve):
    write_model(
        repo,
        "m2",
        """
        name: "m2"
        backend: "python"
        max_batch_size: 4
        input [ { name: "IN_A" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IN_B" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching { }
        """,
    )
    s = await serve()
    a = {"IN_A": np.array([[1]], np.int32)}
    await expect_error(
        s.infer("m2", a, sequence_id=1, sequence_start=True),
        Code.INVALID_ARG,
        "[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'm2'. Got input(s) ['IN_A'], "
        "but missing required input(s) ['IN_B']. Please provide all required input(s).",
    )
    # Triton joins the names with "," and no space.
    await expect_error(
        s.infer("m2", {}, sequence_id=1, sequence_start=True),
        Code.INVALID_ARG,
        "[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'm2'. Got input(s) [], "
        "but missing required input(s) ['IN_A','IN_B']. Please provide all required input(s).",
    )


# ----------------------------------------------------------------- implicit state (§6)


async def test_state_carries_and_resets_on_start(repo, serve):
    write_model(repo, "m", config(seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    assert [await call(s, 1, v, start=(v == 1)) for v in (1, 2, 3)] == [[[1]], [[3]], [[6]]]
    assert await call(s, 1, 4, end=True) == [[10]]
    # The slot still holds 10; a new sequence on it starts from zero_data.
    assert await call(s, 2, 1, start=True) == [[1]]
    assert await call(s, 2, 1, end=True) == [[2]]
    rec = recorded(s, "m")
    assert [b["states"]["ACC"].tolist() for b in rec] == [[[0]], [[1]], [[3]], [[6]], [[0]], [[1]]]
    assert rec[0]["states"]["ACC"].dtype == np.int32


async def test_state_unchanged_when_model_returns_no_state(repo, serve):
    # Triton QA test_no_update.
    model = """
    import numpy as np

    class Model:
        def execute(self, batch):
            new = batch.states["ACC"] + batch.inputs["IN_X"]
            out = {"OUT_X": new}
            if (batch.inputs["IN_X"][batch.ready] >= 0).all():
                out["ACC_OUT"] = new
            return out
    """
    write_model(repo, "m", config(seq=ACC_STATE), model)
    s = await serve()
    assert await call(s, 1, 5, start=True) == [[5]]
    assert await call(s, 1, -100) == [[-95]]  # state not returned: stays 5
    assert await call(s, 1, -1) == [[4]]
    assert await call(s, 1, 1, end=True) == [[6]]


async def test_initial_state_from_data_file(repo, serve):
    state = """
      state [ {
        input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 3 ]
        initial_state { data_type: TYPE_INT32 dims: [ 3 ] data_file: "init.bin" name: "init" }
      } ]
    """
    d = write_model(repo, "m", config(seq=state, out_dims="[ 3 ]"), ACCUM_MODEL)
    (d / "initial_state").mkdir()
    # Extra bytes after the needed 12 are ignored.
    (d / "initial_state" / "init.bin").write_bytes(np.array([10, 20, 30, 99], np.int32).tobytes())
    s = await serve()
    assert await call(s, 1, 1, start=True) == [[11, 21, 31]]
    assert await call(s, 1, 1) == [[12, 22, 32]]
    assert await call(s, 1, 5, start=True) == [[15, 25, 35]]  # START: back to the file's data
    assert await call(s, 2, 0, start=True, end=True) == [[10, 20, 30]]  # another slot
    assert recorded(s, "m")[0]["states"]["ACC"].tolist() == [[10, 20, 30]]


async def test_variable_dims_state_grows_each_step(repo, serve, monkeypatch):
    model = """
    import numpy as np
    SEEN = []

    class Model:
        def execute(self, batch):
            st = batch.states["HIST"]
            for row in np.flatnonzero(batch.ready):
                SEEN.append((int(batch.corrid[row]), st.shape[1:], st[row].tolist()))
            new = np.concatenate([st, batch.inputs["IN_X"]], axis=1)
            return {"OUT_X": new, "HIST_OUT": new}
    """
    state = """
      state [ {
        input_name: "HIST" output_name: "HIST_OUT" data_type: TYPE_INT32 dims: [ -1 ]
        initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" }
      } ]
    """
    write_model(repo, "m", config(seq=state, out_dims="[ -1 ]"), model)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [await send(s, 1, 1, start=True), await send(s, 2, 10, start=True)]
    assert await results(tasks) == [[0, 1], [0, 10]]
    first = model_module("m").SEEN[:2]
    assert first == [(1, (1,), [0]), (2, (1,), [0])]  # one batch of [2, 1]
    for step in (2, 3):
        tasks = [await send(s, 1, step), await send(s, 2, 10 * step)]
        assert await results(tasks) == [list(range(step + 1)), [0] + [10 * k for k in range(1, step + 1)]]
    assert await call(s, 1, 4, end=True) == [[0, 1, 2, 3, 4]]
    assert await call(s, 2, 7, start=True) == [[0, 7]]  # START: back to the initial shape
    seen = model_module("m").SEEN
    assert [(shape, st) for cid, shape, st in seen if cid == 1] == [
        ((1,), [0]),
        ((2,), [0, 1]),
        ((3,), [0, 1, 2]),
        ((4,), [0, 1, 2, 3]),
    ]
    assert [(shape, st) for cid, shape, st in seen if cid == 2] == [
        ((1,), [0]),
        ((2,), [0, 10]),
        ((3,), [0, 10, 20]),
        ((1,), [0]),
    ]


async def test_variable_dims_state_sequences_of_different_lengths(repo, serve):
    model = """
    import numpy as np

    class Model:
        def execute(self, batch):
            new = np.concatenate([batch.states["HIST"], batch.inputs["IN_X"]], axis=1)
            return {"OUT_X": new.sum(axis=1, keepdims=True).astype(np.int32), "HIST_OUT": new}
    """
    state = """
      state [ { input_name: "HIST" output_name: "HIST_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
    """
    write_model(repo, "m", config(seq=state), model)
    s = await serve()
    assert await call(s, 1, 1, start=True) == [[1]]
    assert await call(s, 1, 2) == [[3]]
    assert await call(s, 1, 3) == [[6]]
    # Sequence 2 has a shorter state; both still get their own history.
    tasks = [await send(s, 2, 100, start=True), await send(s, 1, 4), await send(s, 2, 1), await send(s, 1, 5)]
    assert await results(tasks) == [[100], [10], [101], [15]]


# --------------------------------------------------- several instances, mbs 0 (§8)


async def test_multiple_instances_spread_sequences(repo, serve):
    extra = "instance_group [ { count: 2 kind: KIND_CPU } ]"
    write_model(repo, "m", config(mbs=2, seq=ACC_STATE, extra=extra), ACCUM_MODEL)
    s = await serve()
    m = s.model("m")
    for sid in (1, 2, 3, 4):
        assert await call(s, sid, sid * 100, start=True) == [[sid * 100]]
    seqs = m.scheduler_state()["sequences"]
    assert {seqs["1"], seqs["2"]} == {0, 2}  # slot 0 of instance 0 and of instance 1
    assert {seqs["3"], seqs["4"]} == {1, 3}  # then slot 1 of each
    tasks = []
    for step in (1, 2, 3):
        for sid in (1, 2, 3, 4):
            tasks.append(await send(s, sid, step, end=(step == 3)))
    got = await results(tasks)
    expected = [[sid * 100 + step * (step + 1) // 2] for step in (1, 2, 3) for sid in (1, 2, 3, 4)]
    assert got == expected
    for b in recorded(s, "m"):
        for row, (ready, cid) in enumerate(zip(b["ready"].tolist(), b["corrid"].tolist(), strict=True)):
            if ready:
                # never mixes instances, and batch position == slot index
                assert seqs[str(cid)] == b["instance"] * 2 + row
    assert {b["instance"] for b in recorded(s, "m")} == {0, 1}


async def test_max_batch_size_zero_one_slot_per_instance(repo, serve):
    write_model(repo, "m", config(mbs=0, seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    m = s.model("m")
    assert await call(s, 1, 5, start=True, mbs=0) == [5]
    waiting = [await send(s, 2, 50, start=True, mbs=0), await send(s, 2, 1, mbs=0)]
    assert m.scheduler_state()["backlog_sequences"] == 1
    assert await call(s, 1, 2, end=True, mbs=0) == [7]
    assert await results(waiting) == [[50], [51]]
    assert await call(s, 2, 1, end=True, mbs=0) == [52]
    rec = recorded(s, "m")
    assert [b["size"] for b in rec] == [1] * 5
    assert [b["states"]["ACC"].shape for b in rec] == [(1,)] * 5  # no batch dim
    assert [b["controls"]["START"].shape for b in rec] == [(1,)] * 5
    assert rows(rec, "corrid") == [[1], [1], [2], [2], [2]]


async def test_max_batch_size_zero_two_instances(repo, serve):
    extra = "instance_group [ { count: 2 kind: KIND_CPU } ]"
    write_model(repo, "m", config(mbs=0, seq=ACC_STATE, extra=extra), ACCUM_MODEL)
    s = await serve()
    assert await call(s, 1, 1, start=True, mbs=0) == [1]
    assert await call(s, 2, 2, start=True, mbs=0) == [2]
    seqs = s.model("m").scheduler_state()["sequences"]
    assert sorted(seqs.values()) == [0, 1]
    third = await send(s, 3, 3, start=True, end=True, mbs=0)
    assert s.model("m").scheduler_state()["backlog_sequences"] == 1
    assert await call(s, 2, 2, end=True, mbs=0) == [4]
    assert await results([third]) == [[3]]
    assert recorded(s, "m")[-1]["instance"] == seqs["2"]
    assert await call(s, 1, 1, end=True, mbs=0) == [2]


# ------------------------------------------------ queue delay / slot utilization (§2.3)


async def test_batch_waits_for_minimum_slot_utilization(repo, serve):
    seq = "direct { max_queue_delay_microseconds: 5000000 minimum_slot_utilization: 0.5 }"
    write_model(repo, "m", config(seq=seq))
    s = await serve()
    first = await send(s, 1, 1, start=True)
    await asyncio.sleep(0.15)
    assert not first.done() and recorded(s, "m") == []  # 1 of 4 slots < 0.5
    second = await send(s, 2, 2, start=True)  # 2 of 4 slots: run now
    assert await results([first, second], timeout=2) == [[1], [2]]
    assert [b["size"] for b in recorded(s, "m")] == [2]


async def test_batch_runs_when_queue_delay_expires(repo, serve):
    seq = "direct { max_queue_delay_microseconds: 200000 minimum_slot_utilization: 1.0 }"
    write_model(repo, "m", config(seq=seq))
    s = await serve()
    t0 = time.monotonic()
    assert await asyncio.wait_for(call(s, 1, 1, start=True, end=True), 3) == [[1]]
    assert time.monotonic() - t0 >= 0.2


async def test_queue_delay_ignored_without_utilization(repo, serve):
    seq = "direct { max_queue_delay_microseconds: 5000000 }"  # minimum_slot_utilization 0: run at once
    write_model(repo, "m", config(seq=seq))
    s = await serve()
    t0 = time.monotonic()
    assert await asyncio.wait_for(call(s, 1, 1, start=True, end=True), 3) == [[1]]
    assert time.monotonic() - t0 < 2


# ------------------------------------------------------------------ statistics (§11)


async def test_statistics_counts(repo, serve, monkeypatch):
    write_model(repo, "m", config())
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [await send(s, 1, 1, start=True), await send(s, 2, 2, start=True)]
    await results(tasks)  # batch of 2
    await call(s, 2, 3, end=True)  # batch [pad, 2]
    await call(s, 1, 4, end=True)  # batch [1]
    st = await settled_stats(s, requests=4)
    assert st.name == "m" and st.version == "1"
    assert st.execution_count == 3
    assert st.inference_count == 4
    assert st.inference_stats.success.count == 4
    assert st.inference_stats.queue.count == 4
    assert st.inference_stats.compute_infer.count == 4
    assert st.last_inference > 0
    sizes = {}
    for b in st.batch_stats:
        for d in (b.compute_input, b.compute_infer, b.compute_output):
            assert d.count >= 0 and d.ns >= 0
        sizes[b.batch_size] = b.compute_infer.count
    assert sizes == {1: 1, 2: 2}


# --------------------------------------------------------------------- shutdown (§10)


async def test_shutdown_refuses_new_starts_and_finishes_running_sequences(repo, serve):
    write_model(repo, "m", config(seq=ACC_STATE), ACCUM_MODEL)
    s = await serve()
    assert await call(s, 1, 1, start=True) == [[1]]
    stopping = asyncio.ensure_future(s.shutdown(timeout_s=5))
    await asyncio.sleep(0)
    msg = "Server is stopping, scheduler for model has stopped accepting new inference requests"
    await expect_error(call(s, 2, 1, start=True), Code.UNAVAILABLE, msg)
    await expect_error(call(s, 1, 1, start=True), Code.UNAVAILABLE, msg)  # a re-START is a START
    assert not stopping.done()
    assert await call(s, 1, 2) == [[3]]
    assert await call(s, 1, 3, end=True) == [[6]]
    await asyncio.wait_for(stopping, 3)
    assert recorded(s, "m")[-1]["end"].tolist() == [True]


async def test_shutdown_waits_for_idle_reaper(repo, serve):
    write_model(repo, "m", config(seq=IDLE))
    s = await serve()
    await call(s, 1, 1, start=True)  # never ended
    t0 = time.monotonic()
    await asyncio.wait_for(s.shutdown(timeout_s=10), 3)
    assert 0.1 <= time.monotonic() - t0 < 2


# ------------------------------------------------------------------ model errors


async def test_model_error_fails_only_its_batch(repo, serve, monkeypatch):
    model = """
    import numpy as np

    class Model:
        def execute(self, batch):
            x = batch.inputs["IN_X"]
            if (x[batch.ready] < 0).any():
                raise RuntimeError("negative input")
            return {"OUT_X": x.copy()}
    """
    write_model(repo, "m", config(), model)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")
    s = await serve()
    tasks = [await send(s, 1, 1, start=True), await send(s, 2, -1, start=True)]
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    for e in done:
        assert isinstance(e, InferenceError), e
        assert e.code == Code.INTERNAL
        assert "'m'" in str(e) and "negative input" in str(e)
    # The sequences are still active and the next batches work.
    assert await call(s, 1, 5) == [[5]]
    assert await call(s, 2, 6, end=True) == [[6]]
    assert await call(s, 1, 7, end=True) == [[7]]
    st = await settled_stats(s, requests=5)
    assert st.inference_stats.success.count == 3
    assert st.inference_stats.fail.count == 2
    assert st.inference_count == 3


async def test_statistics_include_request_when_its_response_arrives(repo, serve):
    # A client that has its response must see its request in the statistics. The engine
    # resolves the future before the executor updates the counters, so a read right after
    # the response is sometimes stale (a race: a couple of reads in a thousand, more under load).
    write_model(repo, "m", config())
    s = await serve()
    stale = []
    for i in range(1, 2001):
        await s.infer("m", x_in(i), sequence_id=i, sequence_start=True, sequence_end=True)
        st = s.statistics("m")[0]
        if st.inference_count != i or st.execution_count != i:
            stale.append((i, st.inference_count, st.execution_count))
    assert stale == []
