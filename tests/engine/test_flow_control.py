"""Flow control through the in-process API: the bound on backlogged sequences (admission
control), cancellation that reaches the core's queues, sequences ended with their scope, and
the idle clock that starts when a START has been answered.

A gated model holds its executor at a threading.Event, so "running" and "queued behind it" are
states the tests set up and wait for (by polling observable state), not timing guesses.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, InferRequest, SequenceScope, Server, SessionGoneError
from tests.support.checks import expect_error
from tests.support.models import in_x_config, write_model

GATED_MODEL = """
import threading
RECORD = []
GATE = threading.Event()
GATE.set()

class Model:
    def execute(self, batch):
        RECORD.append({
            "x": batch.inputs["IN_X"].reshape(-1).tolist(),
            "start": batch.start.reshape(-1).tolist(), "end": batch.end.reshape(-1).tolist(),
            "ready": batch.ready.reshape(-1).tolist(), "corrid": batch.corrid.reshape(-1).tolist(),
        })
        GATE.wait(10)
        return {"OUT_X": batch.inputs["IN_X"].copy()}
"""

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""

DIRECT = "direct { }"
OLDEST = "oldest { max_candidate_sequences: 1 }"


def config(*, mbs: int = 1, strategy: str = DIRECT, seq: str = "", batching: str | None = None) -> str:
    scheduling = batching if batching is not None else f"sequence_batching {{ {strategy} {CONTROLS} {seq} }}"
    return in_x_config(scheduling, mbs=mbs)


def model_module() -> Any:
    return sys.modules["seqserve_models.m.v1"]


def x_in(value: int) -> dict[str, np.ndarray]:
    return {"IN_X": np.array([[value]], np.int32)}


async def send(s: Server, seq_id: int, value: int = 0, *, start: bool = False, end: bool = False) -> asyncio.Task:
    """Submit without waiting for the result; returns once the request has been queued."""
    task = asyncio.ensure_future(s.infer("m", x_in(value), sequence_id=seq_id, sequence_start=start, sequence_end=end))
    await asyncio.sleep(0)  # the task runs up to its submit
    return task


async def call(s: Server, seq_id: int, value: int = 0, *, start: bool = False, end: bool = False) -> int:
    r = await s.infer("m", x_in(value), sequence_id=seq_id, sequence_start=start, sequence_end=end)
    return int(r.outputs["OUT_X"].reshape(-1)[0])


async def until(pred: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Wait for observable state (polled), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def state(s: Server) -> dict[str, Any]:
    return s.model("m").scheduler_state()


def start_error(seq_id: int) -> str:
    return (
        f"inference request for sequence {seq_id} to model 'm' must specify the START flag on the first request "
        "of the sequence"
    )


def cancelled_message(seq_id: int) -> str:
    return f"sequence {seq_id} of model 'm' was cancelled: a request of the sequence was cancelled before it ran"


def full_message(n: int) -> str:
    return (
        f"the backlog of model 'm' is full: {n} sequences are waiting for a slot (max_backlog_sequences {n}); "
        "retry later"
    )


# ------------------------------------------------------------------ admission control


@pytest.mark.parametrize("strategy", [DIRECT, OLDEST])
async def test_start_beyond_the_backlog_bound_is_refused_at_once(repo, serve, strategy):
    write_model(repo, "m", config(strategy=strategy), GATED_MODEL)
    s = await serve(max_backlog_sequences=2)
    assert await call(s, 1, 1, start=True) == 1  # holds the only slot
    waiting = [await send(s, 2, 2, start=True), await send(s, 3, 3, start=True)]
    err = await expect_error(call(s, 4, 4, start=True), Code.UNAVAILABLE, full_message(2))
    assert err.retry_after_s == 1.0
    # more requests of a backlogged sequence, even a second START, add no sequence: accepted
    more = [await send(s, 2, 5), await send(s, 3, 6, start=True)]
    assert state(s)["backlog_full"] == 1
    assert state(s)["backlog_sequences"] == 2
    await call(s, 1, end=True)  # 2 takes the slot, so the backlog has room again
    await until(lambda: state(s)["backlog_sequences"] == 1, "sequence 2 to get the slot")
    waiting.append(await send(s, 4, 4, start=True))
    await call(s, 2, end=True)
    await call(s, 3, end=True)
    await call(s, 4, end=True)
    assert [t.result().outputs["OUT_X"].item() for t in waiting + more] == [2, 3, 4, 5, 6]


async def test_config_bound_overrides_the_servers(repo, serve):
    write_model(repo, "m", config(seq="max_backlog_sequences: 1"), GATED_MODEL)
    s = await serve(max_backlog_sequences=100)
    await call(s, 1, start=True)
    waiting = await send(s, 2, start=True)
    await expect_error(call(s, 3, start=True), Code.UNAVAILABLE, full_message(1))
    assert state(s)["max_backlog_sequences"] == 1
    await call(s, 1, end=True)
    await waiting


async def test_config_minus_one_means_no_bound(repo, serve):
    write_model(repo, "m", config(seq="max_backlog_sequences: -1"), GATED_MODEL)
    s = await serve(max_backlog_sequences=1)
    await call(s, 1, start=True)
    waiting = [await send(s, i, start=True) for i in range(2, 12)]
    assert state(s)["backlog_sequences"] == 10
    assert state(s)["max_backlog_sequences"] == 0
    for t in waiting:
        t.cancel()


async def test_server_zero_means_no_bound(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve(max_backlog_sequences=0)
    await call(s, 1, start=True)
    waiting = [await send(s, i, start=True) for i in range(2, 40)]
    assert state(s)["backlog_sequences"] == 38
    for t in waiting:
        t.cancel()


async def test_bad_config_bound_fails_the_load(repo, serve):
    write_model(repo, "m", config(seq="max_backlog_sequences: -2"), GATED_MODEL)
    s = await serve()
    [entry] = s.repository_index()
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == (
        "sequence batching max_backlog_sequences must be -1 (no bound), 0 (the server's default) or a positive "
        "number of sequences for m"
    )


def test_server_refuses_a_negative_bound(repo):
    with pytest.raises(ValueError, match="max_backlog_sequences must be >= 0"):
        Server(repo, max_backlog_sequences=-1)


# ------------------------------------------------------------------------ cancellation


async def test_cancelled_backlogged_sequence_leaves_the_backlog_at_once(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve(max_backlog_sequences=1)
    await call(s, 1, start=True)
    waiting = await send(s, 2, start=True)
    assert state(s)["backlog_sequences"] == 1
    waiting.cancel()  # the caller went away: its future is cancelled
    await until(lambda: state(s)["backlog_sequences"] == 0, "the backlog to drop sequence 2")
    assert state(s)["cancelled"] == 1
    assert s.statistics("m")[0].inference_stats.fail.count == 1
    fresh = await send(s, 3, 3, start=True)  # the bound counts it no more
    await expect_error(call(s, 2, 1), Code.INVALID_ARG, start_error(2))
    await call(s, 1, end=True)
    assert (await fresh).outputs["OUT_X"].item() == 3
    assert [r["corrid"] for r in model_module().RECORD] == [[1], [1], [3]]


async def test_one_cancelled_request_cancels_its_whole_backlogged_sequence(repo, serve):
    # Triton: "all the pending requests in the same sequence will also be cancelled"
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    await call(s, 1, start=True)
    first = await send(s, 2, 1, start=True)
    second = await send(s, 2, 2)
    second.cancel()
    await expect_error(first, Code.CANCELLED, cancelled_message(2))
    assert state(s)["backlog_sequences"] == 0
    assert state(s)["cancelled"] == 2


@pytest.mark.parametrize("strategy", [DIRECT, OLDEST])
@pytest.mark.parametrize("action", ["TIMEOUT_REJECT", "TIMEOUT_COMPLETE"])
async def test_cancelled_step_in_a_slot_ends_its_sequence(repo, serve, strategy, action):
    write_model(repo, "m", config(strategy=strategy, seq=f"timeout_action: {action}"), GATED_MODEL)
    s = await serve()
    mod = model_module()
    mod.GATE.clear()
    running = await send(s, 1, 1, start=True)
    await until(lambda: len(mod.RECORD) == 1, "the START to run")
    queued = await send(s, 1, 2)  # waits behind it in the slot
    later = await send(s, 1, 3)
    queued.cancel()
    await asyncio.sleep(0)
    mod.GATE.set()
    assert (await running).outputs["OUT_X"].item() == 1
    await expect_error(later, Code.CANCELLED, cancelled_message(1))
    await until(lambda: state(s)["free_slots"] == 1, "the slot to be freed")
    if action == "TIMEOUT_COMPLETE":  # one final END step, as at idle expiry (it frees the slot as it is batched)
        await until(lambda: len(mod.RECORD) == 2, "the final step")
        assert mod.RECORD[1:] == [{"x": [0], "start": [0], "end": [1], "ready": [1], "corrid": [1]}]
    else:
        assert mod.RECORD[1:] == []
    await expect_error(call(s, 1, 4), Code.INVALID_ARG, start_error(1))
    assert await call(s, 5, 5, start=True) == 5  # the slot serves the next sequence


async def test_cancelled_request_handed_to_the_oldest_batcher(repo, serve):
    # Oldest: a request handed to the instance's batcher (not yet in a batch) is dropped when
    # the instance next forms a batch, and its sequence ends.
    write_model(repo, "m", config(strategy="oldest { max_candidate_sequences: 2 }"), GATED_MODEL)
    s = await serve()
    mod = model_module()
    mod.GATE.clear()
    running = await send(s, 1, 1, start=True)
    await until(lambda: len(mod.RECORD) == 1, "the first START to run")
    handed = await send(s, 2, 2, start=True)  # its slot has nothing in flight: handed over at once
    handed.cancel()
    await asyncio.sleep(0)
    mod.GATE.set()
    await running
    await until(lambda: state(s)["free_slots"] == 1, "sequence 2's slot to be freed")
    assert [r["corrid"] for r in mod.RECORD] == [[1]]
    assert state(s)["cancelled"] == 1
    await expect_error(call(s, 2, 3), Code.INVALID_ARG, start_error(2))


@pytest.mark.parametrize("batching", ["dynamic_batching { }", ""])
async def test_cancelled_request_leaves_the_stateless_queue(repo, serve, batching):
    write_model(repo, "m", config(batching=batching), GATED_MODEL)
    s = await serve()
    mod = model_module()
    mod.GATE.clear()

    async def infer(value: int) -> Any:
        return await s.infer("m", x_in(value))

    running = asyncio.ensure_future(infer(1))
    await until(lambda: len(mod.RECORD) == 1, "the first request to run")
    queued = asyncio.ensure_future(infer(2))
    kept = asyncio.ensure_future(infer(3))
    await asyncio.sleep(0)
    queued.cancel()  # dropped when the instance forms its next batch
    await asyncio.sleep(0)
    mod.GATE.set()
    assert (await running).outputs["OUT_X"].item() == 1
    assert (await kept).outputs["OUT_X"].item() == 3
    assert [r["x"] for r in mod.RECORD] == [[1], [3]]
    assert state(s)["cancelled"] == 1


async def test_streaming_cancel_answers_cancelled(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    await call(s, 1, start=True)
    got: list[tuple[Any, bool]] = []
    cancel = s.submit_streaming("m", x_in(2), lambda r, f: got.append((r, f)), sequence_id=2, sequence_start=True)
    cancel()
    await until(lambda: bool(got), "the cancelled reply")
    [(err, final)] = got
    assert final and isinstance(err, InferenceError)
    assert (err.code, err.message) == (Code.CANCELLED, cancelled_message(2))
    cancel()  # twice is harmless


async def test_cancel_after_the_reply_changes_nothing(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    got: list[Any] = []
    cancel = s.submit_streaming("m", x_in(7), lambda r, f: got.append(r), sequence_id=1, sequence_start=True)
    await until(lambda: bool(got), "the reply")
    cancel()
    assert await call(s, 1, 8) == 8  # the sequence lives on
    assert state(s)["cancelled"] == 0


# --------------------------------------------------------------------- sequence scopes


def scoped(
    scope: SequenceScope, seq_id: int, value: int = 0, *, start: bool = False, end: bool = False
) -> InferRequest:
    return InferRequest("m", x_in(value), sequence_id=seq_id, sequence_start=start, sequence_end=end, scope=scope)


@pytest.mark.parametrize("action", ["TIMEOUT_REJECT", "TIMEOUT_COMPLETE"])
async def test_closing_a_scope_ends_its_sequences(repo, serve, action):
    write_model(repo, "m", config(mbs=2, seq=f"timeout_action: {action}"), GATED_MODEL)
    s = await serve()
    mod = model_module()
    scope = SequenceScope("the test closed it")
    await s.enqueue(scoped(scope, 1, 1, start=True))
    await s.enqueue(scoped(scope, 2, 2, start=True))
    await s.enqueue(scoped(scope, 2, 3, end=True))  # ended: no longer the scope's
    await s.enqueue(scoped(scope, 3, 4, start=True, end=True))  # never live
    assert len(scope) == 1
    unscoped = await call(s, 4, 5, start=True)
    assert unscoped == 5
    del mod.RECORD[:]
    assert scope.close() == 1
    await until(lambda: state(s)["free_slots"] == 1, "sequence 1's slot to be freed")
    if action == "TIMEOUT_COMPLETE":
        await until(lambda: len(mod.RECORD) == 1, "the final step")
        assert mod.RECORD == [{"x": [0], "start": [0], "end": [1], "ready": [1], "corrid": [1]}]
    else:
        assert mod.RECORD == []
    await expect_error(call(s, 1, 6), Code.INVALID_ARG, start_error(1))
    assert await call(s, 4, 7) == 7  # not the scope's: untouched
    assert scope.close() == 0


async def test_closing_a_scope_drops_its_backlogged_sequences(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    scope = SequenceScope("the test closed it")
    await call(s, 1, start=True)
    waiting = asyncio.ensure_future(s.enqueue(scoped(scope, 2, 2, start=True)))
    await asyncio.sleep(0)
    assert state(s)["backlog_sequences"] == 1
    assert scope.close() == 1
    await expect_error(waiting, Code.CANCELLED, "sequence 2 of model 'm' was ended: the test closed it")
    assert state(s)["backlog_sequences"] == 0


async def test_a_later_start_of_the_same_id_is_not_the_scopes(repo, serve):
    write_model(repo, "m", config(mbs=2), GATED_MODEL)
    s = await serve()
    scope = SequenceScope()
    await s.enqueue(scoped(scope, 1, 1, start=True))
    assert await call(s, 1, 2, start=True) == 2  # another client restarts id 1: it is theirs now
    assert scope.close() == 0
    assert await call(s, 1, 3) == 3


# ------------------------------------------------------------------------ idle clock


async def test_waiting_in_a_slot_queue_does_not_count_as_idle(repo, serve):
    # Sequence 2's START waits behind a batch held longer than the idle limit; its idle clock
    # starts once the START is answered, so its next step, sent after a pause well under the
    # limit, still finds it (Triton would have reaped it while it waited).
    write_model(repo, "m", config(mbs=2, seq="max_sequence_idle_microseconds: 300000"), GATED_MODEL)
    s = await serve()
    mod = model_module()
    mod.GATE.clear()
    held = await send(s, 1, 1, start=True)
    await until(lambda: len(mod.RECORD) == 1, "sequence 1's START to run")
    waiting = await send(s, 2, 2, start=True)  # queued in slot 1 behind the held batch
    await asyncio.sleep(0.45)  # past the idle limit while the START waits
    assert state(s)["sequences"]["2"] == 1  # not expired
    mod.GATE.set()
    await held
    assert (await waiting).outputs["OUT_X"].item() == 2
    await asyncio.sleep(0.1)  # the client's pause, under the limit
    assert await call(s, 2, 3) == 3
    await until(lambda: "2" not in state(s)["sequences"], "sequence 2 to expire once idle", timeout=2.0)


async def test_waiting_in_the_backlog_does_not_count_as_idle_oldest(repo, serve):
    write_model(repo, "m", config(strategy=OLDEST, seq="max_sequence_idle_microseconds: 200000"), GATED_MODEL)
    s = await serve()
    await call(s, 1, start=True)
    waiting = await send(s, 2, 2, start=True)
    for _ in range(3):  # sequence 1 stays alive, sequence 2 waits past its idle limit
        await asyncio.sleep(0.1)
        await call(s, 1)
    await call(s, 1, end=True)
    assert (await waiting).outputs["OUT_X"].item() == 2
    await asyncio.sleep(0.1)
    assert await call(s, 2, 3) == 3


# ------------------------------------------------------------------------------ sessions


def session(seq_id: int, value: int, scope: SequenceScope | None = None) -> InferRequest:
    return InferRequest("m", x_in(value), sequence_id=seq_id, session=True, scope=scope)


async def test_a_cancelled_session_is_remembered(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    await call(s, 1, start=True)  # holds the only slot
    fut = s.enqueue(session(77, 1))  # START implied; backlogged
    fut.cancel()
    await until(lambda: state(s)["backlog_sequences"] == 0, "the backlog to drop session 77")
    with pytest.raises(SessionGoneError) as ei:
        s.enqueue(session(77, 2))
    assert (
        str(ei.value) == "session '77' was cancelled (a request of it was cancelled); start a new session with a new id"
    )


async def test_a_session_started_in_a_scope_ends_with_it(repo, serve):
    write_model(repo, "m", config(mbs=2), GATED_MODEL)
    s = await serve()
    scope = SequenceScope("the test closed it")
    assert (await s.enqueue(session(78, 1, scope))).outputs["OUT_X"].item() == 1  # START implied
    assert (await s.enqueue(session(78, 2, scope))).outputs["OUT_X"].item() == 2
    assert scope.close() == 1
    with pytest.raises(SessionGoneError) as ei:
        s.enqueue(session(78, 3))
    assert str(ei.value) == (
        "session '78' was ended when the stream that started it closed; start a new session with a new id"
    )
