"""The state store's ownership rules, against a real redis-server and the directory store:
exactly one of two concurrent claimers wins, stale tokens are refused, a dead owner's entry can
be claimed, handover requests reach their replica, entries expire."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from seqserve.engine.replicas.store import SequenceKey, StateStore, Status, StoreLostError, open_store

Factory = Callable[..., Awaitable[StateStore]]


@pytest.fixture(params=["redis", "dir"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    """Makes opened store clients (one per replica) sharing one store; closes them after."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        prefix = f"t{uuid.uuid4().hex[:6]}:"
    else:
        url = f"dir://{tmp_path}/store"
        prefix = ""
    made: list[StateStore] = []

    async def make(replica: str, *, heartbeat_ttl_s: float = 3.0, on_handover=None) -> StateStore:  # type: ignore[no-untyped-def]
        s = open_store(url, replica, heartbeat_ttl_s=heartbeat_ttl_s)
        if prefix:
            getattr(
                s, "inner", s
            ).prefix = prefix  # tests share one redis-server (the Redis client under the timing wrapper)
        await s.open(on_handover)
        made.append(s)
        return s

    yield make
    for s in made:
        await s.close()


KEY = SequenceKey("accumulator", 1, 42)


def test_keys_round_trip() -> None:
    for key in (KEY, SequenceKey("a/b:c", 3, "x/y z%"), SequenceKey("m", 1, "42")):
        assert SequenceKey.decode(key.encode()) == key
    assert SequenceKey("m", 1, 42).encode() != SequenceKey("m", 1, "42").encode()


def test_bad_urls() -> None:
    with pytest.raises(ValueError, match="unknown state store"):
        open_store("http://x", "r")
    with pytest.raises(ValueError, match="absolute path"):
        open_store("dir://relative", "r")


async def test_register_release_claim(stores: Factory) -> None:
    a, b = await stores("A"), await stores("B")
    assert await a.get(KEY) is None
    [t1] = await a.register([(KEY, True)], 30)
    e = await b.get(KEY)
    assert e is not None and (e.owner, e.token, e.status, e.session) == ("A", t1, Status.LIVE, True)
    # B cannot take a sequence its live owner runs
    c = await b.claim(KEY, 30)
    assert not c.won and c.entry is not None and c.entry.owner == "A"
    assert await a.release(KEY, t1, b"state", 30)
    e = await b.get(KEY)
    assert e is not None and e.status is Status.RELEASED and e.data == b"state"
    c = await b.claim(KEY, 30)
    assert c.won and c.token == t1 + 1 and c.data == b"state"
    e = await a.get(KEY)
    assert e is not None and (e.owner, e.status, e.data) == ("B", Status.LIVE, None)
    # A's token is stale now: nothing it writes lands
    assert not await a.release(KEY, t1, b"stale", 30)
    assert await a.end([(KEY, t1)], 60) == [False]
    assert await a.refresh([(KEY, t1)], 60) == [False]
    e = await a.get(KEY)
    assert e is not None and e.owner == "B" and e.token == t1 + 1
    # B ends it: a tombstone that remembers it was a session
    assert await b.end([(KEY, c.token)], 60) == [True]
    e = await a.get(KEY)
    assert e is not None and e.status is Status.ENDED and e.session
    assert not (await a.claim(KEY, 30)).won
    # a new START takes it afresh, with a higher token
    [t3] = await a.register([(KEY, False)], 30)
    assert t3 > c.token


async def test_concurrent_claims_one_winner(stores: Factory) -> None:
    owner = await stores("owner")
    replicas = [await stores(f"r{i}") for i in range(4)]
    for round_ in range(10):
        key = SequenceKey("m", 1, f"race-{round_}")
        [tok] = await owner.register([(key, False)], 30)
        assert await owner.release(key, tok, b"ckpt-%d" % round_, 30)
        claims = await asyncio.gather(*(r.claim(key, 30) for r in replicas))
        winners = [i for i, c in enumerate(claims) if c.won]
        assert len(winners) == 1, claims
        assert claims[winners[0]].data == b"ckpt-%d" % round_
        losers = [c for c in claims if not c.won]
        assert all(c.entry is not None and c.entry.owner == f"r{winners[0]}" for c in losers)
        e = await owner.get(key)
        assert e is not None and e.owner == f"r{winners[0]}" and e.token == tok + 1


async def test_dead_owner_can_be_claimed(stores: Factory) -> None:
    dead = await stores("dead", heartbeat_ttl_s=0.2)
    b = await stores("B")
    [tok] = await dead.register([(KEY, False)], 30)
    assert not (await b.claim(KEY, 30)).won  # its heartbeat is current
    assert await b.is_alive("dead")
    await asyncio.sleep(0.4)  # no more heartbeats: it is dead
    assert not await b.is_alive("dead")
    c = await b.claim(KEY, 30)
    assert c.won and c.token == tok + 1 and c.data is None  # a live entry has no checkpoint
    assert c.previous_owner == "dead"
    # a late write from the 'dead' replica is fenced off
    assert not await dead.release(KEY, tok, b"late", 30)


