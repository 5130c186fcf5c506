"""seqserve's config extensions and instance groups, through the in-process API.

Covered: `state { name }`, `reusable_batch`, `sequence_batching.timeout_action`
(TIMEOUT_COMPLETE / TIMEOUT_REJECT), `stateful_model_policy` (DESCRIBE, and a model made
stateful by the policy alone), `dynamic_batching.default_batch_size` / `timeout_action`,
dynamic_batching next to sequence_batching, instance_group count > 1 for every scheduler and
its device warnings, and the two brief configs (as given, and served with a Python model).
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time

import numpy as np
import orjson
import pytest

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine import Code
from seqserve.engine.config import config_to_json, load_model_config
from seqserve.engine.errors import ModelConfigError
from tests.support.checks import expect_error, holds_sequence, start_error, wait_reaped, wait_until
from tests.support.models import (
    ACCUM_MODEL,
    BRIEF_A_MODEL,
    BRIEF_B_IO,
    BRIEF_B_MODEL,
    RECORDING_MODEL,
    in_x_config,
    model_module,
    python_brief,
    recorded,
    write_model,
)
from tests.support.paths import BRIEF

# ----------------------------------------------------------------------------- helpers

NAMED_STATE = """
  state { name: "S" data_type: TYPE_INT32 dims: [ 1 ]
          initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" } }
"""

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
"""


def seq_config(*, mbs: int = 4, seq: str = "", extra: str = "", state: str = NAMED_STATE) -> str:
    scheduling = f"""
sequence_batching {{
  {CONTROLS}
  {state}
  {seq}
}}"""
    return in_x_config(extra + scheduling, mbs=mbs)


def x_in(value: int, mbs: int = 4) -> dict[str, np.ndarray]:
    return {"IN_X": np.array([[value]] if mbs > 0 else [value], np.int32)}


async def send(s, seq_id, value=0, *, start=False, end=False, model="m") -> asyncio.Task:
    task = asyncio.ensure_future(
        s.infer(model, x_in(value), sequence_id=seq_id, sequence_start=start, sequence_end=end)
    )
    await asyncio.sleep(0)
    return task


async def call(s, seq_id, value=0, *, start=False, end=False) -> int:
    r = await s.infer("m", x_in(value), sequence_id=seq_id, sequence_start=start, sequence_end=end)
    return int(r.outputs["OUT_X"].reshape(-1)[0])


async def results(tasks, timeout: float = 10.0) -> list[int]:
    out = await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    return [int(r.outputs["OUT_X"].reshape(-1)[0]) for r in out]


def served_json(s, model: str = "m") -> dict:
    return config_to_json(s.model(model).config)


def record(s, model: str = "m") -> list[dict]:
    """The model's RECORD (ACCUM_MODEL, RECORDING_MODEL) in plain lists: the per-row flags, ids
    and controls; `x` the IN_X values and `state` the implicit state's, flattened."""
    out = []
    for b in recorded(s, model):
        r = {"instance": b["instance"], "size": b["size"], "x": b["inputs"]["IN_X"].reshape(-1).tolist()}
        r.update({k: b[k].tolist() for k in ("start", "end", "ready", "corrid")})
        r["controls"] = {k: v.reshape(-1).tolist() for k, v in b["controls"].items()}
        r["state"] = [v for st in b["states"].values() for v in st.reshape(-1).tolist()]
        out.append(r)
    return out


A, B, C, D, E = 201, 202, 203, 204, 205

# ------------------------------------------------------------------------ state { name }


async def test_state_name_is_both_input_and_output(repo, serve):
    write_model(repo, "m", seq_config(), ACCUM_MODEL)
    s = await serve()
    (st,) = served_json(s)["sequence_batching"]["state"]
    assert (st["name"], st["input_name"], st["output_name"]) == ("S", "S", "S")
    assert [await call(s, A, v, start=v == 1) for v in (1, 2, 3)] == [1, 3, 6]
    assert await call(s, A, 4, end=True) == 10
    assert [b["state"] for b in record(s)] == [[0], [1], [3], [6]]


async def test_state_name_carries_over_in_batches(repo, serve, monkeypatch):
    write_model(repo, "m", seq_config(), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [
        await send(s, A, 1, start=True),
        await send(s, B, 10, start=True),
        await send(s, A, 2, end=True),
        await send(s, B, 20, end=True),
    ]
    assert await results(tasks) == [1, 10, 3, 30]
    assert [b["state"] for b in record(s)] == [[0, 0], [1, 10]]


def test_state_name_conflicting_with_input_name_is_refused(repo):
    state = 'state { name: "S" input_name: "OTHER" data_type: TYPE_INT32 dims: [ 1 ] }'
    d = write_model(repo, "m", seq_config(state=state), ACCUM_MODEL)
    with pytest.raises(ModelConfigError) as ei:
        load_model_config(d)
    assert str(ei.value) == (
        "sequence batching state 'S' sets both 'name' and a different 'input_name' ('OTHER') for m"
    )


# ------------------------------------------------------------------------ reusable_batch


async def test_reusable_batch_is_oldest_with_candidate_sizes(repo, serve, monkeypatch):
    seq = "reusable_batch { max_size: 4 candidate_batch_size: [ 2 ] }"
    extra = "dynamic_batching { max_queue_delay_microseconds: 20000000 }"
    write_model(repo, "m", seq_config(seq=seq, extra=extra), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    m = s.model("m")
    assert m.strategy_name == "reusable_batch"
    assert m.config.sequence_batching.WhichOneof("strategy_choice") == "reusable_batch"
    tasks = [await send(s, sid, sid, start=True) for sid in (A, B, C, D)]
    assert await results(tasks, timeout=5) == [A, B, C, D]  # candidate size 2, long before 20 s
    assert [b["size"] for b in record(s)] == [2, 2]
    assert m.scheduler_state()["free_slots"] == 0  # max_size: 4 sequences per instance
    waiting = [await send(s, E, 1, start=True, end=True), await send(s, E + 1, 2, start=True, end=True)]
    assert m.scheduler_state()["backlog_sequences"] == 2
    # The ENDs free the slots as they are handed on; E and E+1 take two of them and run once
    # the ENDs there have been released. Oldest rules: no padding, one request per sequence.
    tasks = [await send(s, sid, 1, end=True) for sid in (A, B, C, D)]
    assert await results(tasks + waiting, timeout=5) == [A + 1, B + 1, C + 1, D + 1, 1, 2]
    rec = record(s)
    assert [b["size"] for b in rec] == [2] * 5  # pairs only: nothing waited for the delay
    assert rec[2]["corrid"] == [A, B]
    later = [cid for b in rec[2:] for cid in b["corrid"]]
    assert sorted(later) == [A, B, C, D, E, E + 1]
    assert later.index(E) > later.index(A) and later.index(E + 1) > later.index(B)  # took their slots
    assert [b["state"] for b in rec if E in b["corrid"] or E + 1 in b["corrid"]]  # ran
    for b in rec:
        assert all(b["ready"]) and len(set(b["corrid"])) == b["size"]


async def test_reusable_batch_delay_comes_from_dynamic_batching(repo, serve):
    seq = "reusable_batch { max_size: 2 candidate_batch_size: [ 2 ] }"
    extra = "dynamic_batching { max_queue_delay_microseconds: 300000 }"
    write_model(repo, "m", seq_config(seq=seq, extra=extra), ACCUM_MODEL)
    s = await serve()
    t0 = time.monotonic()
    assert await asyncio.wait_for(call(s, A, 5, start=True, end=True), 5) == 5  # alone: waits for the delay
    assert time.monotonic() - t0 >= 0.29


async def test_reusable_batch_without_dynamic_batching_does_not_wait(repo, serve):
    seq = "reusable_batch { max_size: 2 candidate_batch_size: [ 2 ] }"
    write_model(repo, "m", seq_config(seq=seq), ACCUM_MODEL)
    s = await serve()
    t0 = time.monotonic()
    for v in range(1, 5):
        assert await call(s, A, v, start=v == 1, end=v == 4) == v * (v + 1) // 2
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    ("mbs", "reusable", "dyn", "max_size", "sizes"),
    [
        (4, "", "", 4, [4]),
        (4, "", "dynamic_batching { preferred_batch_size: [ 2, 4 ] }", 4, [2, 4]),
        (4, "max_size: 6", "", 6, [4]),
        (4, "candidate_batch_size: [ 3 ]", "dynamic_batching { preferred_batch_size: [ 2 ] }", 4, [3]),
        (0, "", "", 1, []),
    ],
)
async def test_reusable_batch_defaults(repo, serve, mbs, reusable, dyn, max_size, sizes):
    write_model(repo, "m", seq_config(mbs=mbs, seq=f"reusable_batch {{ {reusable} }}", extra=dyn), ACCUM_MODEL)
    s = await serve()
    rb = s.model("m").config.sequence_batching.reusable_batch
    assert rb.max_size == max_size
    assert list(rb.candidate_batch_size) == sizes
    assert s.model("m").scheduler_state()["free_slots"] == max_size


# ------------------------------------------------------ sequence timeout_action (idle expiry)

IDLE = "max_sequence_idle_microseconds: 150000"


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { }"])
async def test_timeout_complete_gives_exactly_one_final_end_step(repo, serve, strategy):
    seq = f"{strategy} {IDLE} timeout_action: TIMEOUT_COMPLETE"
    write_model(repo, "m", seq_config(seq=seq), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 5, start=True) == 5
    assert await call(s, A, 2) == 7
    await wait_until(lambda: len(record(s)) >= 3, "the final END step has run")
    await asyncio.sleep(0.3)  # two more idle periods: nothing may follow
    rec = record(s)
    assert len(rec) == 3
    final = rec[2]
    rows = [i for i, cid in enumerate(final["corrid"]) if cid == A]
    assert len(rows) == 1
    (i,) = rows
    assert final["end"][i] and final["ready"][i] and not final["start"][i]
    assert final["controls"]["END"][i] == 1 and final["controls"]["READY"][i] == 1
    assert final["controls"]["START"][i] == 0
    assert final["x"][i] == 0  # zero inputs
    assert final["state"][i] == 7  # the sequence's state, for the model to finish with
    # The id is gone: a non-START request is refused, a START begins clean.
    await expect_error(call(s, A, 1), Code.INVALID_ARG, start_error(A))
    assert await call(s, A, 3, start=True) == 3
    assert await call(s, A, 1, end=True) == 4
    ends = [b for b in record(s) for j, cid in enumerate(b["corrid"]) if cid == A and b["end"][j]]
    assert len(ends) == 2  # the final step and the client's own END
    st = s.statistics("m")[0]
    assert st.inference_count == 4  # the final step is not a request


async def test_timeout_complete_final_step_before_backlog_takes_the_slot(repo, serve):
    seq = f"{IDLE} timeout_action: TIMEOUT_COMPLETE"
    write_model(repo, "m", seq_config(mbs=1, seq=seq), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 7, start=True) == 7
    waiting = await send(s, B, 3, start=True)  # backlog until A expires
    assert await results([waiting], timeout=5) == [3]  # fresh state
    # B waited in the backlog longer than the idle limit and its clock is not refreshed on the
    # hand-off (§4.4), so it expires right after its first step and gets its own final step.
    await wait_until(lambda: len(record(s)) >= 4, "B's final END step has run")
    rec = record(s)
    assert [b["corrid"] for b in rec] == [[A], [A], [B], [B]]
    assert [b["end"] for b in rec] == [[False], [True], [False], [True]]
    assert [b["start"] for b in rec] == [[True], [False], [True], [False]]
    assert [b["state"] for b in rec] == [[0], [7], [0], [3]]
    assert [b["x"] for b in rec] == [[7], [0], [3], [0]]


async def test_timeout_complete_with_other_sequences_in_the_batch(repo, serve):
    # B's arrivals are far closer together than the 1 s idle limit, so a loaded machine cannot
    # make B expire; A, left alone, does.
    seq = "max_sequence_idle_microseconds: 1000000 timeout_action: TIMEOUT_COMPLETE"
    write_model(repo, "m", seq_config(seq=seq), ACCUM_MODEL)
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    assert await call(s, B, 10, start=True) == 10
    total = 10
    deadline = time.monotonic() + 10
    while holds_sequence(s, A):  # B stays alive, A expires
        assert time.monotonic() < deadline, "A was never reaped"
        await asyncio.sleep(0.05)
        total += 1
        assert await call(s, B, 1) == total
    await wait_until(lambda: any(any(b["end"]) for b in record(s)), "A's final END step has run")
    ends = [(b["corrid"], b["end"], b["x"]) for b in record(s) if any(b["end"])]
    assert len(ends) == 1
    corrid, end, x = ends[0]
    (i,) = [j for j, e in enumerate(end) if e]
    assert corrid[i] == A and x[i] == 0
    assert holds_sequence(s, B)
    assert await call(s, B, 1, end=True) == total + 1


@pytest.mark.parametrize("strategy", ["direct { }", "oldest { }"])
async def test_timeout_complete_final_step_follows_queued_requests(repo, serve, strategy):
    # A expires while its first request runs (slow model) and its second waits: the queued
    # request runs first, then the one final END step.
    model = """
    import time
    import numpy as np
    RECORD = []

    class Model:
        def execute(self, batch):
            RECORD.append((batch.corrid.tolist(), batch.end.tolist(), batch.inputs["IN_X"].reshape(-1).tolist()))
            time.sleep(0.25)
            new = batch.states["S"] + batch.inputs["IN_X"]
            return {"OUT_X": new, "S": new}
    """
    seq = f"{strategy} {IDLE} timeout_action: TIMEOUT_COMPLETE"
    write_model(repo, "m", seq_config(seq=seq), model)
    s = await serve()
    tasks = [await send(s, A, 1, start=True), await send(s, A, 2)]
    assert await results(tasks) == [1, 3]
    rec = model_module("m").RECORD
    await wait_until(lambda: len(rec) >= 3, "the final END step has run")
    assert rec == [([A], [False], [1]), ([A], [False], [2]), ([A], [True], [0])]
    await expect_error(call(s, A, 3), Code.INVALID_ARG, start_error(A))


@pytest.mark.parametrize("action", ["", "timeout_action: TIMEOUT_REJECT"])
async def test_timeout_reject_never_tells_the_model(repo, serve, action):
    write_model(repo, "m", seq_config(seq=f"{IDLE} {action}"), ACCUM_MODEL)
    s = await serve()
    assert s.model("m").config.sequence_batching.timeout_action == mc.TIMEOUT_REJECT
    assert await call(s, A, 5, start=True) == 5
    await wait_reaped(s, A)
    await expect_error(call(s, A, 1), Code.INVALID_ARG, start_error(A))
    await expect_error(call(s, A, 1, end=True), Code.INVALID_ARG, start_error(A))
    assert len(record(s)) == 1 and not any(record(s)[0]["end"])
    assert await call(s, A, 2, start=True, end=True) == 2
    ends = [cid for b in record(s) for cid, e, r in zip(b["corrid"], b["end"], b["ready"], strict=True) if e and r]
    assert ends == [A]  # only the client's own END reached the model


# -------------------------------------------------------------- stateful_model_policy

POLICY = "model_transaction_policy { stateful_model_policy { timeout_action: DESCRIBE } }"


async def test_describe_logs_one_structured_line_per_expired_sequence(repo, serve, caplog):
    write_model(repo, "m", seq_config(seq=IDLE, extra=POLICY), ACCUM_MODEL)
    caplog.set_level(logging.INFO, logger="seqserve.model")
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    assert await call(s, A, 2) == 3
    assert await call(s, "user-9", 4, start=True) == 4
    assert await call(s, B, 1, start=True, end=True) == 1  # ended: never described

    def expired_lines() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "seqserve.model" and "sequence expired" in r.getMessage()
        ]

    await wait_until(lambda: len(expired_lines()) >= 2, "two expired sequences are described")
    await asyncio.sleep(0.3)  # two more idle periods: B is never described
    lines = expired_lines()
    assert len(lines) == 2, lines
    infos = {}
    for line in lines:
        m = re.fullmatch(r"sequence expired (\{.*\})", line)
        assert m, line
        info = orjson.loads(m.group(1))
        infos[info["sequence_id"]] = info
    assert set(infos) == {A, "user-9"}
    a = infos[A]
    assert a["model"] == "m" and a["steps"] == 2
    assert a["state_bytes"] == 4  # one INT32
    assert a["age_s"] >= 0.15 and a["idle_s"] >= 0.15
    assert "slot" in a and "instance" in a
    assert infos["user-9"]["steps"] == 1
    # DESCRIBE only reports: the sequence is still gone.
    await expect_error(call(s, A, 1), Code.INVALID_ARG, start_error(A))


async def test_policy_alone_makes_a_sequence_model(repo, serve):
    model = """
    import numpy as np
    SUMS = {}

    class Model:
        def execute(self, batch):
            out = []
            for ready, start, cid, x in zip(batch.ready, batch.start, batch.corrid, batch.inputs["IN_X"][:, 0]):
                if not ready:
                    out.append([0])
                    continue
                SUMS[cid] = (0 if start else SUMS[cid]) + int(x)
                out.append([SUMS[cid]])
            return {"OUT_X": np.array(out, np.int32)}
    """
    write_model(repo, "m", in_x_config(POLICY), model)
    s = await serve()
    m = s.model("m")
    assert m.is_sequence and m.strategy_name == "direct"
    served = served_json(s)
    assert served["sequence_batching"]["max_sequence_idle_microseconds"] == 300_000_000
    assert "direct" in served["sequence_batching"]
    # No id: a new sequence under a generated id, which the reply names.
    r = await s.infer("m", x_in(5))
    sid = r.parameters["sequence_id"]
    assert sid and int(r.outputs["OUT_X"][0, 0]) == 5
    r2 = await s.infer("m", x_in(6), sequence_id=sid)
    assert int(r2.outputs["OUT_X"][0, 0]) == 11
    other = (await s.infer("m", x_in(100))).parameters["sequence_id"]
    assert other != sid
    r3 = await s.infer("m", x_in(1), sequence_id=sid, sequence_end=True)
    assert int(r3.outputs["OUT_X"][0, 0]) == 12
    await expect_error(s.infer("m", x_in(1), sequence_id=sid), Code.INVALID_ARG, start_error(sid))
    seqs = m.scheduler_state()["sequences"]
    assert str(other) in seqs and str(sid) not in seqs


async def test_policy_without_describe_is_quiet(repo, serve, caplog):
    extra = "model_transaction_policy { stateful_model_policy { } }"
    write_model(repo, "m", seq_config(seq=IDLE, extra=extra), ACCUM_MODEL)
    caplog.set_level(logging.INFO, logger="seqserve.model")
    s = await serve()
    assert await call(s, A, 1, start=True) == 1
    await wait_reaped(s, A)
    await expect_error(call(s, A, 1), Code.INVALID_ARG, start_error(A))
    assert not [r for r in caplog.records if "sequence expired" in r.getMessage()]


# ------------------------------------------------------------ dynamic_batching extensions


@pytest.mark.parametrize(
    ("mbs", "dyn", "preferred"),
    [
        (8, "default_batch_size: 4", [4, 8]),
        (8, "default_batch_size: 4 preferred_batch_size: [ 2 ]", [2, 4]),
        (8, "default_batch_size: 2 preferred_batch_size: [ 2, 6 ]", [2, 6]),
        (8, "default_batch_size: 8", [8]),
        (8, "", [8]),
    ],
)
async def test_default_batch_size_adds_a_preferred_size(repo, serve, mbs, dyn, preferred):
    write_model(repo, "m", in_x_config(mbs=mbs, rest=f"dynamic_batching {{ {dyn} }}"), RECORDING_MODEL)
    s = await serve()
    assert list(s.model("m").config.dynamic_batching.preferred_batch_size) == preferred


async def test_default_batch_size_forms_batches(repo, serve, monkeypatch):
    dyn = "dynamic_batching { default_batch_size: 3 max_queue_delay_microseconds: 20000000 }"
    write_model(repo, "m", in_x_config(mbs=8, rest=dyn), RECORDING_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    tasks = []
    for v in range(6):
        tasks.append(asyncio.ensure_future(s.infer("m", {"IN_X": np.array([[v]], np.int32)})))
        await asyncio.sleep(0)
    out = await asyncio.wait_for(asyncio.gather(*tasks), 5)  # long before the 20 s delay
    assert [int(r.outputs["OUT_X"][0, 0]) for r in out] == list(range(6))
    assert [b["size"] for b in record(s)] == [3, 3]


@pytest.mark.parametrize(
    ("dyn", "action"),
    [
        ("timeout_action: TIMEOUT_COMPLETE", mc.ModelQueuePolicy.DELAY),
        ("timeout_action: TIMEOUT_REJECT", mc.ModelQueuePolicy.REJECT),
        ("", mc.ModelQueuePolicy.REJECT),
    ],
)
async def test_dynamic_timeout_action_sets_default_queue_policy(repo, serve, dyn, action):
    write_model(repo, "m", in_x_config(mbs=4, rest=f"dynamic_batching {{ {dyn} }}"), RECORDING_MODEL)
    s = await serve()
    assert s.model("m").config.dynamic_batching.default_queue_policy.timeout_action == action


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            in_x_config(mbs=4, rest="dynamic_batching { default_batch_size: 8 }"),
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            in_x_config(
                mbs=4,
                rest="dynamic_batching { preserve_ordering: true timeout_action: TIMEOUT_COMPLETE "
                "default_queue_policy { default_timeout_microseconds: 1000 } }",
            ),
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
        ),
        (
            seq_config(seq="reusable_batch { candidate_batch_size: [ 8 ] }"),
            "sequence batching reusable_batch candidate batch size must be <= max batch size for m",
        ),
        (
            seq_config(seq="oldest { }", extra="dynamic_batching { preferred_batch_size: [ 0 ] }"),
            "dynamic batching preferred size must be positive for m",
        ),
    ],
    ids=["default_batch_size_too_big", "complete_with_preserve_ordering", "candidate_too_big", "zero_preferred"],
)
def test_extension_settings_are_validated(repo, config, message):
    d = write_model(repo, "m", config, RECORDING_MODEL)
    with pytest.raises(ModelConfigError) as ei:
        load_model_config(d)
    assert str(ei.value) == message


