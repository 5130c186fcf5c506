"""Checkpoint and restore of live sequences (docs/checkpoints.md): a sequence checkpointed and
released on one server continues on another exactly where it stood, for Direct and Oldest
batching, fixed, variable-shape and BYTES state; the refusals of both calls; what a release
leaves behind (a free slot, the START error, the counters). Timing-dependent cases (busy,
staged restores, idle expiry) are in test_checkpoint_timing.py."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from seqserve.engine import (
    CheckpointUnsupportedError,
    Code,
    InferenceError,
    SequenceBusyError,
    SequenceCheckpoint,
    SequenceReleasedError,
)
from tests.support.checkpoint_model import ACC, HIST, MODEL, STR_CORRID, U64_CORRID, WORDS, call, config, counters
from tests.support.checks import expect_error, start_error, wait_until
from tests.support.models import copy_demo_models, in_x_config, model_module, write_model

# No implicit state: the model keys its sums by CORRID itself.
OWN_STATE_MODEL = """
import numpy as np
SUMS = {}

class Model:
    def execute(self, batch):
        out = np.zeros((batch.size, 1), np.int32)
        for row in np.flatnonzero(batch.ready):
            cid = batch.corrid[row].item()
            SUMS[cid] = (0 if batch.start[row] else SUMS[cid]) + int(batch.inputs["IN_X"][row, 0])
            out[row, 0] = SUMS[cid]
        return {"OUT_X": out}
