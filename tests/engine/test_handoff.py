"""Sequences that move between replicas through the state store, with in-process Servers on the
demo accumulator (running sums, so any lost or doubled step shows): handoff at shutdown,
handover from a live owner, idle spill, refusals while leaving, lost and ended sequences.
Each test runs against a real redis-server and against the directory store."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, Server, SessionGoneError
from seqserve.engine.replicas.store import SequenceKey, StateStore, Status, open_store
from seqserve.engine.request import InferRequest, SequenceId
from tests.support.paths import DEMO_REPO

pytest.importorskip("seqserve.engine.replicas.checkpoint", reason="needs the engine's checkpoint API")

START_MSG = "must specify the START flag"

Replica = Callable[..., Awaitable[Server]]


@pytest.fixture(params=["redis", "dir"])
async def replica(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Replica]:
    """``await replica("A", spill_idle_s=...)``: a started Server with the accumulator, sharing
    one store with the test's other replicas; shut down after the test."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = f"t{uuid.uuid4().hex[:6]}:"
    else:
        url, prefix = f"dir://{tmp_path}/store", ""
    servers: list[Server] = []

    async def make(name: str, *, heartbeat_ttl_s: float = 3.0, **kwargs: Any) -> Server:
        server = Server(DEMO_REPO, exit_timeout_s=5.0)
        await server.start(["accumulator"])
        store = open_store(url, name, heartbeat_ttl_s=heartbeat_ttl_s)
        if prefix:
            getattr(store, "inner", store).prefix = prefix  # the Redis client under the timing wrapper
        await server.enable_state_store(store, **kwargs)
        servers.append(server)
        return server

    yield make
    for s in servers:
        if not s.exiting:
            await s.shutdown(timeout_s=2)


def store_of(server: Server) -> StateStore:
    assert server.replicas is not None
    return server.replicas.store


async def step(
    server: Server, sid: SequenceId, x: float, *, start: bool = False, end: bool = False, session: bool = False
) -> float:
    req = InferRequest(
        "accumulator",
        {"INPUT": np.array([[x]], np.float32)},
        sequence_id=sid,
        sequence_start=start,
        sequence_end=end,
        session=session,
    )
    result = await server.enqueue(req)
    return float(result.outputs["OUTPUT"].reshape(-1)[0])


async def settle(server: Server) -> None:
    """Let the background writes (registrations, ends) reach the store."""
    h = server.replicas
    assert h is not None
    for _ in range(200):
        if h.settled:
            break
        h.ownership.wake()
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)


def live_ids(server: Server) -> set[SequenceId]:
    return {sid for _, _, sid, _ in server.live_sequences()}


async def test_drain_hands_sequences_to_another_replica(replica: Replica) -> None:
    a, b = await replica("A"), await replica("B")
    total_int = await step(a, 11, 1.0, start=True)
    total_str = await step(a, "sess-1", 10.0, session=True)  # a session: START implied
    for i in range(2, 5):
        total_int = await step(a, 11, float(i))
        total_str = await step(a, "sess-1", 10.0 * i, session=True)
    await settle(a)
    assert (await store_of(b).get(SequenceKey("accumulator", 1, 11))).status is Status.LIVE  # type: ignore[union-attr]
    await a.shutdown()
    e = await store_of(b).get(SequenceKey("accumulator", 1, "sess-1"))
    assert e is not None and e.status is Status.RELEASED and e.session and e.data
    # B continues both from their checkpoints: exact sums
    assert await step(b, 11, 5.0) == total_int + 5.0 == 15.0
    assert await step(b, "sess-1", 50.0, session=True) == total_str + 50.0 == 150.0
    assert {11, "sess-1"} <= live_ids(b)
    e = await store_of(b).get(SequenceKey("accumulator", 1, 11))
    assert e is not None and e.owner == "B" and e.status is Status.LIVE
    assert await step(b, 11, 1.0, end=True) == 16.0
    await settle(b)
    e = await store_of(b).get(SequenceKey("accumulator", 1, 11))
    assert e is None  # a plain sequence leaves no tombstone


async def test_steps_reaching_a_draining_replica_are_refused_with_retry_after(replica: Replica) -> None:
    a = await replica("A")
    await step(a, 21, 1.0, start=True)
    a.begin_shutdown(timeout_s=5)
    with pytest.raises(InferenceError) as ei:
        await step(a, 21, 1.0)
    assert ei.value.code is Code.UNAVAILABLE and ei.value.retry_after_s
    assert "leaving this replica" in str(ei.value)
    await a.shutdown()


