"""Checkpoints against a running scheduler: a sequence is busy while a request of it is queued
or running and movable as soon as its reply is out; a restore into an instance that is running
a batch waits for that batch (even when the batch is the END step of the slot's previous
sequence); the idle clock of a restored sequence starts at the restore.

The model holds a batch that has a negative input until the test opens its GATE (the step
still adds |x|), so a test can keep a step running while it checkpoints or restores."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from seqserve.engine import Code, SequenceBusyError, SequenceCheckpoint
from tests.support.checkpoint_model import HIST, call, config, counters
from tests.support.checks import expect_error, wait_reaped, wait_until
from tests.support.models import model_module, write_model

GATED = """
import threading
import numpy as np
GATE = threading.Event()
GATE.set()
HELD = threading.Event()
FINAL = []  # (corrid, state) of every END row

class Model:
    def execute(self, batch):
        x = batch.inputs["IN_X"][:, 0]
        ready = batch.ready.astype(bool)
        if (x[ready] < 0).any():
            HELD.set()
            GATE.wait(30)
        for row in np.flatnonzero(ready & batch.end.astype(bool)):
            FINAL.append((batch.corrid[row].item(), batch.states[next(iter(batch.states))][row].tolist()))
        x = np.abs(x)
        if "ACC" in batch.states:
            new = batch.states["ACC"] + np.stack([x, np.ones_like(x)], axis=1)
            return {"OUT_X": new[:, :1].copy(), "ACC_OUT": new}
        new = np.concatenate([batch.states["HIST"], x[:, None]], axis=1)
        return {"OUT_X": new.sum(axis=1, keepdims=True).astype(np.int32), "HIST_OUT": new}
"""


class Gate:
    """The loaded model's gate: `hold()` closes it, `held()` waits until a batch waits on it."""

    def __init__(self) -> None:
        self.mod = model_module("m")

    def hold(self) -> None:
        self.mod.HELD.clear()
        self.mod.GATE.clear()

    async def held(self) -> None:
        await wait_until(self.mod.HELD.is_set, "a batch waits on the gate")

    def open(self) -> None:
        self.mod.GATE.set()


async def send(s, seq_id, value, **kw) -> asyncio.Future:
    task = asyncio.ensure_future(call(s, seq_id, value, **kw))
    await asyncio.sleep(0)
    return task


# ------------------------------------------------------------------------------ busy


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_busy_while_a_step_runs_or_waits(repo, serve, strategy):
    write_model(repo, "m", config(strategy=strategy), GATED)
    s = await serve()
    gate = Gate()
    assert await call(s, 1, 1, start=True) == 1
    assert await call(s, 2, 5, start=True) == 5
    gate.hold()
    try:
        running = await send(s, 1, -2)  # held in execute
        await gate.held()
        with pytest.raises(SequenceBusyError, match="has a request queued or running") as ei:
            s.checkpoint_sequence("m", 1, 1, release=True)
        assert ei.value.code == Code.UNAVAILABLE and ei.value.retry_after_s
        queued = await send(s, 1, 4)  # behind it
        with pytest.raises(SequenceBusyError):
            s.checkpoint_sequence("m", 1, 1, release=False)
        # another sequence of the same instance is idle: movable while the batch runs
        other = s.checkpoint_sequence("m", 1, 2, release=False)
        assert other is not None and other.states["ACC"].tolist() == [5, 1]
    finally:
        gate.open()
    assert await asyncio.wait_for(running, 10) == 3
    assert await asyncio.wait_for(queued, 10) == 7
    ckpt = s.checkpoint_sequence("m", 1, 1, release=True)
    assert ckpt is not None and ckpt.steps == 3 and ckpt.states["ACC"].tolist() == [7, 3]
    assert counters(s)[3] == 1


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_movable_as_soon_as_the_reply_is_out(repo, serve, strategy):
    """No retry needed after a reply: the executor may still be tidying up its batch, but the
    step's state is written once its reply is sent."""
    write_model(repo, "m", config(strategy=strategy), GATED)
    a, b = await serve(), await serve()
    total = 0
    for k in range(1, 41):
        src, dst = (a, b) if k % 2 else (b, a)
        total += k
        assert await call(src, 1, k, start=(k == 1)) == total
        ckpt = src.checkpoint_sequence("m", 1, 1, release=True)  # never SequenceBusyError here
        assert ckpt is not None and ckpt.steps == k, k
        dst.restore_sequence(ckpt)
    assert await call(a, 1, 0, end=True) == total  # k = 40 moved it to a


# --------------------------------------------------------------- restores while running


