"""The state store's one rule, as a property over random histories: two replicas (real
processes) and a real redis-server; a seeded random driver interleaves accumulator steps of
sessions and plain sequences on either replica with replica kills (SIGKILL, then a new process,
sometimes under the same replica id), drains (SIGTERM, then a new process) and Redis restarts
(SIGKILL, back empty). Every reply is checked against a model of its sequence: the right running
sum, or an error that says the sequence is lost, or a 503 (not applied). No wrong sum, ever.

Bounded in time (``BUDGET_S``); ``SEQSERVE_PROPERTY_SEED`` replays one history."""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.clients import new_int_id, new_str_id
from tests.support.fleet import Replica, SumModel, patient_repo, step
from tests.support.redis_server import RedisProcess, redis_process

pytest.importorskip("seqserve.engine.replicas.checkpoint", reason="needs the engine's checkpoint API")

BUDGET_S = 70.0  # the history's length in time (the faults' restarts take most of it)
MAX_FAULTS = 6
LIVE_SEQUENCES = 8


@dataclass
class Tracked:
    """A sequence the driver steps: a session id or a plain id, its model, its last replica."""

    session: str
    sequence_id: int
    model: SumModel
    home: int


@pytest.fixture
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    with redis_process(tmp_path_factory.mktemp("redis")) as r:
        yield r


class Fleet:
    """Two replica slots; a fault replaces the process in a slot."""

    def __init__(self, redis: RedisProcess, log_dir: Path) -> None:
        self.redis = redis
        self.log_dir = log_dir
        self.repo = patient_repo(log_dir / "repo")
        self.generation = 0
        self.replicas = [self.start(f"r0-{i}") for i in range(2)]
        self.retired: list[Replica] = []

    def start(self, name: str) -> Replica:
        return Replica(self.redis.url, name, self.log_dir, "--handover-timeout-secs", "0.5", repo=self.repo)

    def replace(self, slot: int, *, kill: bool, same_id: bool) -> None:
        old = self.replicas[slot]
        if kill:
            old.kill()
        else:
            assert old.drain() == 0, old.log()
        self.retired.append(old)
        self.generation += 1
        self.replicas[slot] = self.start(old.name if same_id else f"r{self.generation}-{slot}")

    def close(self) -> None:
        for r in self.replicas:
            if r.srv.alive():
                r.drain()


def test_no_wrong_sum_through_kills_drains_and_store_restarts(redis: RedisProcess, tmp_path: Path) -> None:
    seed = int(os.environ.get("SEQSERVE_PROPERTY_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    fleet = Fleet(redis, tmp_path)
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    tracked: list[Tracked] = []
    faults = 0
    deadline = time.monotonic() + BUDGET_S
    try:
        while time.monotonic() < deadline:
            roll = rng.random()
            if roll < 0.03 and faults < MAX_FAULTS:
                faults += 1
                what = rng.choice(["kill", "kill-same-id", "drain", "redis"])
                outcomes[f"fault:{what}"] += 1
                if what == "redis":
                    redis.restart_empty()
                else:
                    fleet.replace(rng.randrange(2), kill=what != "drain", same_id=what == "kill-same-id")
                continue
            tracked = [t for t in tracked if not t.model.dead]
            if len(tracked) < LIVE_SEQUENCES or roll < 0.1:
                session = new_str_id() if rng.random() < 0.6 else ""
                t = Tracked(session, 0 if session else new_int_id(), SumModel(), rng.randrange(2))
                tracked.append(t)
                # plain sequences START explicitly; sessions half the time (implied otherwise)
                start = not session or rng.random() < 0.5
            else:
                t = rng.choice(tracked)
                start = False
            if rng.random() < 0.2:
                t.home = 1 - t.home  # the balancer moved it
            x = float(rng.randint(1, 9))
            reply = step(fleet.replicas[t.home].srv, x, session=t.session, sequence_id=t.sequence_id, start=start)
            outcomes[str(reply.status)] += 1
            problem = t.model.check(x, reply, start=start)
            if problem:
                problems.append(f"{t.session or t.sequence_id} on replica slot {t.home}: {problem} ({reply.error})")
    finally:
        fleet.close()
    print(f"seed {seed}: {dict(outcomes)}")
    assert outcomes["200"] > 50, (seed, outcomes)
    assert not problems, f"seed {seed} ({dict(outcomes)}):\n" + "\n".join(problems)
