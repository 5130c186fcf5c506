"""The running-sum model of the implicit-state buffer tests ("m": X -> Y, an INT64 state of N
elements that each step adds X to, handed back in one of four modes), its config, and a
workload that checks every reply against the running sum."""

from __future__ import annotations

import asyncio
import random

import numpy as np

from tests.support.models import state_config

N = 5  # elements per state row


def config(strategy: str, *, same: bool = False, dims: str = f"[ {N} ]", mbs: int = 4, name: str = "m") -> str:
    init_dims = f"[ {N} ]" if dims == f"[ {N} ]" else "[ 2 ]"
    return state_config(
        strategy, same=same, mbs=mbs, dims=dims, init_dims=init_dims, output_dims="[ -1 ]", candidates=4, name=name
    )


# Adds X to every element of the state, writing every row (padding rows included), and
# returns the new state as Y. X == -1000 on a real row fails the batch after the state was written.
MODEL = """
import numpy as np

MODE = {mode!r}


class Model:
    def execute(self, batch):
        s = batch.states["S"]
        x = batch.inputs["X"]
        if MODE == "fresh":
            new = s + x
        elif MODE == "next":
            new = np.add(s, x, out=batch.next_state("S"))
        else:  # inplace, inplace_noreturn (use_same_buffer_for_input_output)
            new = np.add(s, x, out=s)
        if np.any((x[:, 0] == -1000) & batch.ready):
            raise RuntimeError("failed after writing the state")
        out = {{"Y": new}}
        if MODE != "inplace_noreturn":
            out["S_OUT"] = new
        return out
"""

MODES = [("fresh", False), ("next", False), ("inplace", True), ("inplace_noreturn", True)]


async def drive(s, seed: int, *, nseq: int = 9) -> None:
    """Runs `nseq` sequences concurrently and checks every reply against the running sum."""
    rng = random.Random(seed)

    async def sequence(sid: int) -> None:
        await asyncio.sleep(rng.random() * 0.002)
        total = 0
        steps = rng.randint(1, 12)
        restart = rng.randint(1, steps) if rng.random() < 0.3 else -1
        for k in range(steps):
            start = k == 0 or k == restart
            if start:
                total = 0
            x = rng.randint(-50, 50)
            req = {"X": np.array([[x]], np.int64)}
            r = await s.infer("m", req, sequence_id=sid, sequence_start=start, sequence_end=k == steps - 1)
            total += x
            assert r.outputs["Y"].tolist() == [[total] * N], f"sequence {sid} step {k}"
            if rng.random() < 0.4:
                await asyncio.sleep(rng.random() * 0.001)

    await asyncio.gather(*(sequence(sid) for sid in range(1, nseq + 1)))


async def step(s, sid: int, x: int, *, start: bool = False, end: bool = False) -> list[list[int]]:
    r = await s.infer("m", {"X": np.array([[x]], np.int64)}, sequence_id=sid, sequence_start=start, sequence_end=end)
    return r.outputs["Y"].tolist()
