"""Scale-out through HAProxy (issue 15): steps/s, latency and errors with 1, 2 and 3 replicas
behind deploy/haproxy/haproxy.cfg sharing a Redis state store, and what a rolling restart costs.

    python -m bench.scaleout --out bench/results/scaleout.txt

For each replica count: redis-server, n `seqserve serve` replicas and HAProxy on loopback
(bench/scaleout/cluster.py), then `--sessions` closed-loop workers of verified `accumulator` sessions of
`--steps` steps (bench/scaleout/session_load.py: every reply checked against the running sum) for
`--duration` s after `--warmup` s. The "direct" row is one replica without HAProxy, for the
balancer's own cost. Then the rolling restart: the same sessions, paced (`--restart-pace` s
between a session's steps, so the load stays below saturation and the latency cost of the
restarts shows), while every one of 3 replicas is restarted in turn with SIGTERM: failed and
wrong steps as the client saw them, the requests HAProxy retried and redispatched, latency
before and during the restarts, and how long each drain and return took. `--no-store` runs the
restart without the state store, for comparison (sessions are lost there).

Everything runs on this machine: the replicas, HAProxy, Redis and the load generator share its
CPUs, so more replicas add no CPU, only processes (see the report's header). Needs
redis-server and haproxy on PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench.scaleout.cluster import Cluster, demo_repo_with_instances, missing_tools
from bench.scaleout.session_load import LoadResult, SessionLoad, rolling_restart


def _row(label: str, res: LoadResult, since: float, until: float) -> str:
    """steps/s, p50, p99 and failed steps (errors and wrong answers) of one time window."""
    until = min(until, max((t for t, _ in res.timeline), default=since))
    steps = sum(1 for t, _ in res.timeline if since <= t <= until)
    rate = steps / (until - since) if until > since else 0.0
    return (
        f"{label:<22} {rate:>9.0f} {res.percentile_ms(50, since, until):>8.2f} "
        f"{res.percentile_ms(99, since, until):>8.2f} {res.failures(since, until):>8}"
    )


def steady(workdir: Path, n: int, args: argparse.Namespace, direct: bool = False) -> str:
    with Cluster(workdir, n_replicas=n, repo=args.repo, state_store=not args.no_store) as cluster:
        assert cluster.haproxy is not None
        if direct:
            r = cluster.replicas[0]
            url = f"127.0.0.1:{r.http_port}" if args.protocol == "http" else f"127.0.0.1:{r.grpc_port}"
        else:
            url = cluster.haproxy.http_url if args.protocol == "http" else cluster.haproxy.grpc_url
        t0 = time.monotonic()
        load = SessionLoad(url, sessions=args.sessions, steps=args.steps, rounds=10**9, protocol=args.protocol,
                           deadline=t0 + args.warmup + args.duration, stop_on_error=False)  # fmt: skip
        res = asyncio.run(load.run())
        label = "1 replica, direct" if direct else f"{n} replica{'s' if n > 1 else ''}, HAProxy"
        return _row(label, res, t0 + args.warmup, t0 + args.warmup + args.duration)


def restart(workdir: Path, args: argparse.Namespace) -> list[str]:
    with Cluster(workdir, n_replicas=3, repo=args.repo, state_store=not args.no_store) as cluster:
        assert cluster.haproxy is not None
        url = cluster.haproxy.http_url if args.protocol == "http" else cluster.haproxy.grpc_url
        before = cluster.haproxy.counters()
        load = SessionLoad(url, sessions=args.sessions, steps=args.steps, rounds=10**9, protocol=args.protocol,
                           pace_s=args.restart_pace, stop_on_error=False)  # fmt: skip
        t0 = time.monotonic()
        restarts = asyncio.run(rolling_restart(cluster, load, after_steps=1, delay_s=args.warmup, tail_s=args.warmup))
        after = cluster.haproxy.counters()
    res = load.result
    began, ended = restarts[0].began, restarts[-1].ended
    lines = [
        f"{'window':<22} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'failed':>8}",
        _row("before the restarts", res, t0, began),
        _row("during the restarts", res, began, ended),
        _row("after the restarts", res, ended, float("inf")),
        f"max step latency during the restarts: {_max_ms(res, began, ended):.1f} ms; "
        f"steps over 100 ms: {_slow(res, began, ended, 0.1)}",
        f"sessions: {res.sessions_completed} completed, {res.sessions_started} started "
        f"(the last round is cut at the end of the run); steps {res.steps}, errors {len(res.errors)}, "
        f"wrong {len(res.wrong)}",
        "HAProxy (both backends, whole run): "
        + ", ".join(f"{k} {after[k] - before[k]}" for k in ("requests", "retries", "redispatches", "hrsp_5xx")),
    ]
    for r in restarts:
        lines.append(
            f"  {r.replica}: SIGTERM to exit {r.exit_s:.2f} s (exit status {r.exit_status}), "
            f"exit to UP in HAProxy {r.back_s:.2f} s"
        )
    for e in (res.errors + res.wrong)[:5]:
        lines.append(f"  first failures: {e}")
    return lines


def _max_ms(res: LoadResult, since: float, until: float) -> float:
    return max((lat for t, lat in res.timeline if since <= t <= until), default=0.0) * 1e3


def _slow(res: LoadResult, since: float, until: float, limit_s: float) -> int:
    return sum(1 for t, lat in res.timeline if since <= t <= until and lat > limit_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaleout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="1,2,3", help="replica counts to measure (default 1,2,3)")
    ap.add_argument("--sessions", type=int, default=24, help="concurrent sessions (default 24)")
    ap.add_argument("--steps", type=int, default=60, help="steps per session (default 60)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per replica count")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--protocol", choices=["http", "grpc"], default="http")
    ap.add_argument(
        "--instances",
        type=int,
        default=4,
        help="accumulator instances per replica, 8 slots each (default 4, as tests/bench/test_scaleout.py: "
        "room for a drained peer's sessions)",
    )
    ap.add_argument("--restart-pace", type=float, default=0.05, help="seconds between a session's steps")
    ap.add_argument("--no-restart", action="store_true", help="skip the rolling restart")
    ap.add_argument("--no-store", action="store_true", help="replicas without --state-store (sessions are lost)")
    ap.add_argument("--out", type=Path, help="also write the report here")
    args = ap.parse_args(argv)
    if missing := missing_tools():
        print(f"needs {' and '.join(missing)} on PATH (apt-get install haproxy redis-server)", file=sys.stderr)
        return 2
    counts = [int(n) for n in args.replicas.split(",") if n]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"# python -m bench.scaleout {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        f"# {platform.platform()}, Python {platform.python_version()}, {cpus} CPUs shared by every replica, "
        f"HAProxy, Redis and the load generator; load average {load1:.2f} at the start",
        f"# {args.protocol}, {args.sessions} sessions of {args.steps} steps (accumulator with {args.instances} "
        f"instances, {8 * args.instances} slots per replica; every reply verified), "
        f"state store: {'none' if args.no_store else 'redis'}",
        "",
        f"{'':<22} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'failed':>8}",
    ]
    print("\n".join(lines), flush=True)

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    with tempfile.TemporaryDirectory(prefix="scaleout-bench-") as tmp:
        args.repo = demo_repo_with_instances(Path(tmp) / "models", args.instances)
        if 1 in counts:
            emit(steady(Path(tmp) / "direct", 1, args, direct=True))
        for n in counts:
            emit(steady(Path(tmp) / f"n{n}", n, args))
        if not args.no_restart:
            emit("")
            emit(f"rolling restart of 3 replicas, sessions paced at {args.restart_pace * 1e3:g} ms between steps:")
            for line in restart(Path(tmp) / "restart", args):
                emit(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
