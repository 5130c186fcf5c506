"""What a process's threads and memory cost, read from /proc and the per-thread CPU clocks: the
engine_scale study tells the core's executor threads from its reaper with :class:`CoreThreads`."""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from typing import Any

perf = time.perf_counter_ns
PAGE = os.sysconf("SC_PAGE_SIZE")


def probe(name: str) -> Any:
    for mod in list(sys.modules.values()):
        if getattr(mod, "SCALE_PROBE_MODEL", None) == name:
            return mod
    raise RuntimeError(f"model module of {name!r} not found")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def tids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


def thread_cpu_ns(tid: int) -> int:
    """CPU time of one thread of this process, ns (its per-thread CPU clock; /proc as a fallback)."""
    try:
        return time.clock_gettime_ns(((~tid) << 3) | 6)  # MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)
    except OSError:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])


class CoreThreads:
    """The core's threads of one model: those that appeared while it loaded, split into executors
    (the model saw itself run there) and the rest (the reaper)."""

    def __init__(self, before: set[int], name: str) -> None:
        self.before = before
        self.name = name
        self.new = tids() - before

    def split(self) -> tuple[set[int], set[int]]:
        execs = set(probe(self.name).TIDS)
        py = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        return execs & self.new, self.new - execs - py

    def sample(self) -> dict[str, int]:
        execs, others = self.split()
        return {
            "executor": sum(thread_cpu_ns(t) for t in execs),
            "reaper": sum(thread_cpu_ns(t) for t in others),
            "process": time.process_time_ns(),
            "wall": perf(),
            "reaper_threads": len(others),
        }


def cpu_delta(a: dict[str, int], b: dict[str, int]) -> dict[str, float]:
    wall = (b["wall"] - a["wall"]) / 1e9
    return {
        "window_s": wall,
        "reaper_ms": (b["reaper"] - a["reaper"]) / 1e6,
        "executor_ms": (b["executor"] - a["executor"]) / 1e6,
        "process_ms": (b["process"] - a["process"]) / 1e6,
        "reaper_threads": b["reaper_threads"],
    }


def settle_rss() -> int:
    gc.collect()
    return rss()