async def test_handover_from_a_live_owner(replica: Replica) -> None:
    a, b = await replica("A"), await replica("B")
    assert await step(a, "h1", 1.0, session=True) == 1.0
    assert await step(a, "h1", 2.0, session=True) == 3.0
    await settle(a)
    # the balancer moved the session to B: B asks A, A lets go between two steps
    assert await step(b, "h1", 3.0, session=True) == 6.0
    assert "h1" in live_ids(b) and "h1" not in live_ids(a)
    # and back again
    assert await step(a, "h1", 4.0, session=True) == 10.0
    assert "h1" in live_ids(a) and "h1" not in live_ids(b)
    # many steps racing on both replicas, each in order on its own replica: none lost, none doubled
    got = await asyncio.gather(*(step(b if i % 2 else a, "h1", 1.0, session=True) for i in range(6)))
    assert sorted(got) == [11.0, 12.0, 13.0, 14.0, 15.0, 16.0]


async def test_handover_times_out_with_retry_after(replica: Replica) -> None:
    a = await replica("A")
    b = await replica("B", handover_timeout_s=0.3)
    await step(a, 31, 1.0, start=True)
    await settle(a)
    h = a.replicas
    assert h is not None
    # an owner that cannot let go in time: the sequence counts as leaving already
    h._leaving.add(SequenceKey("accumulator", 1, 31))
    with pytest.raises(InferenceError) as ei:
        await step(b, 31, 1.0)
    assert ei.value.code is Code.UNAVAILABLE and ei.value.retry_after_s
    assert "did not hand it over" in str(ei.value)
    h._leaving.clear()
    assert await step(a, 31, 1.0) == 2.0  # still A's


async def test_idle_sequences_spill_and_come_back(replica: Replica) -> None:
    a = await replica("A", spill_idle_s=0.2)
    assert await step(a, 41, 2.0, start=True) == 2.0
    assert await step(a, "s41", 3.0, session=True) == 3.0
    for _ in range(100):
        if not live_ids(a) & {41, "s41"}:
            break
        await asyncio.sleep(0.05)
    assert not live_ids(a) & {41, "s41"}, "idle sequences did not spill"
    await settle(a)
    e = await store_of(a).get(SequenceKey("accumulator", 1, 41))
    assert e is not None and e.status is Status.RELEASED
    assert await step(a, 41, 2.0) == 4.0
    assert await step(a, "s41", 3.0, session=True) == 6.0


async def test_unknown_ended_and_lost_sequences(replica: Replica) -> None:
    a = await replica("A", heartbeat_ttl_s=0.3)
    b = await replica("B")
    # unknown to everyone: Triton's START error; a session starts
    with pytest.raises(InferenceError, match=START_MSG):
        await step(b, 51, 1.0)
    assert await step(b, "new", 1.0, session=True) == 1.0
    # a session ended on A: 410 on B as well
    await step(a, "gone", 1.0, session=True)
    await step(a, "gone", 1.0, session=True, end=True)
    await settle(a)
    with pytest.raises(SessionGoneError):
        await step(b, "gone", 1.0, session=True)
    # A dies without handing off: its live sequences are lost, said so, never restarted silently
    await step(a, 52, 1.0, start=True)
    await step(a, "dies", 1.0, session=True)
    await settle(a)
    a.replicas._tasks[1].cancel()  # type: ignore[union-attr]  # no more heartbeats
    await asyncio.sleep(0.5)
    with pytest.raises(InferenceError, match="was lost: replica 'A' stopped") as ei:
        await step(b, 52, 1.0)
    assert ei.value.code is Code.INVALID_ARG
    with pytest.raises(SessionGoneError, match="was lost"):
        await step(b, "dies", 1.0, session=True)


