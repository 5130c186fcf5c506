"""Implicit-state buffers (docs/behaviour.md, "Implicit state buffers"): the next-state buffer
(``batch.next_state``), ``use_same_buffer_for_input_output`` and Oldest's in-place / lazily
gathered state, against a running-sum oracle.

The workload mixes everything that could misplace a state update: more sequences than slots
(backlog, slot reuse), random lengths, restarts (a second START on a live sequence), random
pauses (Direct padding rows; Oldest batches in and out of slot order), for Direct and Oldest
and every way a model can hand its state back.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError
from tests.support.models import write_model
from tests.support.state_model import MODEL, MODES, N, config, drive, step


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
@pytest.mark.parametrize(("mode", "same"), MODES)
async def test_running_sums_over_mixed_batches(repo, serve, strategy, mode, same):
    write_model(repo, "m", config(strategy, same=same), MODEL.format(mode=mode))
    s = await serve()
    for seed in range(3):
        await drive(s, seed)
    if strategy == "direct":  # holes in the batches: padding rows were written by the model
        stats = s.statistics("m")[0]
        assert stats.execution_count > 0 and stats.inference_count > 0


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
@pytest.mark.parametrize(
    ("mode", "same", "kept"), [("fresh", False, False), ("next", False, False), ("inplace", True, True)]
)
async def test_failed_batch_after_writing_the_state(repo, serve, strategy, mode, same, kept):
    # Separate input and output buffers (the default): a failed batch updates nothing. One
    # buffer (use_same_buffer_for_input_output, as in Triton): what the model wrote before it
    # failed is the state. Either way the padding rows of the failed batch (Direct: sequence 1's
    # slot 0, idle in the batch of sequence 2's slot 1) are left as they were.
    write_model(repo, "m", config(strategy, same=same), MODEL.format(mode=mode))
    s = await serve()
    await step(s, 1, 3, start=True)
    await step(s, 2, 5, start=True)
    with pytest.raises(InferenceError) as ei:
        await step(s, 2, -1000)
    assert ei.value.code == Code.INTERNAL
    assert await step(s, 2, 1, end=True) == [[(5 - 1000 if kept else 5) + 1] * N]
    assert await step(s, 1, 1, end=True) == [[4] * N]


@pytest.mark.parametrize("mode", ["fresh", "next", "inplace", "inplace_noreturn", "never_read"])
async def test_oldest_batches_out_of_slot_order(repo, serve, monkeypatch, mode):
    # 3 slots, batches of 2 (as in test_oldest): the second batch holds C (slot 2) in row 0 and
    # A (slot 0) in row 1, so its state is gathered; the others are in slot order (in place).
    model = MODEL.format(mode=mode)
    if mode == "never_read":  # returns a next state without reading the current one
        model = """
import numpy as np

class Model:
    def execute(self, batch):
        y = np.repeat(batch.inputs["X"] * 2, 5, axis=1)
        return {"Y": y, "S_OUT": y}
"""
    write_model(
        repo,
        "m",
        config("oldest", same=mode.startswith("inplace"), mbs=2).replace(
            "max_candidate_sequences: 4", "max_candidate_sequences: 3"
        ),
        model,
    )
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "7")
    s = await serve()
    A, B, C = 101, 102, 103

    async def send(sid: int, x: int, **flags: bool) -> asyncio.Future:
        task = asyncio.ensure_future(
            s.infer(
                "m",
                {"X": np.array([[x]], np.int64)},
                sequence_id=sid,
                sequence_start=flags.get("start", False),
                sequence_end=flags.get("end", False),
            )
        )
        await asyncio.sleep(0)  # the task runs up to its submit
        return task

    tasks = [await send(A, 1, start=True), await send(B, 10, start=True), await send(C, 100, start=True)]
    tasks += [await send(A, 2), await send(B, 20, end=True), await send(C, 200, end=True), await send(A, 3, end=True)]
    got = [r.outputs["Y"][0, 0] for r in await asyncio.wait_for(asyncio.gather(*tasks), 10)]
    want = [2, 20, 200, 4, 40, 400, 6] if mode == "never_read" else [1, 10, 100, 3, 30, 300, 6]
    assert got == want


async def test_written_next_state_not_returned_is_discarded(repo, serve):
    model = """