"""


def move(a, b, model: str, version: int, seq_id: object) -> SequenceCheckpoint:
    """Checkpoint and release on a, through the binary format, restore on b."""
    ckpt = a.checkpoint_sequence(model, version, seq_id, release=True)
    assert ckpt is not None
    back = SequenceCheckpoint.from_bytes(ckpt.to_bytes())
    b.restore_sequence(back)
    return back


# ------------------------------------------------------------------------------ moves


async def test_demo_accumulator_moves_between_servers(repo, serve):
    copy_demo_models(repo, "accumulator")
    a, b = await serve(), await serve()

    async def step(s, sid, v, **kw):
        r = await s.infer("accumulator", {"INPUT": np.array([[v]], np.float32)}, sequence_id=sid, **kw)
        return float(r.outputs["OUTPUT"][0, 0])

    expected = {7: 0.0, "seven": 0.0}
    for sid in expected:
        for k in range(1, 6):
            expected[sid] += k * 0.5
            assert await step(a, sid, k * 0.5, sequence_start=(k == 1)) == expected[sid]
    for sid in expected:
        ckpt = move(a, b, "accumulator", 1, sid)
        assert ckpt.steps == 5 and ckpt.session is False and type(ckpt.sequence_id) is type(sid)
        assert ckpt.states["SUM_IN"].tolist() == [expected[sid]]
    assert a.live_sequences() == [] and {x[2] for x in b.live_sequences()} == {7, "seven"}
    for sid in expected:  # the request after the move continues on b, exactly
        assert await step(b, sid, 10.0) == expected[sid] + 10.0
        assert await step(b, sid, 1.0, sequence_end=True) == expected[sid] + 11.0
        # a: released, so refused as an unknown sequence (nothing started on fresh state)
        err = await expect_error(step(a, sid, 1.0), Code.INVALID_ARG, start_error(sid, "accumulator"))
        assert isinstance(err, SequenceReleasedError)
    assert counters(a, "accumulator") == (2, 0, 0, 2, 0)  # released: neither ended nor expired
    assert counters(b, "accumulator") == (0, 2, 0, 0, 2)
    assert a.model("accumulator").scheduler_state()["free_slots"] == 16


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
@pytest.mark.parametrize("state", [ACC, HIST, WORDS], ids=["fixed", "variable", "bytes"])
async def test_sequence_continues_on_another_server(repo, serve, strategy, state):
    corrid = STR_CORRID if state is WORDS else U64_CORRID
    write_model(repo, "m", config(strategy=strategy, state=state, corrid=corrid), MODEL)
    a, b = await serve(), await serve()
    ids = ["s1", "s2", "s3"] if state is WORDS else [11, 12, 13]
    sums = dict.fromkeys(ids, 0)
    for k in range(1, 4):  # three sequences, interleaved, three steps each
        for n, sid in enumerate(ids):
            sums[sid] += k * (n + 1)
            assert await call(a, sid, k * (n + 1), start=(k == 1)) == sums[sid]
    ckpt = move(a, b, "m", 1, ids[1])
    assert ckpt.steps == 3
    if state is ACC:
        assert ckpt.states["ACC"].tolist() == [sums[ids[1]], 3]
    elif state is HIST:
        assert ckpt.states["HIST"].tolist() == [0, 2, 4, 6]  # its own length: 1 + 3 steps
    else:
        assert ckpt.states["WORDS"].tolist() == [b"", b"2", b"4", b"6"]
    # the others go on on a, the moved one on b; b also runs a sequence of its own
    assert await call(b, ids[1], 100) == sums[ids[1]] + 100
    assert await call(b, ids[0], 5, start=True) == 5  # b's own sequence of that id
    assert await call(a, ids[0], 1) == sums[ids[0]] + 1
    assert await call(a, ids[2], 1, end=True) == sums[ids[2]] + 1
    assert await call(b, ids[1], 1, end=True) == sums[ids[1]] + 101
    assert counters(a) == (3, 1, 0, 1, 0)
    assert counters(b) == (1, 1, 0, 0, 1)


async def test_restored_step_sees_start_0_ready_1_and_its_corrid(repo, serve):
    write_model(repo, "m", config(), MODEL)
    a = await serve()
    assert await call(a, 5, 1, start=True) == 1
    ckpt = a.checkpoint_sequence("m", 1, 5, release=True)
    b = await serve()  # loaded last: its module is the one model_module finds
    b.restore_sequence(ckpt)
    assert await call(b, 5, 2) == 3
    assert model_module("m").SEEN == [(5, 0, 1)]


async def test_checkpoint_without_release_leaves_the_sequence_running(repo, serve):
    write_model(repo, "m", config(), MODEL)
    a, b = await serve(), await serve()
    assert await call(a, 1, 3, start=True) == 3
    snap = a.checkpoint_sequence("m", "1", 1, release=False)
    assert snap is not None and snap.states["ACC"].tolist() == [3, 1]
    assert await call(a, 1, 4) == 7  # still live on a
    b.restore_sequence(snap)  # a copy: both go on from the snapshot, independently
    assert await call(b, 1, 10) == 13
    assert counters(a)[3:] == (0, 0)
    assert a.model("m").sequence(1).steps == 2


async def test_restore_then_start_resets_and_checkpoint_before_any_step(repo, serve):
    write_model(repo, "m", config(), MODEL)
    a, b = await serve(), await serve()
    assert await call(a, 1, 3, start=True) == 3
    ckpt = move(a, b, "m", 1, 1)
    # checkpointed again before any step on b: the same value; and moved back to a
    again = b.checkpoint_sequence("m", 1, 1, release=True)
    assert again is not None and again.states["ACC"].tolist() == [3, 1] and again.steps == ckpt.steps
    a.restore_sequence(again)
    assert await call(a, 1, 1) == 4
    assert await call(a, 1, 5, start=True) == 5  # a START on a restored id starts afresh


async def test_session_moves_and_is_not_restarted_where_it_was_released(repo, serve):
    write_model(repo, "m", config(corrid=STR_CORRID), MODEL)
    a, b = await serve(), await serve()
    assert await call(a, "sess", 2, session=True) == 2  # START implied
    ckpt = move(a, b, "m", 1, "sess")
    assert ckpt.session is True
    # on a, the session's next request must not start it again on fresh state
    err = await expect_error(call(a, "sess", 1, session=True), Code.INVALID_ARG, start_error("sess"))
    assert isinstance(err, SequenceReleasedError)
    not_live = await expect_error(_async(a.sequence, "m", "sess"), Code.NOT_FOUND)
    assert "released" in str(not_live)
    assert await call(b, "sess", 3, session=True) == 5
    assert await call(b, "sess", 1, session=True, end=True) == 6
    # b remembers the session's end, as for any session
    await expect_error(call(b, "sess", 1, session=True), Code.NOT_FOUND)
    # an explicit START on a begins a new sequence there
    assert await call(a, "sess", 7, start=True) == 7


async def _async(fn, *args):
    return fn(*args)


# ------------------------------------------------------------------------ release


async def test_release_frees_the_slot_for_a_backlogged_sequence(repo, serve):
    write_model(repo, "m", config(mbs=1), MODEL)  # one slot
    a, b = await serve(), await serve()
    assert await call(a, 1, 1, start=True) == 1
    waiting = asyncio.ensure_future(call(a, 2, 40, start=True))
    await asyncio.sleep(0)
    m = a.model("m")
    await wait_until(lambda: m.scheduler_state()["backlog_sequences"] == 1, "sequence 2 is backlogged")
    with pytest.raises(SequenceBusyError):  # backlogged: its requests are here, not movable
        a.checkpoint_sequence("m", 1, 2, release=True)
    move(a, b, "m", 1, 1)
    assert await asyncio.wait_for(waiting, 10) == 40  # got the slot at once
    assert await call(b, 1, 1) == 2
    assert counters(a) == (2, 0, 0, 1, 0)


async def test_unknown_ended_and_released_sequences_are_not_live(repo, serve):
    write_model(repo, "m", config(), MODEL)
    a = await serve()
    assert a.checkpoint_sequence("m", 1, 99, release=True) is None
    await call(a, 1, 1, start=True)
    await call(a, 1, 1, end=True)
    assert a.checkpoint_sequence("m", 1, 1, release=False) is None
    await call(a, 2, 1, start=True)
    assert a.checkpoint_sequence("m", 1, 2, release=True) is not None
    assert a.checkpoint_sequence("m", 1, 2, release=True) is None
    assert counters(a)[3] == 1


# ------------------------------------------------------------------------ refusals


async def test_restore_refusals(repo, serve):
    write_model(repo, "m", config(mbs=2), MODEL)  # two slots
    a, b = await serve(), await serve()
    for sid in (1, 2, 3):
        await call(a, sid, sid, start=True) if sid < 3 else await call(b, sid, 1, start=True)
    ckpt = a.checkpoint_sequence("m", 1, 1, release=False)
    assert ckpt is not None
    # live here already
    await expect_error(_async(a.restore_sequence, ckpt), Code.ALREADY_EXISTS)
    # no free slot (a holds 1 and 2): refused at once, never backlogged
    await call(b, 4, 1, start=True)
    err = await expect_error(_async(b.restore_sequence, dataclasses.replace(ckpt, sequence_id=5)), Code.UNAVAILABLE)
    assert err.retry_after_s is not None and "no sequence slot" in str(err)
    await call(b, 4, 1, end=True)
    free = b.model("m").scheduler_state()["free_slots"]
    bad = {
        "model": dataclasses.replace(ckpt, model="other"),
        "version": dataclasses.replace(ckpt, version=2),
        "names": dataclasses.replace(ckpt, states={"NOPE": ckpt.states["ACC"]}),
        "extra": dataclasses.replace(ckpt, states={**ckpt.states, "X": ckpt.states["ACC"]}),
        "dtype": dataclasses.replace(ckpt, states={"ACC": ckpt.states["ACC"].astype(np.int64)}),
        "shape": dataclasses.replace(ckpt, states={"ACC": np.zeros(3, np.int32)}),
        "rank": dataclasses.replace(ckpt, states={"ACC": np.zeros((2, 1), np.int32)}),
        "id": dataclasses.replace(ckpt, sequence_id=0),
        "string id": dataclasses.replace(ckpt, sequence_id="s"),  # the model's CORRID is UINT64
        "steps": dataclasses.replace(ckpt, steps=-1),
    }
    for what, c in bad.items():
        if what == "model":
            await expect_error(_async(b.restore_sequence, c), Code.NOT_FOUND)  # no such model here
            await expect_error(_async(b.model("m").restore_sequence, c), Code.INVALID_ARG)
        elif what == "version":
            await expect_error(_async(b.restore_sequence, c), Code.NOT_FOUND)
        else:
            err = await expect_error(_async(b.restore_sequence, c), Code.INVALID_ARG)
            assert ("ACC" if what in ("names", "extra", "dtype", "shape", "rank") else "") in str(err), (what, err)
    assert b.model("m").scheduler_state()["free_slots"] == free  # nothing claimed
    assert counters(b)[4] == 0


async def test_variable_shape_restore_refusals(repo, serve):
    write_model(repo, "m", config(state=HIST), MODEL)
    a = await serve()
    good = SequenceCheckpoint("m", 1, 9, 3, False, {"HIST": np.array([0, 1, 2, 3], np.int32)})
    for bad in ({"HIST": np.zeros((2, 2), np.int32)}, {"HIST": np.zeros(4, np.float32)}):
        await expect_error(_async(a.restore_sequence, dataclasses.replace(good, states=bad)), Code.INVALID_ARG)
    a.restore_sequence(good)
    assert await call(a, 9, 4) == 10
    empty = dataclasses.replace(good, sequence_id=10, states={"HIST": np.zeros(0, np.int32)})
    a.restore_sequence(empty)  # a variable dim may be 0
    assert await call(a, 10, 4) == 4


async def test_models_that_keep_their_own_state_refuse(repo, serve):
    write_model(repo, "own", config(state="").replace('name: "m"', 'name: "own"'), OWN_STATE_MODEL)
    write_model(
        repo,
        "stateless",
        in_x_config(name="stateless"),
    )
    a = await serve()
    await a.infer("own", {"IN_X": np.array([[1]], np.int32)}, sequence_id=1, sequence_start=True)
    assert [x[:3] for x in a.live_sequences()] == [("own", 1, 1)]
    with pytest.raises(CheckpointUnsupportedError, match="keeps its sequences' state itself") as ei:
        a.checkpoint_sequence("own", 1, 1, release=True)
    assert ei.value.code == Code.UNSUPPORTED
    assert a.model("own").sequence(1).steps == 1  # still there, untouched
    with pytest.raises(CheckpointUnsupportedError):
        a.restore_sequence(SequenceCheckpoint("own", 1, 77, 1, False, {}))
    for call_ in (
        lambda: a.checkpoint_sequence("stateless", 1, 1, release=True),
        lambda: a.restore_sequence(SequenceCheckpoint("stateless", 1, 1, 1, False, {})),
    ):
        with pytest.raises(InferenceError, match="not a sequence model") as ei:
            call_()
        assert ei.value.code == Code.INVALID_ARG


async def test_restore_refused_once_the_server_drains(repo, serve):
    write_model(repo, "m", config(), MODEL)
    a = await serve()
    await call(a, 1, 1, start=True)
    ckpt = a.checkpoint_sequence("m", 1, 1, release=True)
    a.model("m").stop_accepting()
    await expect_error(_async(a.restore_sequence, ckpt), Code.UNAVAILABLE)
