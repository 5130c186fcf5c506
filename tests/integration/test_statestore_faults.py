"""Faults against two replicas sharing a real redis-server, as real processes: SIGKILL of a
replica right after it answered STARTs, Redis killed and restarted empty (with live, ended and
spilled sequences), Redis frozen (an outage) and back. Whatever happens, no reply is a wrong
running sum: each is the right sum or an error that says the sequence is lost (or a 503 that
asks to retry). docs/state-store.md, "What can and cannot happen to a sequence"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.clients import new_int_id, new_str_id
from tests.support.fleet import Replica, Reply, SumModel, patient_repo, step
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisProcess, redis_process

pytest.importorskip("seqserve.engine.replicas.checkpoint", reason="needs the engine's checkpoint API")

# the dead owner's heartbeat (10 s) must expire before its sequences are declared lost
LOST_WITHIN_S = 30.0


@pytest.fixture
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with redis_process(tmp_path_factory.mktemp("redis")) as r:
        yield r


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[list[Replica]]:
    """Replicas a test starts (appended here): those still alive are drained at the end."""
    started: list[Replica] = []
    yield started
    for r in started:
        if r.srv.alive():
            r.drain()


def settled_step(srv: ServerProcess, x: float, *, session: str = "", sequence_id: int = 0) -> Reply:
    """A step repeated while it is refused (503), as a client honouring Retry-After does."""
    deadline = time.monotonic() + LOST_WITHIN_S
    while True:
        reply = step(srv, x, session=session, sequence_id=sequence_id)
        if not reply.refused or time.monotonic() > deadline:
            return reply
        time.sleep(0.3)


def test_sigkill_right_after_start_never_restarts_fresh(
    redis: RedisProcess, fleet: list[Replica], tmp_path: Path
) -> None:
    """Rounds of: STARTs (sessions' implied ones and plain ones) sent to A at once, A killed the
    moment the last reply is in, then each sequence's next step on B: never a fresh start."""
    b = Replica(redis.url, "B", tmp_path, "--handover-timeout-secs", "0.5")
    fleet.append(b)
    pool = ThreadPoolExecutor(16)
    for round_ in range(4):
        a = Replica(redis.url, f"A{round_}", tmp_path)
        sessions = [new_str_id() for _ in range(8)]
        ids = [new_int_id() for _ in range(8)]
        starts = [pool.submit(step, a.srv, 5.0, session=s) for s in sessions]
        starts += [pool.submit(step, a.srv, 5.0, sequence_id=i, start=True) for i in ids]
        replies = [f.result() for f in starts]
        a.kill()  # the moment the replies are in
        assert all(r.value == 5.0 for r in replies), replies
        later = [pool.submit(step, b.srv, 1.0, session=s) for s in sessions]
        later += [pool.submit(step, b.srv, 1.0, sequence_id=i) for i in ids]
        for f in later:
            r = f.result()
            assert r.status != 200, f"a sequence started afresh on B after A's SIGKILL (round {round_}): {r}"
        if round_ == 3:  # once A's heartbeat expired: "lost", never a fresh start
            r = settled_step(b.srv, 1.0, session=sessions[0])
            assert r.status == 410 and "lost" in r.error, r
            r = settled_step(b.srv, 1.0, sequence_id=ids[0])
            assert r.status == 400 and "lost" in r.error, r
    pool.shutdown()


def test_redis_restarted_empty_never_restarts_a_sequence_fresh(
    redis: RedisProcess, fleet: list[Replica], tmp_path: Path
) -> None:
    repo = patient_repo(tmp_path / "repo")
    a = Replica(redis.url, "A", tmp_path, repo=repo)
    b = Replica(redis.url, "B", tmp_path, repo=repo)
    fleet += [a, b]
    live = {new_str_id(): SumModel() for _ in range(5)}
    plain = {new_int_id(): SumModel() for _ in range(3)}
    for x in (1.0, 2.0):
        for s, model in live.items():
            assert not model.check(x, step(a.srv, x, session=s))
        for i, model in plain.items():
            assert not model.check(x, step(a.srv, x, sequence_id=i, start=x == 1.0), start=x == 1.0)
    ended = new_str_id()
    assert step(a.srv, 1.0, session=ended).status == 200
    assert step(a.srv, 1.0, session=ended, end=True).value == 2.0

    redis.restart_empty()

    # Live sequences stepped on the other replica: the right sum (A writes them back and hands
    # them over) or an error, never a fresh start.
    for s, model in live.items():
        problem = model.check(3.0, settled_step(b.srv, 3.0, session=s))
        assert not problem, f"session {s}: {problem}"
    for i, model in plain.items():
        problem = model.check(3.0, settled_step(b.srv, 3.0, sequence_id=i))
        assert not problem, f"sequence {i}: {problem}"
    assert all(m.possible == {6.0} for m in [*live.values(), *plain.values()] if not m.dead), (live, plain)
    # The ended session's tombstone is gone with the store's data: still never a fresh start
    for srv in (a.srv, b.srv):
        r = settled_step(srv, 1.0, session=ended)
        assert r.status == 410, r
    # A new session id in the loss window: refused, never taken for new (it may be a lost one)
    fresh = settled_step(b.srv, 1.0, session=new_str_id())
    assert fresh.status == 410 and "lost its data" in fresh.error, fresh
    # ... but an explicit START begins one
    assert step(b.srv, 1.0, session=new_str_id(), start=True).value == 1.0

    # A drain after the loss moves the sessions (none was taken by another replica)
    for s, model in live.items():
        assert not model.check(1.0, settled_step(b.srv, 1.0, session=s))
    assert b.drain() == 0
    for s, model in live.items():
        problem = model.check(1.0, settled_step(a.srv, 1.0, session=s))
        assert not problem, f"session {s} after B's drain: {problem}"
        assert not model.dead, f"session {s} lost in B's drain"
    assert "taken meanwhile" not in b.log() and "taken by another replica" not in b.log(), b.log()


def test_redis_outage_then_restart_empty(redis: RedisProcess, fleet: list[Replica], tmp_path: Path) -> None:
    repo = patient_repo(tmp_path / "repo")
    a = Replica(redis.url, "A", tmp_path, repo=repo)
    b = Replica(redis.url, "B", tmp_path, repo=repo)
    fleet += [a, b]
    sessions = {new_str_id(): SumModel() for _ in range(3)}
    for s, model in sessions.items():
        assert not model.check(2.0, step(a.srv, 2.0, session=s))

    redis.freeze()  # an outage (the data is kept)
    try:
        # steps of sequences live on their replica go on
        for s, model in sessions.items():
            assert not model.check(1.0, step(a.srv, 1.0, session=s))
        # a START needs the store: 503 + Retry-After, never an unrecorded sequence
        new = step(a.srv, 1.0, session=new_str_id())
        assert new.status == 503, new
        assert step(b.srv, 1.0, sequence_id=new_int_id(), start=True).status == 503
        # a step that needs the store: 503, never a fresh start
        for s in sessions:
            assert step(b.srv, 1.0, session=s).status == 503
    finally:
        redis.thaw()
    for s, model in sessions.items():
        assert not model.check(1.0, settled_step(b.srv, 1.0, session=s))

    redis.kill()  # down, then back empty
    for s, model in sessions.items():
        assert not model.check(1.0, step(b.srv, 1.0, session=s)), "a sequence live on its replica goes on"
    assert step(a.srv, 1.0, session=next(iter(sessions))).status == 503  # B holds it; the store is down
    redis.start()
    for s, model in sessions.items():
        reply = settled_step(a.srv, 1.0, session=s)
        problem = model.check(1.0, reply)
        assert not problem, f"session {s}: {problem}"
        assert not model.dead, f"session {s} was live on B, which wrote it back: {reply}\n{b.log()}\n{a.log()}"
