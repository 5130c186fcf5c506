"""Iterative sequences in process (engine/model/iterations.py): one request stands for its
sequence and comes back step after step; ids of its own for requests without one; the slot
freed when the request is released for good; process isolation refused at load."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import InferenceError
from tests.support.iterative import write_countdown, write_triton_iterative

ITERATIVE = "sequence_batching { iterative_sequence: true }"


async def stream_all(server: Any, model: str, inputs: dict[str, np.ndarray], **options: Any) -> list[Any]:
    return [r async for r in server.stream(model, inputs, **options)]


async def test_the_triton_model_runs_step_after_step(repo: Path, serve: Any) -> None:
    write_triton_iterative(repo)
    s = await serve()
    got = await stream_all(s, "iterative_sequence", {"IN": np.array([2], np.int32)})
    assert [int(r.outputs["OUT"][0]) for r in got] == [1, 0]
    # its sequence (an id of its own) ended with the request: no live sequence is left
    assert s.model("iterative_sequence").inflight_sequences == 0


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
