"""Iterative sequences in process (engine/model/iterations.py): one request stands for its
sequence and comes back step after step, even when its first step runs (and is queued again)
before the event loop is back from queueing it; ids of its own for requests without one; the
slot freed when the request is released for good; process isolation refused at load."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import InferenceError
from seqserve.engine._core import RequestHeader, Scheduler
from tests.support.checks import WAIT_S, wait_until
from tests.support.iterative import write_countdown, write_triton_iterative

ITERATIVE = "sequence_batching { iterative_sequence: true }"


class StallAfterSubmit:
    """A model's core whose ``submit`` keeps its caller (the event loop) until the model has run
    ``batches`` batches, the GIL released meanwhile: the executor runs what was just queued
    before the loop is back from submit, as when the loop's thread is preempted right after it.
    Bounded: a batch that never comes only delays the caller."""

    def __init__(self, core: Scheduler, batches: int) -> None:
        self.core = core
        self.batches = batches

    def submit(self, header: RequestHeader, inputs: tuple[Any, ...]) -> object:
        token = self.core.submit(header, inputs)
        deadline = time.monotonic() + WAIT_S / 2
        while self.core.stats().execution_count < self.batches and time.monotonic() < deadline:
            time.sleep(0.005)
        return token

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


async def sequence_ended_by_release(server: Any, model: str, sequences: int = 1) -> None:
    """The model's sequences end when their request is released for good, after ``execute``
    returns: their final response may reach the client first (as in Triton). Ended, not
    expired: a sequence left live would end by the idle rule instead."""
    m = server.model(model)
    await wait_until(lambda: m.inflight_sequences == 0, f"the sequences of {model} have ended")
    c = m.counters()
    assert (c.sequences_started, c.sequences_ended, c.sequences_expired) == (sequences, sequences, 0)


async def stream_all(server: Any, model: str, inputs: dict[str, np.ndarray], **options: Any) -> list[Any]:
    return [r async for r in server.stream(model, inputs, **options)]


async def test_the_triton_model_runs_step_after_step(repo: Path, serve: Any) -> None:
    write_triton_iterative(repo)
    s = await serve()
    got = await stream_all(s, "iterative_sequence", {"IN": np.array([2], np.int32)})
    assert [int(r.outputs["OUT"][0]) for r in got] == [1, 0]
    # its sequence (an id of its own) ends with the request: no live sequence is left
    await sequence_ended_by_release(s, "iterative_sequence")


async def test_a_step_that_runs_before_submit_returns_is_queued_again(
    repo: Path, serve: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # both steps run while the event loop is still inside submit: the first must already be
    # known as its sequence's step, or it is never queued again and its client waits forever
    write_countdown(repo, "countdown", ITERATIVE, mbs=0)
    s = await serve()
    model = s.model("countdown")
    monkeypatch.setattr(model, "_core", StallAfterSubmit(model._core, batches=2))
    run = stream_all(s, "countdown", {"INPUT": np.array([2], np.int32)})
    got = await asyncio.wait_for(run, WAIT_S)
    assert [int(r.outputs["OUTPUT"][0]) for r in got] == [1, 0]
    await sequence_ended_by_release(s, "countdown")


async def test_sequences_without_ids_share_one_slot_in_turn(repo: Path, serve: Any) -> None:
    write_countdown(repo, "countdown", ITERATIVE, mbs=0)  # one slot: the others wait in the backlog
    s = await serve()
    runs = await asyncio.gather(*(stream_all(s, "countdown", {"INPUT": np.array([3], np.int32)}) for _ in range(3)))
    assert [[int(r.outputs["OUTPUT"][0]) for r in run] for run in runs] == [[2, 1, 0]] * 3


async def test_a_model_that_cannot_reschedule_fails_the_request(repo: Path, serve: Any) -> None:
    write_countdown(repo, "plain", "sequence_batching { direct { } }", mbs=0)
    s = await serve()
    with pytest.raises(InferenceError, match="TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"):
        await stream_all(s, "plain", {"INPUT": np.array([2], np.int32)}, sequence_id=5, sequence_start=True)


async def test_process_isolation_is_refused(repo: Path, serve: Any) -> None:
    isolated = ITERATIVE + '\nparameters { key: "isolation" value: { string_value: "process" } }'
    write_countdown(repo, "isolated", isolated, mbs=0)
    s = await serve()  # its load fails (reported); loading it again says why
    with pytest.raises(InferenceError, match="runs in the server process"):
        await s.load_model("isolated")
