"""A rolling restart of three replicas sharing a state store, under load: concurrent sessions
step through a client-side balancer that does what HAProxy does (a consistent choice by session
id among the replicas it knows, a retry on 503 and on refused connections), while each replica
in turn gets SIGTERM and is replaced by a new one (new ports, new replica id: the sessions that
hash to it then are handed over from their live owners). Every step's running sum is checked:
0 wrong answers and 0 errors."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.clients import new_str_id, session_step
from tests.support.models import copy_demo_models
from tests.support.process import ServerProcess

pytest.importorskip("seqserve.engine.replicas.checkpoint", reason="needs the engine's checkpoint API")

SESSIONS = 12
MIN_STEPS = 30  # each session steps until the restarts are over, and at least this often
Launch = Callable[..., ServerProcess]


class Balancer:
    """The replicas a client may use, chosen by session id; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replicas: list[ServerProcess] = []

    def pick(self, session: str, attempt: int) -> ServerProcess:
        with self.lock:
            live = sorted(self.replicas, key=lambda r: r.http_port)
        h = int.from_bytes(hashlib.sha256(session.encode()).digest()[:8], "big")
        return live[(h + attempt) % len(live)]


def post(srv: ServerProcess, session: str, x: float) -> tuple[int, float | str]:
    r = session_step(srv, session, x)
    doc = r.json()
    if r.status != 200:
        return r.status, str(doc.get("error"))
    return 200, float(doc["outputs"][0]["data"][0])


def test_rolling_restart_loses_no_session(launch: Launch, redis_url: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    copy_demo_models(repo, "accumulator")
    generation = iter(range(100))

    def start() -> ServerProcess:
        return launch(repo, "--state-store", redis_url, "--replica-id", f"r{next(generation)}", exit_timeout_s=10)

    lb = Balancer()
    lb.replicas = [start() for _ in range(3)]
    wrong: list[str] = []
    errors: list[str] = []
    retries = [0]
    steps_done: list[int] = []
    stop = threading.Event()

    def session_worker() -> None:
        session = new_str_id()
        total = 0.0
        step = 0
        while step < MIN_STEPS or not stop.is_set():
            step += 1
            total += step
            for attempt in range(200):
                srv = lb.pick(session, attempt)
                try:
                    status, got = post(srv, session, float(step))
                except OSError:  # the replica is gone: try the next one
                    status, got = 0, "connection failed"
                if status == 200:
                    if got != total:
                        wrong.append(f"{session} step {step}: {got} != {total}")
                    break
                if status not in (0, 503):
                    errors.append(f"{session} step {step}: {status} {got}")
                    return
                retries[0] += 1
                time.sleep(0.02)
            else:
                errors.append(f"{session} step {step}: no replica answered")
                return
            time.sleep(0.05)
        steps_done.append(step)

    workers = [threading.Thread(target=session_worker) for _ in range(SESSIONS)]
    for w in workers:
        w.start()
    try:
        for _ in range(3):  # every replica in turn
            time.sleep(0.5)
            with lb.lock:
                old = min(lb.replicas, key=lambda r: r.http_port)
            old.terminate()
            assert old.wait() == 0, old.log()
            replacement = start()
            with lb.lock:
                lb.replicas.remove(old)
                lb.replicas.append(replacement)
        time.sleep(1.0)  # steps on the last replacement too
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert not wrong, wrong[:5]
    assert not errors, errors[:5]
    assert all(not w.is_alive() for w in workers)
    assert len(steps_done) == SESSIONS
    print(f"{SESSIONS} sessions, {sum(steps_done)} steps through 3 restarts: 0 wrong, 0 errors, {retries[0]} retries")
