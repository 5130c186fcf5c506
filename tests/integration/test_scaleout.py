"""Issue 15's acceptance test: three replicas sharing a Redis state store behind HAProxy
(configured from the shipped deploy/haproxy/haproxy.cfg), 24 concurrent sessions of 60 steps,
every replica restarted in turn with SIGTERM during the run: all sessions complete, 0 wrong,
0 errors.

It needs redis-server and haproxy on PATH (Debian: `apt-get install haproxy redis-server`;
.ci/run installs them when it runs as root). Without them it skips and says why, except in CI
(`CI=true`), where a missing tool fails it: the test must run there.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bench.cluster import Cluster, missing_tools
from bench.sessions import SessionLoad, rolling_restart

SESSIONS = 24
STEPS = 60
# every session waits at this step until the last replica is back, so that every session
# lives across every restart (its steps before it are spread over the restarts by PACE_S)
HOLD_AT = 50
PACE_S = 0.1


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = missing_tools()
    if not missing:
        return
    why = f"{' and '.join(missing)} not on PATH (apt-get install haproxy redis-server)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {why}: .ci/run installs them when it runs as root")
    pytest.skip(why)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_rolling_restart_loses_no_session(tmp_path: Path, protocol: str) -> None:
    with Cluster(tmp_path, n_replicas=3) as cluster:
        assert cluster.haproxy is not None
        url = cluster.haproxy.http_url if protocol == "http" else cluster.haproxy.grpc_url
        load = SessionLoad(url, sessions=SESSIONS, steps=STEPS, protocol=protocol, pace_s=PACE_S,
                           hold_at=HOLD_AT, hold=asyncio.Event())  # fmt: skip

        restarts = asyncio.run(rolling_restart(cluster, load))
        res = load.result
        report = f"{res.summary()}\nrestarts: {restarts}\nerrors: {res.errors[:5]}\nwrong: {res.wrong[:5]}"
        logs = cluster.logs() if res.errors or res.wrong else ""
        assert [r.replica for r in restarts] == [r.name for r in cluster.replicas], report + logs
        assert all(r.exit_status == 0 for r in restarts), report + logs
        assert not res.wrong, report + logs
        assert not res.errors, report + logs
        assert res.sessions_completed == SESSIONS, report + logs
        assert res.steps == SESSIONS * STEPS
