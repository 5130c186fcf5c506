"""Checkpoint and restore against the implicit-state buffers (docs/checkpoints.md, docs/behaviour.md
"Implicit state buffers"): sequences move between two Servers for models that hand their next
state back in ``batch.next_state`` (the two stores trade places), that write it in place
(``use_same_buffer_for_input_output``), under Direct and Oldest (in-order views, lazily gathered
rows), and with a variable-shape state, checked against exact running sums.

What these pin down: a restored slot counts as a slot that holds a state (a later swap carries
it over); a checkpoint taken while another sequence's batch runs reads the slot's value, not
what the model scribbled over it as a padding row; a checkpoint taken as soon as a reply is out
sees the state that step wrote, even where it is only written back when the model call ends.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from seqserve.engine import SequenceBusyError, SequenceCheckpoint
from tests.support.checks import wait_until
from tests.support.models import model_module, state_config, write_model

N = 3  # elements per state row
HOLD = 1000  # a real row with this input holds its batch until the test opens GATE


def config(strategy: str, *, same: bool, mbs: int = 8, dims: str = f"[ {N} ]", init_dims: str = f"[ {N} ]") -> str:
    return state_config(
        strategy, same=same, mbs=mbs, dims=dims, init_dims=init_dims, output_dims=f"[ {N} ]", candidates=8
    )


# Adds X to the state. Every mode also scribbles over its padding rows (-1), which must never
# reach a sequence's state nor a checkpoint of it; "inplace*" write the store itself.
MODEL = """
import threading
import time
import numpy as np

MODE = {mode!r}
GATE = threading.Event()
GATE.set()
HELD = threading.Event()


class Model:
    def execute(self, batch):
        s = batch.states["S"]
        x = batch.inputs["X"]
        real = batch.ready.astype(bool)
        if MODE == "fresh":
            new = s + x
        elif MODE == "next":
            new = np.add(s, x, out=batch.next_state("S"))
        else:  # inplace, inplace_noreturn (use_same_buffer_for_input_output)
            new = np.add(s, x, out=s)
        new[~real] = -1
        if (x[real, 0] == {hold}).any():
            HELD.set()
            GATE.wait(30)
        time.sleep(0.0005)  # long enough for other sequences' moves to meet running batches
        out = {{"Y": new.copy()}}
        if MODE != "inplace_noreturn":
            out["S_OUT"] = new
        return out