async def test_a_restart_under_the_same_replica_id_does_not_start_afresh(replica: Replica) -> None:
    """A replica killed and restarted under its old name (a StatefulSet pod) finds its earlier
    process's live entries: their state is gone, and the step is told so."""
    old = await replica("pod-0")
    await step(old, "kept-name", 5.0, session=True)
    await step(old, 61, 5.0, start=True)
    await settle(old)
    new = await replica("pod-0")  # the same id, a new process (the old one never handed off)
    with pytest.raises(SessionGoneError, match="replica 'pod-0' restarted without handing it off"):
        await step(new, "kept-name", 1.0, session=True)
    with pytest.raises(InferenceError, match="was lost"):
        await step(new, 61, 1.0)
    await settle(new)
    with pytest.raises(SessionGoneError):  # and stays refused (a tombstone), never a fresh 1.0
        await step(new, "kept-name", 1.0, session=True)


async def test_release_right_after_start_keeps_the_checkpoint(replica: Replica) -> None:
    """A sequence released before its START's registration reached the store (the write is in
    the background) still lands in the store, once, with its state."""
    a, b = await replica("A"), await replica("B")
    h = a.replicas
    assert h is not None
    m = a.model("accumulator")
    for n in range(10):
        sid = 7000 + n
        assert await step(a, sid, 2.0, start=True) == 2.0
        ckpt = await h._checkpoint(m, SequenceKey("accumulator", 1, sid), time.monotonic() + 5)
        assert ckpt is not None
        h.release_later(m, SequenceKey("accumulator", 1, sid), ckpt)
    await settle(a)
    for n in range(10):
        assert await step(b, 7000 + n, 3.0) == 5.0


async def test_a_client_leaving_during_the_lookup_strands_nothing(replica: Replica) -> None:
    """The client of the step that brings a sequence back goes away while the store is consulted:
    the claim and restore finish anyway (the state stays reachable), the step is not run."""
    a, b = await replica("A"), await replica("B")
    assert await step(a, 81, 4.0, start=True) == 4.0
    await a.shutdown()
    req = InferRequest("accumulator", {"INPUT": np.array([[1.0]], np.float32)}, sequence_id=81)
    fut = b.enqueue(req)
    await asyncio.sleep(0)
    fut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fut
    for _ in range(100):
        if 81 in live_ids(b):
            break
        await asyncio.sleep(0.01)
    assert await step(b, 81, 10.0) == 14.0  # restored here; the withdrawn step never ran


async def test_a_start_is_in_the_store_when_it_is_answered(replica: Replica) -> None:
    a = await replica("A")
    assert await step(a, 55, 1.0, start=True) == 1.0
    assert await step(a, "implied-55", 2.0, session=True) == 2.0
    for sid in (55, "implied-55"):  # no settle(): the reply came after the write
        entry = await store_of(a).get(SequenceKey("accumulator", 1, sid))
        assert entry is not None and entry.owner == "A" and entry.status is Status.LIVE, (sid, entry)

    # many STARTs at once share round trips, and each is recorded before its answer; each ends
    # once checked, so that the backlogged ones get a slot without waiting out an idle timeout
    async def start_and_check(sid: int) -> float:
        total = await step(a, sid, 3.0, start=True)
        entry = await store_of(a).get(SequenceKey("accumulator", 1, sid))
        assert entry is not None and entry.owner == "A", (sid, entry)
        await step(a, sid, 0.0, end=True)
        return total

    ids = list(range(1000, 1064))
    sums = await asyncio.gather(*(start_and_check(sid) for sid in ids))
    assert sums == [3.0] * len(ids)


async def test_a_refused_refresh_is_acted_on(replica: Replica) -> None:
    a, b = await replica("A"), await replica("B")
    assert a.replicas is not None
    ownership = a.replicas.ownership
    key = SequenceKey("accumulator", 1, 88)
    assert await step(a, 88, 1.0, start=True) == 1.0
    # the entry vanished behind the owner's back (expired during a stall, or lost): written back
    await store_of(a).end([(key, ownership.held[key].token)], 0)
    assert await store_of(a).get(key) is None
    await ownership.refresh(lambda k: False)
    entry = await store_of(a).get(key)
    assert entry is not None and entry.owner == "A" and entry.status is Status.LIVE
    assert await step(a, 88, 2.0) == 3.0
    # another replica took the id (a START there): the copy here is stale and ends here
    assert await step(b, 88, 5.0, start=True) == 5.0
    await ownership.refresh(lambda k: False)
    assert key not in ownership.held
    # its next step here continues B's sequence (handed over), never the stale copy (3 + 1)
    assert await step(a, 88, 1.0) == 6.0