import numpy as np

class Model:
    def execute(self, batch):
        nxt = batch.next_state("S")
        nxt[...] = 1000  # not returned: not the next state
        return {"Y": batch.states["S"] + batch.inputs["X"]}
"""
    write_model(repo, "m", config("direct"), model)
    s = await serve()
    for k in range(3):
        r = await s.infer("m", {"X": np.array([[1]], np.int64)}, sequence_id=1, sequence_start=k == 0)
        assert r.outputs["Y"].tolist() == [[1] * N]


async def test_states_are_read_only_without_same_buffer(repo, serve):
    model = """
class Model:
    def execute(self, batch):
        batch.states["S"][...] = 5
        return {"Y": batch.states["S"]}
"""
    write_model(repo, "m", config("direct"), model)
    s = await serve()
    with pytest.raises(InferenceError, match="read-only"):
        await s.infer("m", {"X": np.array([[1]], np.int64)}, sequence_id=1, sequence_start=True)


@pytest.mark.parametrize("strategy", ["direct", "oldest"])
async def test_variable_shape_state_next_state_and_growth(repo, serve, strategy):
    # Variable-shape states take the copy path: next_state gives a new array of the input's
    # shape, and a model may return another shape (the state grows by one element a step).
    model = """
import numpy as np

class Model:
    def execute(self, batch):
        s, x = batch.states["S"], batch.inputs["X"]
        if s.shape[1] % 2:
            new = np.concatenate([s + x, np.zeros((s.shape[0], 1), np.int64)], axis=1)
        else:
            new = np.add(s, x, out=batch.next_state("S"))
            new = np.concatenate([new, np.zeros((s.shape[0], 1), np.int64)], axis=1)
        return {"Y": new, "S_OUT": new}
"""
    write_model(repo, "m", config(strategy, dims="[ -1 ]"), model)
    s = await serve()
    for sid in (1, 2):
        total = 0
        for k in range(4):
            r = await s.infer("m", {"X": np.array([[sid + k]], np.int64)}, sequence_id=sid, sequence_start=k == 0)
            total += sid + k
            y = r.outputs["Y"][0]
            assert y.shape == (3 + k,)
            # element i was added to from the step it appeared at
            assert y[0] == total and y[-1] == 0


async def test_next_state_of_an_unknown_name(repo, serve):
    model = """
class Model:
    def execute(self, batch):
        batch.next_state("S_OUT")
"""
    write_model(repo, "m", config("direct"), model)
    s = await serve()
    with pytest.raises(InferenceError, match="not an implicit state"):
        await s.infer("m", {"X": np.array([[1]], np.int64)}, sequence_id=1, sequence_start=True)


async def test_unbatched_model_in_place(repo, serve):
    write_model(repo, "m", config("direct", mbs=0, same=True), MODEL.format(mode="inplace").replace("[:, 0]", "[0]"))
    s = await serve()
    total = 0
    for k, x in enumerate([5, -2, 8]):
        r = await s.infer("m", {"X": np.array([x], np.int64)}, sequence_id=3, sequence_start=k == 0)
        total += x
        assert r.outputs["Y"].tolist() == [total] * N


@pytest.mark.parametrize(("mode", "same"), [("next", False), ("inplace", True)])
async def test_oldest_more_slots_than_rows(repo, serve, mode, same):
    # 16 candidate sequences, batches of 4: a returned next-state buffer is committed by copying
    # its rows (the store holds more sequences than the batch updates) or, at small counts, by
    # trading the stores; either way the 12 idle slots keep their state.
    cfg = config("oldest", same=same).replace("max_candidate_sequences: 4", "max_candidate_sequences: 16")
    write_model(repo, "m", cfg, MODEL.format(mode=mode))
    s = await serve()
    for seed in range(3):
        await drive(s, 100 + seed, nseq=14)
