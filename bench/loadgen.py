"""Closed-loop sequence load: N concurrent sequences, each sends its next step when the reply
to the previous one has arrived.

A run is: warm-up (``warmup_s``, not measured) -> measured window (``duration_s`` seconds, or
until ``steps`` steps have been measured) -> drain (every open sequence sends one more step
with END so the server is left with no live sequences; not measured). A step is measured when
it was sent and answered inside the window. CPU (server tree and client) is sampled at the
window's edges. Every reply of every phase is checked against the expected running sum.

Everything a run produces is in :class:`RunResult`, which can be merged with results of the
same run from other processes (for a later multi-process generator).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.cpu import ClientCpu, CpuSample, ProcessTreeCpu, SystemCpu
from bench.transports import SeqId, Transport

perf_ns = time.perf_counter_ns

# Step inputs: small integers, so every running sum is exact in FP32 and replies compare with ==.
VALUES = (3.0, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0, -6.0, 5.0, 3.0, -5.0, 8.0, 9.0, -7.0, 9.0, 3.0)


@dataclass
class RunConfig:
    transport: str
    concurrency: int
    seq_len: int = 100
    warmup_s: float = 2.0
    duration_s: float | None = 10.0
    steps: int | None = None  # measure this many steps instead of duration_s
    verify: bool = True
    string_ids: bool = False
    request_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    max_error_samples: int = 5


@dataclass
class RunResult:
    transport: str
    concurrency: int
    seq_len: int
    window_s: float = 0.0
    latencies_ns: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    # the measured START steps again (also in latencies_ns): with more sequences than the model has
    # slots, a new sequence waits in the server's backlog until one ends, and that shows up here
    start_latencies_ns: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    steps_total: int = 0  # every reply received (all phases), each one verified
    sequences_done: int = 0
    errors: int = 0  # failed requests (all phases), timeouts included
    timeouts: int = 0
    wrong: int = 0  # replies that differ from the expected running sum (all phases)
    stuck_workers: int = 0  # workers still waiting for a reply when the drain timed out
    error_samples: list[str] = field(default_factory=list)
    server_cpu_s: float | None = None
    server_nprocs: int | None = None
    server_threads_cpu_s: dict[str, float] | None = None  # the root process's threads (see cpu.CpuSample)
    client_cpu_s: float = 0.0
    system_cpu_s: float | None = None  # busy CPU of the whole machine over the window

    @property
    def steps(self) -> int:
        return int(self.latencies_ns.size)

    def merge(self, other: RunResult) -> RunResult:
        """Combine the results of one run measured by several generator processes (same window)."""
        return RunResult(
            transport=self.transport,
            concurrency=self.concurrency + other.concurrency,
            seq_len=self.seq_len,
            window_s=max(self.window_s, other.window_s),
            latencies_ns=np.concatenate([self.latencies_ns, other.latencies_ns]),
            start_latencies_ns=np.concatenate([self.start_latencies_ns, other.start_latencies_ns]),
            steps_total=self.steps_total + other.steps_total,
            sequences_done=self.sequences_done + other.sequences_done,
            errors=self.errors + other.errors,
            timeouts=self.timeouts + other.timeouts,
            wrong=self.wrong + other.wrong,
            stuck_workers=self.stuck_workers + other.stuck_workers,
            error_samples=(self.error_samples + other.error_samples)[:10],
            server_cpu_s=self.server_cpu_s if self.server_cpu_s is not None else other.server_cpu_s,  # measured once
            server_nprocs=self.server_nprocs or other.server_nprocs,
            server_threads_cpu_s=self.server_threads_cpu_s or other.server_threads_cpu_s,
            client_cpu_s=self.client_cpu_s + other.client_cpu_s,
            system_cpu_s=self.system_cpu_s if self.system_cpu_s is not None else other.system_cpu_s,
        )


class SequenceIds:
    """Unique sequence ids for one generator invocation (numeric uint64, or strings)."""

    def __init__(self, string_ids: bool = False, base: int | None = None) -> None:
        if base is None:  # distinct from other generators' and earlier invocations' ids
            base = ((int(time.time()) & 0xFFFFFF) << 32) | ((os.getpid() & 0xFFF) << 20)
        self._counter = itertools.count(base + 1)
        self.string_ids = string_ids

    def next(self) -> SeqId:
        n = next(self._counter)
        return f"bench-{n:x}" if self.string_ids else n


if sys.version_info >= (3, 11):

    async def _with_timeout(aw, timeout_s: float):  # type: ignore[no-untyped-def]
        async with asyncio.timeout(timeout_s):
            return await aw

else:  # pragma: no cover

    async def _with_timeout(aw, timeout_s: float):  # type: ignore[no-untyped-def]
        return await asyncio.wait_for(aw, timeout_s)


class _Run:
    def __init__(self, transport: Transport, cfg: RunConfig, ids: SequenceIds) -> None:
        self.t = transport
        self.cfg = cfg
        self.ids = ids
        self.stop = False
        self.measuring = False
        self.t0 = 0
        self.lat: list[int] = []
        self.lat_start: list[int] = []
        self.steps_total = 0
        self.sequences_done = 0
        self.errors = 0
        self.timeouts = 0
        self.wrong = 0
        self.samples: list[str] = []
        self.enough = asyncio.Event()
        self.target = cfg.steps if cfg.steps else 0

    def _error(self, e: BaseException) -> None:
        self.errors += 1
        if isinstance(e, TimeoutError | asyncio.TimeoutError):
            self.timeouts += 1
        if len(self.samples) < self.cfg.max_error_samples:
            msg = f"{type(e).__name__}: {e}"[:300]
            if msg not in self.samples:
                self.samples.append(msg)

    async def worker(self, idx: int) -> None:
        cfg, step, lat = self.cfg, self.t.step, self.lat
        nvals = len(VALUES)
        while not self.stop:
            sid = self.ids.next()
            expected = 0.0
            for k in range(cfg.seq_len):
                end = self.stop or k == cfg.seq_len - 1
                value = VALUES[(k + idx) % nvals]
                ts = perf_ns()
                try:
                    out = await _with_timeout(step(sid, value, k == 0, end, idx), cfg.request_timeout_s)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # abandon this sequence (the server times it out), start another
                    self._error(e)
                    await asyncio.sleep(0.05)
                    break
                te = perf_ns()
                self.steps_total += 1
                expected += value
                if cfg.verify and out != expected:
                    self.wrong += 1
                    if len(self.samples) < cfg.max_error_samples:
                        self.samples.append(f"wrong answer: seq {sid} step {k}: got {out}, expected {expected}")
                if self.measuring and ts >= self.t0:
                    lat.append(te - ts)
                    if k == 0:
                        self.lat_start.append(te - ts)
                    if self.target and len(lat) >= self.target:
                        self.enough.set()
                if end:
                    self.sequences_done += 1
                    break


def _thread_delta(a: CpuSample | None, b: CpuSample | None) -> dict[str, float] | None:
    if not (a and b and a.threads is not None and b.threads is not None):
        return None
    delta = {k: v - a.threads.get(k, 0.0) for k, v in b.threads.items()}
    return {k: round(v, 3) for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0}


async def run_closed_loop(
    transport: Transport,
    cfg: RunConfig,
    ids: SequenceIds,
    server_cpu: ProcessTreeCpu | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """One closed-loop run at ``cfg.concurrency`` on an opened transport."""
    run = _Run(transport, cfg, ids)
    client_cpu = ClientCpu()
    system_cpu = SystemCpu()
    workers = [asyncio.create_task(run.worker(i)) for i in range(cfg.concurrency)]

    def tick(phase: str, elapsed: float, total: float | None) -> None:
        if progress is not None:
            of = f"/{total:.0f}s" if total else "s"
            progress(f"{phase} {elapsed:4.1f}{of}  {len(run.lat)} steps  {run.errors} err  {run.wrong} wrong")

    start = time.perf_counter()
    while (el := time.perf_counter() - start) < cfg.warmup_s:
        tick("warm-up", el, cfg.warmup_s)
        await asyncio.sleep(min(0.5, cfg.warmup_s - el))

    sys0 = system_cpu.sample()
    srv0: CpuSample | None = server_cpu.sample() if server_cpu else None
    cli0 = client_cpu.sample()
    run.t0 = perf_ns()
    run.measuring = True
    wstart = time.perf_counter()
    while True:
        el = time.perf_counter() - wstart
        if cfg.steps:
            if run.enough.is_set():
                break
            tick("measuring", el, None)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(run.enough.wait(), 0.5)
            if all(w.done() for w in workers):
                break
        else:
            assert cfg.duration_s is not None
            if el >= cfg.duration_s:
                break
            tick("measuring", el, cfg.duration_s)
            await asyncio.sleep(min(0.5, cfg.duration_s - el))
    run.measuring = False
    t1 = perf_ns()
    cli1 = client_cpu.sample()
    srv1: CpuSample | None = server_cpu.sample() if server_cpu else None
    sys1 = system_cpu.sample()

    run.stop = True
    if progress is not None:
        progress("draining")
    _, pending = await asyncio.wait(workers, timeout=cfg.drain_timeout_s)
    for w in pending:
        w.cancel()
    if pending:
        await asyncio.wait(pending)
    for w in workers:
        if not w.cancelled() and w.exception() is not None:
            run._error(w.exception())  # type: ignore[arg-type]

    return RunResult(
        transport=cfg.transport,
        concurrency=cfg.concurrency,
        seq_len=cfg.seq_len,
        window_s=(t1 - run.t0) / 1e9,
        latencies_ns=np.asarray(run.lat, dtype=np.int64),
        start_latencies_ns=np.asarray(run.lat_start, dtype=np.int64),
        steps_total=run.steps_total,
        sequences_done=run.sequences_done,
        errors=run.errors,
        timeouts=run.timeouts,
        wrong=run.wrong,
        stuck_workers=len(pending),
        error_samples=run.samples,
        server_cpu_s=(srv1.cpu_s - srv0.cpu_s) if srv0 and srv1 else None,
        server_nprocs=srv1.nprocs if srv1 else None,
        server_threads_cpu_s=_thread_delta(srv0, srv1),
        client_cpu_s=cli1.cpu_s - cli0.cpu_s,
        system_cpu_s=(sys1.cpu_s - sys0.cpu_s) if sys0 and sys1 else None,
    )
