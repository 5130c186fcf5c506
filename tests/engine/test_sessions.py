"""Sessions in the core: START implied for a session the server does not know, and the
tombstone store that refuses a session that ended or expired (bounded in time and count, least
recently used dropped first); the sequence API's list, show and end; the sequence counters."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from seqserve.engine import _core

I32 = np.dtype(np.int32)
ENDED = "was ended by its END request; start a new session with a new id"
START_MSG = "must specify the START flag on the first request of the sequence"


class Core:
    """A started Direct scheduler (2 slots) whose runner records each batch's flags."""

    def __init__(self, **spec: Any) -> None:
        spec.setdefault("max_batch_size", 2)
        spec.setdefault("slots_per_instance", 2)
        spec.setdefault("strategy", _core.Strategy.DIRECT)
        self.spec = _core.ModelSpec(
            name="m",
            inputs=[_core.InputSpec(name="X", dtype=I32, default_shape=[1])],
            **spec,
        )
        self.rows: list[tuple[Any, bool, bool]] = []  # (corrid, start, end) of each real row
        self.failed: list[tuple[list[int], _core.Code, str]] = []
        self.ran = threading.Semaphore(0)
        self.sched = _core.Scheduler(
            self.spec,
            runner=self._run,
            on_fail=lambda h, code, msg: self.failed.append((list(h), code, msg)),
            on_warning=lambda msg: None,
        )
        self.sched.start()
        self.keep: list[Any] = []
        self.handle = 0

    def _run(self, b: _core.Batch) -> bool:
        for k in range(b.size):
            if b.ready[k]:
                self.rows.append((b.corrid[k], bool(b.start[k]), bool(b.end[k])))
        b.finish(True)
        self.ran.release()
        return True

    def submit(self, corrid: int | str, *, start: bool = False, end: bool = False, session: bool = True) -> Any:
        self.handle += 1
        arr = np.array([[1]], np.int32)
        self.keep.append(arr)
        header = _core.RequestHeader(handle=self.handle, sequence_id=corrid, start=start, end=end, session=session)
        return self.sched.submit(header, (arr,))

    def step(self, corrid: int | str, **kw: Any) -> None:
        assert isinstance(self.submit(corrid, **kw), int)  # accepted
        assert self.ran.acquire(timeout=10)

    def refused(self, corrid: int | str, **kw: Any) -> _core.Refusal:
        err = self.submit(corrid, **kw)
        assert isinstance(err, _core.Refusal), err
        return err

    def close(self) -> None:
        self.sched.close(True)


@pytest.fixture
def core() -> Any:
    made: list[Core] = []

    def make(**spec: Any) -> Core:
        c = Core(**spec)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_session_request_implies_start(core: Any) -> None:
    c = core()
    c.step("s1")  # no START flag: the session starts
    c.step("s1")
    c.step("s1", end=True)
    assert [(s, e) for _, s, e in c.rows] == [(True, False), (False, False), (False, True)]
    # Triton's rule for sequence_id requests is untouched
    err = c.refused("other", session=False)
    assert err.code == _core.Code.INVALID_ARG and START_MSG in err.message


def test_ended_session_is_refused_until_started_again(core: Any) -> None:
    c = core()
    c.step("s1")
    c.step("s1", end=True)
    err = c.refused("s1")
    assert err.code == _core.Code.NOT_FOUND
    assert err.message == f"session 's1' {ENDED}"
    assert c.sched.session_gone("s1") == err.message
    # a sequence_id request gets Triton's START error, not the session's
    assert c.refused("s1", session=False).code == _core.Code.INVALID_ARG
    # an explicit START begins the id afresh and clears what was remembered
    c.step("s1", start=True)
    assert c.sched.session_gone("s1") is None
    c.step("s1", end=True)
    assert c.refused("s1").code == _core.Code.NOT_FOUND
    # a one-request session (START implied, END) is remembered too
    c.step(77, end=True)
    assert c.refused(77).message == f"session '77' {ENDED}"


def test_sequences_named_by_sequence_id_leave_no_tombstone(core: Any) -> None:
    c = core()
    c.step(5, start=True, session=False)
    c.step(5, end=True, session=False)
    assert c.sched.session_gone(5) is None
    c.step(5)  # a session request now starts it: nothing was remembered of id 5
    assert c.rows[-1][1] is True
    # ... but a sequence_id sequence that a session request touched is a session from then on
    c.step(6, start=True, session=False)
    c.step(6)
    c.step(6, end=True, session=False)
    assert c.sched.session_gone(6) is not None


def test_expired_session_is_refused_with_its_idle_time(core: Any) -> None:
    c = core(idle_us=100_000)
    c.step("idle")
    deadline = time.monotonic() + 5
    while c.sched.find_sequence("idle") is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.sched.find_sequence("idle") is None
    err = c.refused("idle")
    assert err.code == _core.Code.NOT_FOUND
    assert err.message.startswith("session 'idle' expired after 0.1")
    assert err.message.endswith(" s idle; start a new session with a new id")
    assert c.sched.stats().sequences_expired == 1


