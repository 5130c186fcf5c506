"""Sequence load: closed loop or real-time paced, on one event loop of one generator process.

closed: N concurrent sequences ("lanes"), each sends its next step when the reply to the previous
        one has arrived.
paced:  N streams, each sends one step every ``period_s`` on a fixed schedule (stream ``i`` offset
        by ``i / N`` of a period, as independent audio streams would be), regardless of how fast
        replies come, except that a stream never sends step k+1 of a sequence before step k's reply:
        a late reply makes the next step late (it goes at once; the schedule does not move). A step
        misses its deadline when its reply arrives after the stream's next scheduled send time.

A run is: warm-up (``warmup_s``, not measured) -> measured window (``duration_s`` seconds, or
until ``steps`` steps have been measured) -> drain (every open sequence sends one more step
with END, at once, so the server is left with no live sequences; not measured). A step is
measured when it was sent and answered inside the window. CPU (server tree and client) is sampled
at the window's edges. Every reply of every phase is checked when the workload verifies.

Several generator processes (``bench.loadgen.multiproc``) run the same run with a shared ``start_at``
(CLOCK_MONOTONIC, the same in every process), each with a share of the lanes; their
:class:`RunResult` objects merge.
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
from typing import Any

import numpy as np

from bench.loadgen.cpu import ClientCpu, CpuSample, ProcessTreeCpu, SystemCpu, split_delta
from bench.loadgen.transports import SeqId, Transport
from bench.loadgen.workload import Workload, check

perf_ns = time.perf_counter_ns

MODES = ("closed", "paced")


@dataclass
class RunConfig:
    transport: str
    concurrency: int  # lanes (sequences / streams) in this process
    mode: str = "closed"
    period_s: float = 0.02  # paced: one step per stream every period_s
    total_lanes: int | None = None  # lanes over all generator processes (paced phase offsets)
    lane_offset: int = 0  # this process's first lane, globally
    seq_len: int = 100
    seq_len_jitter: float = 0.0  # sequence length uniform in seq_len * (1 +- jitter)
    warmup_s: float = 2.0
    duration_s: float | None = 10.0
    steps: int | None = None  # measure this many steps instead of duration_s
    request_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    max_error_samples: int = 5
    seed: int = 0
    label: str = ""  # the target (e.g. "seqserve", "floor:grpc-stream")


def _empty() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


@dataclass
class RunResult:
    transport: str
    concurrency: int
    seq_len: int
    mode: str = "closed"
    period_s: float | None = None
    label: str = ""
    processes: int = 1
    window_s: float = 0.0
    # measured latencies, the START steps apart: with more sequences than the model has slots, a new
    # sequence waits in the server's backlog until one ends, and that shows up in the START steps
    start_latencies_ns: np.ndarray = field(default_factory=_empty)
    rest_latencies_ns: np.ndarray = field(default_factory=_empty)
    # paced: per lane, measured steps and deadline misses; per measured step, send lag behind schedule
    lane_steps: np.ndarray = field(default_factory=_empty)
    lane_misses: np.ndarray = field(default_factory=_empty)
    send_lag_ns: np.ndarray = field(default_factory=_empty)
    steps_total: int = 0  # every reply received (all phases), each one verified
    sequences_done: int = 0
    errors: int = 0  # failed requests (all phases), timeouts included
    timeouts: int = 0
    wrong: int = 0  # replies that differ from the expected running sum (all phases)
    verified: bool = False
    stuck_workers: int = 0  # workers still waiting for a reply when the drain timed out
    error_samples: list[str] = field(default_factory=list)
    server_cpu_s: float | None = None
    server_nprocs: int | None = None
    server_threads_cpu_s: dict[str, float] | None = None  # the root process's threads (see cpu.CpuSample)
    # the server's CPU per process kind (bench.loadgen.cpu): the root process's own (the engine) and
    # the rest of its tree (the worker processes of `seqserve serve --workers N`)
    engine_cpu_s: float | None = None
    workers_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    system_cpu_s: float | None = None  # busy CPU of the whole machine over the window
    # the model's statistics over the window (bench.loadgen.model_stats.window), when read (--model-stats)
    model_stats: dict[str, Any] | None = None
    # anything else sampled at the window's edges by the caller (e.g. the other server's CPU)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def latencies_ns(self) -> np.ndarray:
        """Every measured step."""
        return np.concatenate([self.start_latencies_ns, self.rest_latencies_ns])

    @property
    def steps(self) -> int:
        return int(self.start_latencies_ns.size + self.rest_latencies_ns.size)

    def merge(self, other: RunResult) -> RunResult:
        """Combine the results of one run measured by several generator processes (same window)."""
        cat = np.concatenate
        return RunResult(
            transport=self.transport,
            concurrency=self.concurrency + other.concurrency,
            seq_len=self.seq_len,
            mode=self.mode,
            period_s=self.period_s,
            label=self.label,
            processes=self.processes + other.processes,
            window_s=max(self.window_s, other.window_s),
            start_latencies_ns=cat([self.start_latencies_ns, other.start_latencies_ns]),
            rest_latencies_ns=cat([self.rest_latencies_ns, other.rest_latencies_ns]),
            lane_steps=cat([self.lane_steps, other.lane_steps]),
            lane_misses=cat([self.lane_misses, other.lane_misses]),
            send_lag_ns=cat([self.send_lag_ns, other.send_lag_ns]),
            steps_total=self.steps_total + other.steps_total,
            sequences_done=self.sequences_done + other.sequences_done,
            errors=self.errors + other.errors,
            timeouts=self.timeouts + other.timeouts,
            wrong=self.wrong + other.wrong,
            verified=self.verified and other.verified,
            stuck_workers=self.stuck_workers + other.stuck_workers,
            error_samples=(self.error_samples + other.error_samples)[:10],
            server_cpu_s=self.server_cpu_s if self.server_cpu_s is not None else other.server_cpu_s,  # measured once
            server_nprocs=self.server_nprocs or other.server_nprocs,
            server_threads_cpu_s=self.server_threads_cpu_s or other.server_threads_cpu_s,
            engine_cpu_s=self.engine_cpu_s if self.engine_cpu_s is not None else other.engine_cpu_s,
            workers_cpu_s=self.workers_cpu_s if self.workers_cpu_s is not None else other.workers_cpu_s,
            client_cpu_s=self.client_cpu_s + other.client_cpu_s,
            system_cpu_s=self.system_cpu_s if self.system_cpu_s is not None else other.system_cpu_s,
            model_stats=self.model_stats if self.model_stats is not None else other.model_stats,
            extra=self.extra or other.extra,
        )


class SequenceIds:
    """Unique sequence ids for one generator invocation (numeric, below 2**63, or strings).

    ``id_base()`` leaves 2**32 ids per invocation: the parent process counts from the base, child
    process ``i`` (``bench.loadgen.multiproc``) from ``base + (i + 1) << 28``; all keep counting across runs.
    """

    def __init__(self, string_ids: bool = False, base: int | None = None) -> None:
        if base is None:
            base = id_base()
        self._counter = itertools.count(base + 1)
        self.string_ids = string_ids

    def next(self) -> SeqId:
        n = next(self._counter)
        return f"bench-{n:x}" if self.string_ids else n


def id_base() -> int:
    """Distinct from other generators' and earlier invocations' ids (time and pid bits)."""
    return ((int(time.time()) & 0xFFFFF) << 40) | ((os.getpid() & 0xFF) << 32)


if sys.version_info >= (3, 11):

    async def _with_timeout(aw, timeout_s: float):  # type: ignore[no-untyped-def]
        async with asyncio.timeout(timeout_s):
            return await aw

else:  # pragma: no cover

    async def _with_timeout(aw, timeout_s: float):  # type: ignore[no-untyped-def]
        return await asyncio.wait_for(aw, timeout_s)


class _Run:
    def __init__(self, transport: Transport, cfg: RunConfig, workload: Workload, ids: SequenceIds) -> None:
        self.t = transport
        self.cfg = cfg
        self.wl = workload
        self.ids = ids
        self.stop = False
        self.measuring = False
        self.t_start = 0  # perf_ns of the run's start (paced schedules count from it)
        self.t0 = 0
        self.lat_start: list[int] = []
        self.lat_rest: list[int] = []
        self.lag: list[int] = []
        self.lane_steps = [0] * cfg.concurrency
        self.lane_misses = [0] * cfg.concurrency
        self.measured = 0
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

    async def worker(self, lane: int) -> None:
        cfg, wl, step = self.cfg, self.wl, self.t.step
        glane = cfg.lane_offset + lane
        rng = np.random.default_rng([cfg.seed, glane])
        paced = cfg.mode == "paced"
        period = int(cfg.period_s * 1e9)
        nxt = self.t_start + (glane * period) // max(1, cfg.total_lanes or cfg.concurrency)
        verify = wl.verify
        seq_no = glane
        sched = 0
        while not self.stop:
            sid = self.ids.next()
            steps = wl.sequence(rng, seq_no, cfg.seq_len, cfg.seq_len_jitter)
            seq_no += cfg.total_lanes or cfg.concurrency
            expected: np.ndarray | None = None
            last = len(steps) - 1
            for k, (payload, vin) in enumerate(steps):
                if paced:
                    sched = nxt
                    while not self.stop and (wait := nxt - perf_ns()) > 0:
                        await asyncio.sleep(wait / 1e9)
                end = self.stop or k == last
                ts = perf_ns()
                try:
                    out = await _with_timeout(step(sid, payload, k == 0, end, lane), cfg.request_timeout_s)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # abandon this sequence (the server times it out), start another
                    self._error(e)
                    await asyncio.sleep(0.05)
                    nxt = perf_ns()
                    break
                te = perf_ns()
                self.steps_total += 1
                if verify:
                    expected = vin if expected is None else expected + vin
                    if not check(out, expected):  # type: ignore[arg-type]
                        self.wrong += 1
                        if len(self.samples) < cfg.max_error_samples:
                            self.samples.append(
                                f"wrong answer: seq {sid} step {k}: got {None if out is None else out.tolist()}, "
                                f"expected {expected.tolist()}"  # type: ignore[union-attr]
                            )
                if self.measuring and ts >= self.t0:
                    (self.lat_rest if k else self.lat_start).append(te - ts)
                    self.measured += 1
                    if paced:
                        self.lane_steps[lane] += 1
                        self.lag.append(ts - sched)
                        if te > sched + period:
                            self.lane_misses[lane] += 1
                    if self.target and self.measured >= self.target:
                        self.enough.set()
                nxt = sched + period
                if end:
                    self.sequences_done += 1
                    break


def _thread_delta(a: CpuSample | None, b: CpuSample | None) -> dict[str, float] | None:
    if not (a and b and a.threads is not None and b.threads is not None):
        return None
    delta = {k: v - a.threads.get(k, 0.0) for k, v in b.threads.items()}
    return {k: round(v, 3) for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0}


# progress(fraction of this run done, text)
ProgressFn = Callable[[float, str], None]
# called with "start" just before the window's CPU samples are taken and with "end" just after
# (e.g. to read the model's statistics over the same window without counting that read's CPU)
EdgeFn = Callable[[str], None]


async def run_load(
    transport: Transport,
    cfg: RunConfig,
    workload: Workload,
    ids: SequenceIds,
    server_cpu: ProcessTreeCpu | None = None,
    progress: ProgressFn | None = None,
    start_at_ns: int | None = None,
    sample_system: bool = True,
    at_edge: EdgeFn | None = None,
) -> RunResult:
    """One run (closed or paced, ``cfg.mode``) of ``cfg.concurrency`` lanes on an opened transport.
    ``start_at_ns``: perf_counter_ns at which the warm-up begins (several processes share it).
    ``at_edge``: see :data:`EdgeFn` (it runs on the event loop: keep it short)."""
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}")
    run = _Run(transport, cfg, workload, ids)
    client_cpu = ClientCpu()
    system_cpu = SystemCpu() if sample_system else None
    if start_at_ns is not None and (wait := start_at_ns - perf_ns()) > 0:
        await asyncio.sleep(wait / 1e9)
    run.t_start = start_at_ns if start_at_ns is not None else perf_ns()
    workers = [asyncio.create_task(run.worker(i)) for i in range(cfg.concurrency)]
    warm_ns = int(cfg.warmup_s * 1e9)
    dur_ns = int((cfg.duration_s or 0) * 1e9)
    total_s = cfg.warmup_s + (cfg.duration_s or 0)

    def tick(phase: str, elapsed_s: float, frac: float) -> None:
        if progress is not None:
            progress(frac, f"{phase} {elapsed_s:4.1f}s  {run.measured} steps  {run.errors} err  {run.wrong} wrong")

    while (el := perf_ns() - run.t_start) < warm_ns:
        tick("warm-up", el / 1e9, el / 1e9 / total_s if total_s else 0.0)
        await asyncio.sleep(min(0.25, (warm_ns - el) / 1e9))

    if at_edge is not None:
        at_edge("start")
    sys0 = system_cpu.sample() if system_cpu else None
    srv0: CpuSample | None = server_cpu.sample() if server_cpu else None
    cli0 = client_cpu.sample()
    run.t0 = perf_ns()
    run.measuring = True
    w_end = run.t_start + warm_ns + dur_ns  # shared by every process of the run
    while True:
        el_ns = perf_ns() - run.t0
        if cfg.steps:
            if run.enough.is_set():
                break
            tick("measuring", el_ns / 1e9, run.measured / cfg.steps)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(run.enough.wait(), 0.25)
            if all(w.done() for w in workers):
                break
        else:
            left = w_end - perf_ns()
            if left <= 0:
                break
            tick("measuring", el_ns / 1e9, (cfg.warmup_s + el_ns / 1e9) / total_s)
            await asyncio.sleep(min(0.25, left / 1e9))
    run.measuring = False
    t1 = perf_ns()
    cli1 = client_cpu.sample()
    srv1: CpuSample | None = server_cpu.sample() if server_cpu else None
    sys1 = system_cpu.sample() if system_cpu else None
    if at_edge is not None:
        at_edge("end")

    run.stop = True
    if progress is not None:
        progress(1.0, "draining")
    _, pending = await asyncio.wait(workers, timeout=cfg.drain_timeout_s)
    for w in pending:
        w.cancel()
    if pending:
        await asyncio.wait(pending)
    for w in workers:
        if not w.cancelled() and w.exception() is not None:
            run._error(w.exception())  # type: ignore[arg-type]

    paced = cfg.mode == "paced"
    engine_s, workers_s = split_delta(srv0, srv1)
    return RunResult(
        transport=cfg.transport,
        concurrency=cfg.concurrency,
        seq_len=cfg.seq_len,
        mode=cfg.mode,
        period_s=cfg.period_s if paced else None,
        label=cfg.label,
        window_s=(t1 - run.t0) / 1e9,
        start_latencies_ns=np.asarray(run.lat_start, dtype=np.int64),
        rest_latencies_ns=np.asarray(run.lat_rest, dtype=np.int64),
        lane_steps=np.asarray(run.lane_steps if paced else [], dtype=np.int64),
        lane_misses=np.asarray(run.lane_misses if paced else [], dtype=np.int64),
        send_lag_ns=np.asarray(run.lag, dtype=np.int64),
        steps_total=run.steps_total,
        sequences_done=run.sequences_done,
        errors=run.errors,
        timeouts=run.timeouts,
        wrong=run.wrong,
        verified=workload.verify,
        stuck_workers=len(pending),
        error_samples=run.samples,
        server_cpu_s=(srv1.cpu_s - srv0.cpu_s) if srv0 and srv1 else None,
        server_nprocs=srv1.nprocs if srv1 else None,
        server_threads_cpu_s=_thread_delta(srv0, srv1),
        engine_cpu_s=engine_s,
        workers_cpu_s=workers_s,
        client_cpu_s=cli1.cpu_s - cli0.cpu_s,
        system_cpu_s=(sys1.cpu_s - sys0.cpu_s) if sys0 and sys1 else None,
    )


def run_coro(coro: Any, which: str = "auto") -> tuple[Any, str]:
    """Run ``coro`` on uvloop (``auto``: when installed) or asyncio; returns (result, loop name)."""
    if which in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if which == "uvloop":
                raise
        else:
            return uvloop.run(coro), "uvloop"
    return asyncio.run(coro), "asyncio"
