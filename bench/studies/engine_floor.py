"""The engine study's path (c), the floor: (b)'s batches replayed in one thread with the core
removed, one Python call per batch that copies the batch's bytes; (b) - (c) is the core's cost."""

from __future__ import annotations

import argparse
import gc
import queue
import time
from typing import Any

import numpy as np

from bench.studies.engine_workload import Rep, Summary, Workload, progress, summarize

perf = time.perf_counter_ns


class FakeBatch:
    __slots__ = ("dst", "handles", "src")

    def __init__(self, handles: list[int], src: np.ndarray, dst: np.ndarray) -> None:
        self.handles, self.src, self.dst = handles, src, dst


def floor_rep(wl: Workload, batches: list[list[int]]) -> Rep:
    """Replays (b)'s batches in one thread: the same driver bookkeeping, no core, and per batch
    one Python call that copies the batch's input bytes into a preallocated buffer."""
    n, steps, nseq = wl.n, wl.steps, wl.nseq
    width = max(len(b) for b in batches)
    src_all = np.random.default_rng(wl.seed).standard_normal((width, 1), dtype=np.float32)
    dst_all = np.empty((width, 1), np.float32)
    views = {b: (src_all[:b], dst_all[:b]) for b in range(1, width + 1)}
    fakes = [FakeBatch(hs, *views[len(hs)]) for hs in batches]
    rec: list[Any] = []
    rec_append = rec.append
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    put, q_get = q.put, q.get
    copyto = np.copyto

    def runner(cb: FakeBatch) -> bool:
        t = perf()
        hs = cb.handles
        copyto(cb.dst, cb.src)
        rec_append((t, hs))
        put(hs)
        return True

    first = min(wl.depth, steps)
    t_sub = [0] * n
    c0 = time.process_time_ns()
    t0 = perf()
    for s in range(nseq):
        for k in range(first):
            t_sub[s * steps + k] = perf()
    next_step = [first] * nseq
    done = 0
    for fb in fakes:
        runner(fb)
        hs = q_get()
        for h in hs:
            if h:
                done += 1
                s = (h - 1) // steps
                k = next_step[s]
                if k < steps:
                    h2 = s * steps + k + 1
                    t_sub[h2 - 1] = perf()
                    next_step[s] = k + 1
    wall = perf() - t0
    cpu = time.process_time_ns() - c0
    t_done = np.zeros(n, np.int64)
    for t, hs in rec:
        for h in hs:
            if h:
                t_done[h - 1] = t
    return Rep(np.array(t_sub, np.int64), t_done, wall, cpu_ns=cpu)


def run_floor(wl: Workload, core_reps: list[Rep], args: argparse.Namespace) -> Summary:
    floor_rep(wl, core_reps[0].batches or [])  # warm-up
    reps = []
    for i, cr in enumerate(core_reps):
        gc.collect()
        r = floor_rep(wl, cr.batches or [])
        progress("c", wl, i + 1, len(core_reps), r)
        reps.append(r)
    return summarize("(c) floor", wl, reps, args)