def test_tombstones_are_bounded_by_count_least_recently_used_first(core: Any) -> None:
    c = core(max_tombstones=2)
    for sid in ("a", "b"):
        c.step(sid, end=True)
    assert c.refused("a").code == _core.Code.NOT_FOUND  # a looked up: now the most recently used
    c.step("c", end=True)  # over the count: b goes
    assert c.sched.session_gone("b") is None
    assert c.sched.session_gone("a") is not None and c.sched.session_gone("c") is not None
    # dropped before its time, yet never an implied START: it may be a session that ended
    err = c.refused("b")
    assert err.code == _core.Code.NOT_FOUND and "--session-tombstone-max" in err.message
    assert c.sched.stats().tombstones_evicted == 1
    c.step("b", start=True)  # an explicit START begins it afresh
    assert c.rows[-1][1:] == (True, False)


def test_a_flood_of_sessions_never_turns_an_ended_one_into_a_fresh_start(core: Any) -> None:
    c = core(max_tombstones=100)
    ended = [f"old-{i}" for i in range(300)]
    for sid in ended:
        c.step(sid, end=True)  # one-request sessions: each leaves a tombstone
    assert c.sched.stats().tombstones_evicted == 200
    for sid in ended:
        assert c.refused(sid).code == _core.Code.NOT_FOUND, sid
    # new ids still start implicitly (the evicted ids' filter is sized for 500k ids an hour)
    fresh = [f"new-{i}" for i in range(200)]
    for sid in fresh:
        c.step(sid, end=True)  # one request each: left open, each would wait for a slot's idle timeout
    assert sum(1 for _, start, _ in c.rows[-200:] if start) == 200


def test_tombstones_are_bounded_in_time(core: Any) -> None:
    c = core(tombstone_us=150_000)
    c.step("t", end=True)
    assert c.refused("t").code == _core.Code.NOT_FOUND
    time.sleep(0.25)
    assert c.sched.session_gone("t") is None
    c.step("t")  # remembered no longer: a new session


def test_tombstones_off(core: Any) -> None:
    for spec in ({"tombstone_us": 0}, {"max_tombstones": 0}):
        c = core(**spec)
        c.step("z", end=True)
        assert c.sched.session_gone("z") is None
        c.step("z")


def test_typed_ids_have_their_own_tombstones(core: Any) -> None:
    c = core()
    c.step(9, end=True)
    assert c.sched.session_gone(9) is not None
    assert c.sched.session_gone("9") is None
    c.step("9")


def test_list_show_and_end(core: Any) -> None:
    c = core()
    c.step("a")
    c.step("a")
    c.step(12, start=True, session=False)
    total, infos = c.sched.list_sequences(10)
    assert total == 2
    by_id = {i.sequence_id: i for i in infos}
    a = by_id["a"]
    assert (a.backlogged, a.session, a.instance, a.steps, a.queued) == (False, True, 0, 2, 0)
    assert a.slot in (0, 1) and a.age_s >= a.idle_s >= 0
    assert by_id[12].session is False and by_id[12].slot != a.slot
    assert c.sched.list_sequences(1)[0] == 2 and len(c.sched.list_sequences(1)[1]) == 1
    shown = c.sched.find_sequence(12)
    assert shown is not None and shown.steps == 1
    assert c.sched.find_sequence("12") is None

    ended = c.sched.end_sequence("a")
    assert ended is not None and ended.sequence_id == "a" and ended.steps == 2
    assert c.sched.find_sequence("a") is None
    assert c.refused("a").message == "session 'a' was ended through the sequence API; start a new session with a new id"
    assert c.sched.end_sequence("a") is None
    # a sequence_id sequence ended through the API: its next request needs START
    assert c.sched.end_sequence(12) is not None
    assert c.refused(12, session=False).code == _core.Code.INVALID_ARG
    s = c.sched.stats()
    assert (s.sequences_started, s.sequences_ended) == (2, 2)
    assert s.sequence_slots == 2


@pytest.mark.parametrize("strategy", [_core.Strategy.DIRECT, _core.Strategy.OLDEST])
def test_end_runs_the_final_step_with_timeout_complete(core: Any, strategy: _core.Strategy) -> None:
    c = core(timeout_complete=True, strategy=strategy)
    c.step("f")
    assert c.sched.end_sequence("f") is not None
    assert c.ran.acquire(timeout=10)  # the final END step
    assert c.rows[-1][1:] == (False, True)
    deadline = time.monotonic() + 5
    while c.sched.stats().sequences_active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.sched.stats().sequences_active == 0
    assert c.refused("f").message == "session 'f' was ended through the sequence API; start a new session with a new id"