async def test_restore_into_a_running_instance_waits_for_its_batch(repo, serve):
    write_model(repo, "m", config(state=HIST), GATED)
    s = await serve()
    gate = Gate()
    assert await call(s, 1, 1, start=True) == 1
    gate.hold()
    try:
        running = await send(s, 1, -2)
        await gate.held()
        # slot 1 is in the running batch as a padding row: the value waits for the batch
        s.restore_sequence(SequenceCheckpoint("m", 1, 2, 2, False, {"HIST": np.array([0, 10, 20], np.int32)}))
        assert s.model("m").sequence_slot(2) == 1
        again = s.checkpoint_sequence("m", 1, 2, release=False)  # the staged value, before it is written
        assert again is not None and again.states["HIST"].tolist() == [0, 10, 20]
        waiting = await send(s, 2, 5)
    finally:
        gate.open()
    assert await asyncio.wait_for(running, 10) == 3
    assert await asyncio.wait_for(waiting, 10) == 35
    assert await call(s, 2, 1) == 36


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_restore_into_the_slot_of_an_end_still_running(repo, serve, strategy):
    """Direct frees a slot when its END is batched, so a restore may take it while that END
    runs; the END's state write must not land on the restored sequence."""
    write_model(repo, "m", config(strategy=strategy), GATED)
    s = await serve()
    gate = Gate()
    assert await call(s, 1, 1, start=True) == 1
    gate.hold()
    try:
        ending = await send(s, 1, -100, end=True)  # held in execute, slot 0 already free (Direct)
        await gate.held()
        ckpt = SequenceCheckpoint("m", 1, 2, 4, False, {"ACC": np.array([50, 4], np.int32)})
        if strategy == "oldest":
            # Oldest keeps the slot in flight until its END has run: the restore takes another
            s.restore_sequence(ckpt)
            assert s.model("m").sequence_slot(2) == 1
        else:
            s.restore_sequence(ckpt)
            assert s.model("m").sequence_slot(2) == 0  # the END's slot
        waiting = await send(s, 2, 1)
    finally:
        gate.open()
    assert await asyncio.wait_for(ending, 10) == 101
    assert await asyncio.wait_for(waiting, 10) == 51
    final = s.checkpoint_sequence("m", 1, 2, release=True)
    assert final is not None and final.states["ACC"].tolist() == [51, 5]


async def test_no_slot_while_the_only_free_one_waits_for_its_end_oldest(repo, serve):
    write_model(repo, "m", config(strategy="oldest", mbs=1), GATED)  # one slot
    s = await serve()
    gate = Gate()
    assert await call(s, 1, 1, start=True) == 1
    gate.hold()
    try:
        ending = await send(s, 1, -1, end=True)
        await gate.held()
        ckpt = SequenceCheckpoint("m", 1, 2, 1, False, {"ACC": np.array([7, 1], np.int32)})
        err = await expect_error(_restore(s, ckpt), Code.UNAVAILABLE)
        assert err.retry_after_s is not None
    finally:
        gate.open()
    assert await asyncio.wait_for(ending, 10) == 2
    await wait_until(lambda: s.model("m").scheduler_state()["free_slots"] == 1, "the slot is free")
    s.restore_sequence(ckpt)
    assert await call(s, 2, 1) == 8


async def _restore(s, ckpt) -> None:
    s.restore_sequence(ckpt)


# -------------------------------------------------------------------------- idle clock


async def test_idle_clock_starts_at_the_restore(repo, serve):
    write_model(repo, "m", config(seq="max_sequence_idle_microseconds: 200000"), GATED)
    a, b = await serve(), await serve()
    await call(a, 1, 1, start=True)
    ckpt = a.checkpoint_sequence("m", 1, 1, release=True)
    await asyncio.sleep(0.3)  # longer than the idle limit: the checkpoint's age does not count
    b.restore_sequence(ckpt)
    assert b.model("m").sequence(1).idle_s < 0.2
    assert await call(b, 1, 2) == 3
    b.restore_sequence(SequenceCheckpoint("m", 1, 2, 1, True, {"ACC": np.array([9, 1], np.int32)}))
    await wait_reaped(b, 1)
    await wait_reaped(b, 2)
    assert counters(b)[2] == 2  # expired
    # the restored session is remembered as expired, as any session
    await expect_error(call(b, 2, 1, session=True), Code.NOT_FOUND)


async def test_timeout_complete_final_step_sees_the_restored_state(repo, serve):
    seq = "max_sequence_idle_microseconds: 150000 timeout_action: TIMEOUT_COMPLETE"
    write_model(repo, "m", config(seq=seq), GATED)
    s = await serve()
    s.restore_sequence(SequenceCheckpoint("m", 1, 3, 6, False, {"ACC": np.array([21, 6], np.int32)}))
    await wait_reaped(s, 3)
    await wait_until(lambda: model_module("m").FINAL, "the final END step ran")
    assert model_module("m").FINAL == [(3, [21, 6])]


# ------------------------------------------------------------------------------- drain


async def test_a_drain_ends_once_its_sequences_are_released(repo, serve):
    """What drain handoff relies on: during the drain a sequence can still be checkpointed and
    released, and the drain then has nothing left to wait for; restores are refused."""
    write_model(repo, "m", config(), GATED)
    s = await serve(exit_timeout_s=30)
    assert await call(s, 1, 4, start=True) == 4
    s.begin_shutdown()
    done = asyncio.ensure_future(s.shutdown())
    await asyncio.sleep(0.2)
    assert not done.done()  # waiting for sequence 1's END
    assert await call(s, 1, 1) == 5  # a live sequence still runs its steps during the drain
    ckpt = s.checkpoint_sequence("m", 1, 1, release=True)
    assert ckpt is not None and ckpt.states["ACC"].tolist() == [5, 2]
    await expect_error(_restore(s, ckpt), Code.UNAVAILABLE)
    t0 = asyncio.get_running_loop().time()
    await asyncio.wait_for(done, 10)
    assert asyncio.get_running_loop().time() - t0 < 5  # not the 30 s exit timeout