async def test_register_is_batched_and_entries_expire(stores: Factory) -> None:
    a = await stores("A")
    keys = [(SequenceKey("m", 2, i), False) for i in range(1, 51)]
    assert await a.register(keys, 30) == [1] * 50
    assert [e is not None and e.owner == "A" for e in [await a.get(k) for k, _ in keys]] == [True] * 50
    short, kept = SequenceKey("m", 3, 1), SequenceKey("m", 3, 2)
    assert await a.register([(short, False), (kept, False)], 0.5) == [1, 1]
    assert await a.refresh([(kept, 1)], 30) == [True]
    await asyncio.sleep(0.8)
    assert await a.get(short) is None  # expired
    assert await a.get(kept) is not None  # refreshed
    # ended without a tombstone: gone
    assert await a.end([(kept, 1)], 0) == [True]
    assert await a.get(kept) is None


async def test_handover_request_reaches_owner(stores: Factory) -> None:
    got: asyncio.Queue[tuple[SequenceKey, str]] = asyncio.Queue()

    async def on_handover(key: SequenceKey, requester: str) -> None:
        await got.put((key, requester))

    await stores("owner", on_handover=on_handover)
    b = await stores("B")
    await asyncio.sleep(0.05)  # the subscription is in place
    key = SequenceKey("m/x", 1, "s:1")
    await b.request_handover("owner", key)
    assert await asyncio.wait_for(got.get(), 3) == (key, "B")


async def test_own_live_entry_is_not_claimed(stores: Factory) -> None:
    """A replica's own live entry is not claimable by itself: its engine knows better (the
    sequence expired or ended there), so the caller decides."""
    a = await stores("A")
    [tok] = await a.register([(KEY, True)], 30)
    c = await a.claim(KEY, 30)
    assert not c.won and c.entry is not None and (c.entry.owner, c.entry.token) == ("A", tok)


async def test_released_entries_expire_into_tombstones(stores: Factory) -> None:
    """A released checkpoint nobody claims in time is not silently forgotten: it becomes an
    'expired' tombstone for the tombstone TTL (sessions answer 410 then, never start afresh)."""
    a, b = await stores("A"), await stores("B")
    tomb, gone = SequenceKey("m", 4, "kept"), SequenceKey("m", 4, "plain")
    [t1, t2] = await a.register([(tomb, True), (gone, False)], 30)
    assert await a.release(tomb, t1, b"x", 0.3, tombstone_ttl_s=30)
    assert await a.release(gone, t2, b"y", 0.3)
    await asyncio.sleep(0.6)
    c = await b.claim(tomb, 30)
    assert not c.won and c.entry is not None and c.entry.status is Status.EXPIRED and c.entry.session
    e = await b.get(tomb)
    assert e is not None and e.status is Status.EXPIRED and e.data is None
    await asyncio.sleep(0.2)
    assert await b.get(gone) is None and not (await b.claim(gone, 30)).won


@pytest.fixture(params=["redis", "dir"])
def wipeable(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, Callable[[], Awaitable[None]]]:
    """(url, key prefix, wipe): wipe() makes the store lose everything, as a Redis restarted
    empty (or a directory wiped) does."""
    if request.param == "dir":
        root = tmp_path / "store"

        async def wipe_dir() -> None:
            shutil.rmtree(root)

        return f"dir://{root}", "", wipe_dir
    url = str(request.getfixturevalue("redis_url"))
    prefix = f"t{uuid.uuid4().hex[:6]}:"

    async def wipe_redis() -> None:
        import redis.asyncio as aioredis

        r = aioredis.from_url(url)
        keys = [k async for k in r.scan_iter(f"{prefix}*")]
        if keys:
            await r.delete(*keys)
        await r.aclose()

    return url, prefix, wipe_redis


async def test_a_store_that_lost_its_data_says_so(wipeable: tuple[str, str, Callable[[], Awaitable[None]]]) -> None:
    url, prefix, wipe = wipeable
    a, b = open_store(url, "A"), open_store(url, "B")
    for s in (a, b):
        if prefix:
            getattr(s, "inner", s).prefix = prefix  # the Redis client under the timing wrapper
        await s.open()
    try:
        assert a.created_epoch and not b.created_epoch and a.epoch == b.epoch
        [tok] = await a.register([(KEY, True)], 30)
        assert await a.heartbeat() and await b.heartbeat()
        await wipe()
        # every replica notices: the heartbeat, a claim, a registration
        assert not await a.heartbeat()
        with pytest.raises(StoreLostError):
            await b.claim(KEY, 30)
        with pytest.raises(StoreLostError):
            await b.register([(SequenceKey("accumulator", 1, 7), False)], 30)
        # the first to recover writes a new epoch and marks the loss window; the others adopt it
        await b.recover(600, 3)
        await a.recover(600, 3)
        assert a.epoch == b.epoch
        assert await a.heartbeat() and await b.heartbeat()
        claim = await b.claim(SequenceKey("accumulator", 1, 99), 30)
        assert not claim.won and claim.entry is None and claim.in_loss_window and claim.in_loss_grace
        # the owner writes its live sequence back, only where the id is still free (fencing)
        [back] = await a.register([(KEY, True)], 30, if_absent=True)
        assert back > 0
        assert await a.register([(KEY, True)], 30, if_absent=True) == [0]
        entry = await b.get(KEY)
        assert entry is not None and entry.owner == "A" and entry.status is Status.LIVE
        assert tok >= 1
    finally:
        for s in (a, b):
            await s.close()