# ---------------------------------------------- dynamic_batching next to sequence_batching


@pytest.mark.parametrize(
    ("oldest", "dyn", "preferred", "delay"),
    [
        ("", "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000", [2], 20000000),
        ("preferred_batch_size: [ 3 ]", "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 7", [3], 7),
        ("max_queue_delay_microseconds: 5", "preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 7", [2], 5),
        ("", "max_queue_delay_microseconds: 9", [4], 9),
    ],
)
async def test_oldest_inherits_dynamic_batching_unless_set(repo, serve, oldest, dyn, preferred, delay):
    write_model(repo, "m", seq_config(seq=f"oldest {{ {oldest} }}", extra=f"dynamic_batching {{ {dyn} }}"), ACCUM_MODEL)
    s = await serve()
    o = s.model("m").config.sequence_batching.oldest
    assert list(o.preferred_batch_size) == preferred
    assert o.max_queue_delay_microseconds == delay


async def test_oldest_batches_with_dynamic_batching_settings(repo, serve, monkeypatch):
    dyn = "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000 }"
    write_model(repo, "m", seq_config(seq="oldest { }", extra=dyn), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [await send(s, sid, 1, start=True) for sid in (A, B, C, D)]
    assert await results(tasks, timeout=5) == [1, 1, 1, 1]
    assert [b["size"] for b in record(s)] == [2, 2]
    assert s.model("m").strategy_name == "oldest"


async def test_direct_ignores_dynamic_batching(repo, serve, monkeypatch):
    dyn = "dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000 }"
    write_model(repo, "m", seq_config(seq="direct { }", extra=dyn), ACCUM_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    assert s.model("m").strategy_name == "direct"
    tasks = [await send(s, sid, 1, start=True) for sid in (A, B, C)]
    assert await results(tasks, timeout=5) == [1, 1, 1]
    assert [b["size"] for b in record(s)] == [3]  # batch position == slot; no preferred size
    t0 = time.monotonic()
    assert await call(s, C, 1, end=True) == 2  # and no queue delay
    assert time.monotonic() - t0 < 2
    assert record(s)[-1]["ready"] == [False, False, True]


# --------------------------------------------------------------------- instance groups (§8)

GATED = """
import queue, threading
import numpy as np
ENTERED = queue.Queue()
GATE = threading.Event()
RECORD = []

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index
        self.device = ctx.device

    def execute(self, batch):
        x = batch.inputs["IN_X"]
        RECORD.append((self.instance, self.device, x.reshape(-1).tolist()))
        ENTERED.put(self.instance)
        if (x == -1).any():
            GATE.wait(20)
        out = {"OUT_X": x.copy()}
        for name, value in batch.states.items():
            out["ACC_OUT" if name == "ACC" else name] = value
        return out
"""

GROUPS = "instance_group [ { count: 2 kind: KIND_CPU } ]"
SCHEDULERS = {
    "direct": seq_config(extra=GROUPS, seq="direct { }"),
    "oldest": seq_config(extra=GROUPS, seq="oldest { }"),
    "reusable_batch": seq_config(extra=GROUPS, seq="reusable_batch { }"),
    "dynamic": in_x_config(mbs=4, rest=GROUPS + " dynamic_batching { }"),
    "default": in_x_config(mbs=4, rest=GROUPS),
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
async def test_two_instances_for_every_scheduler(repo, serve, scheduler):
    write_model(repo, "m", SCHEDULERS[scheduler], GATED)
    s = await serve()
    m = s.model("m")
    assert m.strategy_name == scheduler
    assert len(m.instance_names) == 2
    mod = sys.modules["seqserve_models.m.v1"]
    seq = m.is_sequence

    def req(sid: int, value: int, **kw) -> asyncio.Future:
        if not seq:
            kw = {}
        return asyncio.ensure_future(s.infer("m", x_in(value), sequence_id=sid if seq else 0, **kw))

    # A sequence keeps its slot (no END), so B gets the lowest free slot: the other instance's.
    blocked = req(A, -1, sequence_start=True)
    first = await asyncio.to_thread(mod.ENTERED.get, timeout=5)
    # While one instance is stuck in the model, the other serves a second request.
    other = req(B, 7, sequence_start=True, sequence_end=True)
    out = await asyncio.wait_for(other, 5)
    assert int(out.outputs["OUT_X"][0, 0]) == 7
    assert not blocked.done()
    mod.GATE.set()
    await asyncio.wait_for(blocked, 5)
    instances = [r[0] for r in mod.RECORD]
    assert instances[0] == first and sorted(instances) == [0, 1]
    if seq:
        await asyncio.wait_for(req(A, 1, sequence_end=True), 5)
        assert mod.RECORD[-1][0] == first  # sticky: the sequence stays on its instance


async def test_kind_gpu_without_gpu_is_a_load_error_that_names_the_reason(repo, serve):
    groups = 'instance_group [ { name: "g1" count: 2 kind: KIND_GPU } ]'
    write_model(repo, "m", in_x_config(mbs=4, rest=groups), GATED)
    s = await serve()
    index = {m["name"]: m for m in s.repository_index()}
    assert index["m"]["state"] == "UNAVAILABLE", index
    reason = index["m"]["reason"]
    assert "instance group 'g1' is KIND_GPU" in reason, reason
    assert "--kind-gpu-on-cpu" in reason, reason


async def test_kind_gpu_on_cpu_flag_runs_on_cpu_with_one_warning(repo, serve, caplog):
    groups = (
        'instance_group [ { name: "g1" count: 2 kind: KIND_GPU }, { name: "g2" count: 1 kind: KIND_GPU gpus: [ 0 ] } ]'
    )
    write_model(repo, "m", in_x_config(mbs=4, rest=groups), GATED)
    caplog.set_level(logging.WARNING)
    s = await serve(kind_gpu_on_cpu=True)
    m = s.model("m")
    assert m.instance_names == ["g1_0", "g1_1", "g2_0"]
    mod = sys.modules["seqserve_models.m.v1"]
    mod.GATE.set()
    for v in range(3):
        r = await s.infer("m", x_in(v))
        assert int(r.outputs["OUT_X"][0, 0]) == v
    assert {dev for _i, dev, _x in mod.RECORD} == {"cpu"}
    gpu_warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "KIND_GPU" in r.getMessage()]
    assert len(gpu_warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "'m'" in gpu_warnings[0].getMessage()


async def test_gpus_with_kind_cpu_ignored_with_warning(repo, serve, caplog):
    groups = 'instance_group [ { name: "c" count: 2 kind: KIND_CPU gpus: [ 0, 1 ] } ]'
    write_model(repo, "m", in_x_config(mbs=4, rest=groups), GATED)
    caplog.set_level(logging.WARNING)
    s = await serve()
    assert s.model("m").instance_names == ["c_0", "c_1"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    ignored = [w for w in warnings if "gpus" in w and "ignored" in w]
    assert len(ignored) == 1, warnings
    assert "[0, 1]" in ignored[0]
    mod = sys.modules["seqserve_models.m.v1"]
    mod.GATE.set()
    r = await s.infer("m", x_in(3))
    assert int(r.outputs["OUT_X"][0, 0]) == 3
    assert mod.RECORD[0][1] == "cpu"


# -------------------------------------------------------------------------- brief configs


@pytest.mark.parametrize(
    ("dirname", "name"), [("lstm_from_brief_a", "my_lstm_model"), ("rnn_from_brief_b", "rnn_model")]
)
def test_brief_configs_load_as_given(dirname, name):
    cfg = load_model_config(BRIEF / dirname, name=name)
    assert cfg.name == name
    assert cfg.HasField("sequence_batching")  # brief b: made stateful by its policy


def brief_a_input(value: float) -> dict[str, np.ndarray]:
    x = np.zeros((1, 128), np.float32)
    x[0, 0] = value
    return {"INPUT__0": x}


async def test_brief_a_served_with_python_backend(repo, serve, caplog, monkeypatch):
    python_brief(repo, "lstm_from_brief_a", "my_lstm_model", BRIEF_A_MODEL)
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    m = s.model("my_lstm_model")
    assert m.strategy_name == "reusable_batch"
    assert any("gpus" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)

    async def step(sid, value, **kw):
        return await s.infer("my_lstm_model", brief_a_input(value), sequence_id=sid, **kw)

    tasks = [
        asyncio.ensure_future(step(sid, float(v), sequence_start=True))
        for sid, v in ((1, 1), (2, 10), (3, 100), (4, 1000))
    ]
    out = await asyncio.wait_for(asyncio.gather(*tasks), 5)  # candidate size 4: no 10 ms wait needed
    assert [float(r.outputs["OUTPUT__0"][0, 0]) for r in out] == [1, 10, 100, 1000]
    assert out[0].outputs["OUTPUT__0"].shape == (1, 10)
    rec = sys.modules["seqserve_models.my_lstm_model.v1"].RECORD
    assert rec[0]["size"] == 4 and rec[0]["state_shape"] == (4, 2, 1024)
    sums = {1: 1.0, 2: 10.0, 3: 100.0, 4: 1000.0}
    for k in range(3):
        for sid in (1, 2, 3, 4):
            sums[sid] += sid + k
            r = await step(sid, float(sid + k), sequence_end=k == 2)
            assert float(r.outputs["OUTPUT__0"][0, 0]) == sums[sid]
    # a sequence that starts on a slot another one used begins from zeros
    r = await step(9, 2.5, sequence_start=True, sequence_end=True)
    assert float(r.outputs["OUTPUT__0"][0, 0]) == 2.5
    assert all(all(b["ready"]) for b in rec)


async def test_brief_b_served_with_python_backend(repo, serve, caplog):
    python_brief(repo, "rnn_from_brief_b", "rnn_model", BRIEF_B_MODEL, BRIEF_B_IO)
    caplog.set_level(logging.INFO, logger="seqserve.model")
    s = await serve()
    m = s.model("rnn_model")
    assert m.is_sequence and m.strategy_name == "direct"
    assert m.config.sequence_batching.max_sequence_idle_microseconds == 300_000_000

    async def step(value, **kw):
        r = await s.infer("rnn_model", {"INPUT": np.array([[value]], np.float32)}, **kw)
        return r

    r = await step(1.5)  # no id: generated
    sid = r.parameters["sequence_id"]
    assert float(r.outputs["OUTPUT"][0, 0]) == 1.5
    assert float((await step(2.0, sequence_id=sid)).outputs["OUTPUT"][0, 0]) == 3.5
    for other in (11, "named"):
        assert float((await step(5.0, sequence_id=other, sequence_start=True)).outputs["OUTPUT"][0, 0]) == 5
    assert float((await step(1.0, sequence_id=11, sequence_end=True)).outputs["OUTPUT"][0, 0]) == 6
    assert float((await step(1.0, sequence_id=sid, sequence_end=True)).outputs["OUTPUT"][0, 0]) == 4.5
    assert float((await step(3.0, sequence_id="named", sequence_end=True)).outputs["OUTPUT"][0, 0]) == 8