"""

MODES = [("fresh", False), ("next", False), ("inplace", True), ("inplace_noreturn", True)]
STRATEGIES = ["direct", "oldest"]


def setup(repo, strategy: str, mode: str, same: bool) -> None:
    write_model(repo, "m", config(strategy, same=same), MODEL.format(mode=mode, hold=HOLD))


async def step(s, sid: int, x: int, *, start: bool = False, end: bool = False) -> list[int]:
    r = await s.infer("m", {"X": np.array([[x]], np.int64)}, sequence_id=sid, sequence_start=start, sequence_end=end)
    return r.outputs["Y"].reshape(-1).tolist()


def move(a, b, sid: int) -> SequenceCheckpoint:
    ckpt = a.checkpoint_sequence("m", 1, sid, release=True)
    assert ckpt is not None, f"sequence {sid} is not live"
    b.restore_sequence(SequenceCheckpoint.from_bytes(ckpt.to_bytes()))
    return ckpt


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("mode", "same"), MODES)
async def test_restored_slots_keep_their_state_across_swaps(repo, serve, strategy, mode, same):
    """b runs a sequence of its own in slot 0 and receives three restored ones above it: the
    batches of its own sequence (alone, so the stores trade places) must carry them over."""
    setup(repo, strategy, mode, same)
    a, b = await serve(), await serve()
    assert await step(b, 100, 7, start=True) == [7] * N
    sums = {}
    for sid in (1, 2, 3):
        sums[sid] = 0
        for k in range(3):
            sums[sid] += sid * 10 + k
            assert await step(a, sid, sid * 10 + k, start=k == 0) == [sums[sid]] * N
    for sid in (1, 2, 3):
        assert move(a, b, sid).states["S"].tolist() == [sums[sid]] * N
    own = 7
    for _ in range(3):  # slot 0 alone, three times: each batch's next state lands in the other store
        own += 1
        assert await step(b, 100, 1) == [own] * N
    for sid in (3, 1, 2):
        sums[sid] += 1
        assert await step(b, sid, 1) == [sums[sid]] * N, f"sequence {sid}"
    for sid in (1, 2, 3):  # and back, through a's swapped stores
        move(b, a, sid)
        sums[sid] += 2
        assert await step(a, sid, 2, end=True) == [sums[sid]] * N, f"sequence {sid}"


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("mode", "same"), MODES)
async def test_checkpoint_while_another_batch_runs(repo, serve, strategy, mode, same):
    """Sequence 1 (slot 0) is idle while the batch of sequence 2 (slot 1) runs and has
    scribbled over every row but its own: a checkpoint of 1 then has 1's value."""
    setup(repo, strategy, mode, same)
    a = await serve()
    mod = model_module("m")  # a's (b imports its own copy)
    b = await serve()
    assert await step(a, 1, 5, start=True) == [5] * N
    assert await step(a, 2, 1, start=True) == [1] * N
    mod.GATE.clear()
    mod.HELD.clear()
    held = asyncio.ensure_future(step(a, 2, HOLD))
    try:
        await asyncio.to_thread(mod.HELD.wait, 10)
        assert mod.HELD.is_set()
        with pytest.raises(SequenceBusyError):
            a.checkpoint_sequence("m", 1, 2, release=True)
        ckpt = move(a, b, 1)
        assert ckpt.states["S"].tolist() == [5] * N
    finally:
        mod.GATE.set()
    assert await asyncio.wait_for(held, 10) == [HOLD + 1] * N
    assert await step(b, 1, 1) == [6] * N
    assert await step(a, 2, 1, end=True) == [HOLD + 2] * N
    assert await step(b, 1, 1, end=True) == [7] * N


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("mode", "same"), MODES)
async def test_sequences_move_back_and_forth_under_load(repo, serve, strategy, mode, same):
    """Eight sequences step concurrently on two servers; after random steps a sequence moves to
    the other server (while the others' batches run there and here). Every reply is the exact
    running sum, and every checkpoint holds it."""
    setup(repo, strategy, mode, same)
    servers = [await serve(), await serve()]
    rng = random.Random(f"{strategy}-{mode}")
    moves = 0

    async def sequence(sid: int) -> None:
        nonlocal moves
        where = sid % 2
        total = 0
        steps = 24
        for k in range(steps):
            x = rng.randint(-50, 50)
            total += x
            got = await step(servers[where], sid, x, start=k == 0, end=k == steps - 1)
            assert got == [total] * N, f"sequence {sid} step {k} on server {where}"
            if k < steps - 1 and rng.random() < 0.4:
                ckpt = move(servers[where], servers[1 - where], sid)
                assert ckpt.states["S"].tolist() == [total] * N, f"checkpoint of {sid} after step {k}"
                where = 1 - where
                moves += 1
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.002)

    await asyncio.gather(*(sequence(sid) for sid in range(1, 9)))
    assert moves > 20
    for s in servers:
        m = s.model("m")
        await wait_until(lambda m=m: m.scheduler_state()["free_slots"] == 8, "every slot free again")


# A variable-shape state: every input so far (grown by one per step); Y is their sum.
VAR_MODEL = """
import time
import numpy as np


class Model:
    def execute(self, batch):
        new = np.concatenate([batch.states["S"], batch.inputs["X"]], axis=1)
        time.sleep(0.0005)
        return {"Y": np.repeat(new.sum(axis=1, keepdims=True), 3, axis=1), "S_OUT": new}
"""


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_variable_shape_sequences_move_under_load(repo, serve, strategy):
    """As above for a variable-shape state (kept per slot, gathered per batch, batched by
    shape): the checkpoint holds every input so far, in order."""
    write_model(repo, "m", config(strategy, same=False, dims="[ -1 ]", init_dims="[ 1 ]"), VAR_MODEL)
    servers = [await serve(), await serve()]
    rng = random.Random(strategy)
    moves = 0

    async def sequence(sid: int) -> None:
        nonlocal moves
        where = sid % 2
        seen = [0]  # the initial state
        for k in range(16):
            x = rng.randint(-50, 50)
            seen.append(x)
            got = await step(servers[where], sid, x, start=k == 0, end=k == 15)
            assert got == [sum(seen)] * N, f"sequence {sid} step {k} on server {where}"
            if k < 15 and rng.random() < 0.4:
                ckpt = move(servers[where], servers[1 - where], sid)
                assert ckpt.states["S"].tolist() == seen, f"checkpoint of {sid} after step {k}"
                where = 1 - where
                moves += 1
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.002)

    await asyncio.gather(*(sequence(sid) for sid in range(1, 9)))
    assert moves > 10
