"""Several generator processes for one run: each runs its share of the lanes on its own event
loop, all started at one shared CLOCK_MONOTONIC instant, and the parent merges their results.

The processes are started once (``spawn``: a clean interpreter, no inherited gRPC threads) and
reused for every run of the invocation. The parent samples the server's and the machine's CPU at
the window's edges itself (it knows the shared schedule); each child reports its own CPU.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.loadgen.runner import RunConfig, RunResult, SequenceIds, run_coro, run_load
from bench.loadgen.workload import Workload

MAX_PROCESSES = 15  # SequenceIds gives each child 2**28 ids of the invocation's 2**32


@dataclass
class Job:
    spec: dict[str, Any]  # TransportSpec keyword arguments
    cfg: RunConfig
    workload: Workload
    start_at_ns: int
    loop: str


async def _child_run(job: Job, ids: SequenceIds) -> RunResult:
    from bench.loadgen.transports import TRANSPORTS, TransportSpec

    transport = TRANSPORTS[job.cfg.transport](TransportSpec(**job.spec))
    await transport.open()
    try:
        return await run_load(transport, job.cfg, job.workload, ids, start_at_ns=job.start_at_ns, sample_system=False)
    finally:
        await transport.close()


def _child_main(conn: Any, index: int, id_base: int, string_ids: bool) -> None:
    import tritonclient.grpc.aio
    import tritonclient.http.aio  # noqa: F401

    import bench.loadgen.transports  # noqa: F401  (import before reporting ready: runs start on a schedule)

    ids = SequenceIds(string_ids, base=id_base + ((index + 1) << 28))
    conn.send(("ready", os.getpid()))
    while True:
        job = conn.recv()
        if job is None:
            break
        try:
            result, _ = run_coro(_child_run(job, ids), job.loop)
        except BaseException as e:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        else:
            conn.send(("ok", result))
    conn.close()


def split_lanes(total: int, processes: int) -> list[int]:
    """Lane counts per process (the first ones get the remainder); no empty processes."""
    n = max(1, min(processes, total))
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


class GeneratorPool:
    def __init__(self, processes: int, id_base: int, string_ids: bool, ready_timeout_s: float = 60.0) -> None:
        if not 1 <= processes <= MAX_PROCESSES:
            raise ValueError(f"--processes must be 1..{MAX_PROCESSES}")
        ctx = mp.get_context("spawn")
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for i in range(processes):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_child_main, args=(child, i, id_base, string_ids), daemon=True, name=f"bench-gen-{i}"
            )
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        self.pids: list[int] = []
        for c in self.conns:
            if not c.poll(ready_timeout_s):
                self.close()
                raise RuntimeError("a generator process did not start")
            self.pids.append(c.recv()[1])

    def __len__(self) -> int:
        return len(self.conns)

    def run(
        self,
        jobs: list[Job],
        at_window: Callable[[str], None],
        progress: Callable[[float, str], None] | None,
        timeout_s: float,
    ) -> list[RunResult]:
        """Send one job per process (``len(jobs) <= len(self)``), call ``at_window("start")`` and
        ``at_window("end")`` at the shared window's edges, and return the children's results."""
        for conn, job in zip(self.conns, jobs, strict=False):
            conn.send(job)
        cfg, t_start = jobs[0].cfg, jobs[0].start_at_ns
        w0 = t_start + int(cfg.warmup_s * 1e9)
        w1 = w0 + int((cfg.duration_s or 0) * 1e9)
        total = cfg.warmup_s + (cfg.duration_s or 0)
        for edge, until in (("start", w0), ("end", w1)):
            while (left := until - time.perf_counter_ns()) > 0:
                if progress is not None:
                    el = max(0.0, (time.perf_counter_ns() - t_start) / 1e9)
                    phase = "warm-up" if edge == "start" else "measuring"
                    progress(min(1.0, el / total) if total else 0.0, f"{phase} {el:4.1f}s  ({len(jobs)} processes)")
                time.sleep(min(0.25, left / 1e9))
            at_window(edge)
        if progress is not None:
            progress(1.0, f"draining ({len(jobs)} processes)")
        results: list[RunResult] = []
        errors: list[str] = []
        deadline = time.monotonic() + timeout_s
        for conn in self.conns[: len(jobs)]:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError("a generator process did not finish its run")
            kind, value = conn.recv()
            if kind == "ok":
                results.append(value)
            else:
                errors.append(value)
        if errors:
            raise RuntimeError("generator process failed:\n" + "\n".join(errors))
        return results

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