def test_end_of_a_backlogged_sequence_cancels_its_requests(core: Any) -> None:
    c = core(max_batch_size=1, slots_per_instance=1)
    c.step("holder")
    assert isinstance(c.submit("waiting"), int)  # no free slot: backlogged
    assert isinstance(c.submit("waiting"), int)
    info = c.sched.find_sequence("waiting")
    assert info is not None and info.backlogged and info.queued == 2 and info.slot == -1
    s = c.sched.stats()
    assert (s.sequences_active, s.sequences_backlogged, s.pending_requests) == (1, 1, 2)
    ended = c.sched.end_sequence("waiting")
    assert ended is not None and ended.backlogged
    ((handles, code, message),) = c.failed
    assert len(handles) == 2 and code == _core.Code.CANCELLED
    assert message == "sequence waiting was ended through the sequence API before it got a slot"
    s = c.sched.stats()
    assert (s.sequences_backlogged, s.pending_requests, s.fail_canceled) == (0, 0, 2)
    assert c.refused("waiting").code == _core.Code.NOT_FOUND


def test_latency_histogram_and_failure_reasons(core: Any) -> None:
    c = core(latency_buckets_ms=[1000.0, 0.000001])
    assert list(c.spec.latency_buckets_ms) == [1000.0, 0.000001]
    c.step("h")
    c.step("h")
    s = c.sched.stats()
    assert len(s.latency_counts) == 3 and sum(s.latency_counts) == 2
    assert s.latency_counts[0] == 0  # sorted: 1e-6 ms first, nothing is that fast
    assert s.latency_sum_ms > 0
    assert (s.fail_rejected, s.fail_backend, s.fail_canceled) == (0, 0, 0)


# ------------------------------------------------------------------ the in-process API

ACC_CONFIG = """
name: "acc"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ]
            initial_state { name: "z" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } ]
}
"""
ACC_MODEL = """
class Model:
    def execute(self, batch):
        total = batch.states["S_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total, "S_OUT": total}
"""
STATELESS_CONFIG = """
name: "plain"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
PLAIN_MODEL = """
class Model:
    def execute(self, batch):
        return {"OUTPUT": batch.inputs["INPUT"].copy()}
"""


async def test_server_sequence_api_and_counters(repo: Any, serve: Any) -> None:
    from seqserve.engine import Code, InferenceError, InferRequest, SessionGoneError, SessionPolicy
    from tests.support.models import write_model

    write_model(repo, "acc", ACC_CONFIG, ACC_MODEL)
    write_model(repo, "plain", STATELESS_CONFIG, PLAIN_MODEL)
    s = await serve(sessions=SessionPolicy(tombstone_s=60, tombstone_max=100))

    def x(v: float) -> dict[str, np.ndarray]:
        return {"INPUT": np.array([[v]], np.float32)}

    async def session_step(sid: str, v: float, **kw: Any) -> float:
        r = await s.enqueue(InferRequest("acc", x(v), sequence_id=sid, session=True, **kw))
        return float(r.outputs["OUTPUT"][0, 0])

    assert await session_step("u1", 2) == 2  # START implied
    assert await session_step("u1", 3) == 5
    await s.infer("acc", x(1), sequence_id=7, sequence_start=True)
    found = s.sequences("acc")
    assert found.total == 2 and {i.sequence_id for i in found.sequences} == {"u1", 7}
    info = s.sequence("acc", "u1", version=1)
    assert (info.session, info.steps, info.state_bytes, info.backlogged) == (True, 2, 4, False)
    assert info.instance == "acc_0_0" and info.slot is not None
    assert s.sequences("acc", limit=1).total == 2 and len(s.sequences("acc", limit=1).sequences) == 1
    with pytest.raises(InferenceError) as e:
        s.sequence("acc", "7")
    assert e.value.code == Code.NOT_FOUND and "sequence '7' of model 'acc' version 1 is not live" in e.value.message
    with pytest.raises(InferenceError) as e:
        s.sequences("plain")
    assert e.value.code == Code.INVALID_ARG

    ended = s.end_sequence("acc", "u1")
    assert ended.sequence.sequence_id == "u1" and (ended.final_step, ended.cancelled_requests) == (False, 0)
    with pytest.raises(SessionGoneError) as gone:
        await session_step("u1", 1)
    assert gone.value.code == Code.NOT_FOUND
    assert "was ended through the sequence API" in gone.value.message
    with pytest.raises(InferenceError) as e:
        s.end_sequence("acc", "u1")
    assert e.value.code == Code.NOT_FOUND and "was ended through the sequence API" in e.value.message

    # a generated id is a session: its end is remembered
    r = await s.infer("acc", x(4))
    sid = r.parameters["sequence_id"]
    await s.infer("acc", x(1), sequence_id=sid, sequence_end=True)
    with pytest.raises(SessionGoneError):
        await session_step(sid, 1)

    (acc, plain) = s.model_counters()
    assert (acc.model, acc.version, plain.model) == ("acc", "1", "plain")
    assert acc.success == 5 and acc.inference_count == 5 and acc.is_sequence and not plain.is_sequence
    assert (acc.sequences_started, acc.sequences_ended, acc.sequences_expired) == (3, 2, 0)
    assert (acc.sequence_slots, acc.sequences_active, acc.sequences_backlogged) == (2, 1, 0)
    assert acc.failure == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 2}  # the two refused
    assert acc.latency_buckets[-1] == (float("inf"), 5)
    assert acc.state_bytes == 4
