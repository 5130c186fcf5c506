"""A flood of sessions never turns an ended session into a fresh start: more one-request sessions
than --session-tombstone-max, then every old one is still refused (410), on the server that
ended them and, with a state store, on another replica; the evictions show in the metrics."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from pathlib import Path

from tests.support.clients import new_str_id
from tests.support.fleet import Replica, step
from tests.support.process import ServerProcess

CAP = 100
SESSIONS = 300


def metric(srv: ServerProcess, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", srv.metrics_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def flood(srv: ServerProcess) -> list[str]:
    """SESSIONS one-request sessions (START implied, END): each leaves a tombstone."""
    ended = [new_str_id() for _ in range(SESSIONS)]
    for s in ended:
        assert step(srv, 1.0, session=s, end=True).value == 1.0
    return ended


def test_old_sessions_stay_gone_after_a_flood(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, "--session-tombstone-max", str(CAP))
    ended = flood(srv)
    for s in ended:
        r = step(srv, 1.0, session=s)
        assert r.status == 410, (s, r)
    assert metric(srv, "seqserve_session_tombstones_evicted_total") >= SESSIONS - CAP
    assert step(srv, 1.0, session=ended[0], start=True).value == 1.0  # an explicit START begins it afresh


def test_old_sessions_stay_gone_on_another_replica(redis_url: str, tmp_path: Path) -> None:
    a = Replica(redis_url, "flood-A", tmp_path, "--session-tombstone-max", str(CAP))
    b = Replica(redis_url, "flood-B", tmp_path)
    try:
        ended = flood(a.srv)
        for s in ended:
            r = step(b.srv, 1.0, session=s)
            assert r.status == 410, (s, r)
    finally:
        assert a.drain() == 0 and b.drain() == 0
