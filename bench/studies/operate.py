"""What operating a server costs: a metrics scrape, a sequence listing, remembered sessions.

    python -m bench.studies.operate            # about half a minute

- scrape: ``exposition(SeqserveCollector(server))`` on the demo repository (a version of each demo model),
  all of Triton's families plus the histogram: the time the event loop spends per scrape, and
  ``Server.model_counters()`` alone (the core reads).
- listing: ``Scheduler.list_sequences(limit)`` with ``--live`` sequences live (one in a slot, the
  rest backlogged), for limits 1000 and 10000: the time the loop spends per listing.
- tombstones: resident memory after ``--live`` one-request sessions ended (ids of 12
  characters), against the same run without sessions.

Each timing is the median of ``--reps`` runs. Memory runs each in a fresh process.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

I32 = np.dtype(np.int32)
DEMO = Path(__file__).resolve().parents[2] / "src" / "seqserve" / "examples" / "models"


def median_us(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


async def scrape(reps: int) -> None:
    from seqserve.api.metrics import MetricsConfig, SeqserveCollector, exposition
    from seqserve.engine import Server

    server = Server(DEMO)
    await server.start()
    try:
        collector = SeqserveCollector(server, MetricsConfig(histogram_latencies=True))
        body = exposition(collector)
        n = len(server.model_counters())
        print(f"scrape: {n} model versions, {len(body)} bytes")
        print(f"  exposition       {median_us(lambda: exposition(collector), reps):8.0f} us")
        print(f"  model_counters   {median_us(server.model_counters, reps):8.0f} us")
    finally:
        await server.shutdown(timeout_s=0)


def _scheduler(**kw: Any) -> tuple[Any, threading.Event]:
    from seqserve.engine import _core

    spec = _core.ModelSpec(
        name="m",
        strategy=_core.Strategy.DIRECT,
        max_batch_size=1,
        slots_per_instance=1,
        inputs=[_core.InputSpec(name="X", dtype=I32, default_shape=[1])],
        **kw,
    )
    go = threading.Event()

    def run(b: _core.Batch) -> bool:
        go.wait()
        b.finish(True)
        return True

    s = _core.Scheduler(spec, runner=run, on_fail=lambda *a: None, on_warning=lambda m: None)
    s.start()
    return s, go


def listing(live: int, reps: int) -> None:
    from seqserve.engine import _core

    s, go = _scheduler()
    arr = np.array([[1]], np.int32)
    for i in range(live):
        header = _core.RequestHeader(handle=i + 1, sequence_id=f"seq-{i:08d}", start=True)
        assert isinstance(s.submit(header, (arr,)), int)  # accepted
    print(f"listing: {live} live sequences")
    for limit in (1000, 10_000):
        us = median_us(functools.partial(s.list_sequences, limit), reps)
        print(f"  limit {limit:6d}     {us:8.0f} us")
    go.set()
    s.close(True)


def memory_child(live: int, session: bool) -> None:
    from seqserve.engine import _core

    s, go = _scheduler(max_tombstones=live)
    go.set()
    arr = np.array([[1]], np.int32)
    ids = [f"seq-{i:08d}" for i in range(live)]

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

    base = rss()
    for i in range(live):
        s.submit(_core.RequestHeader(handle=i + 1, sequence_id=ids[i], start=True, end=True, session=session), (arr,))
        if i % 1000 == 0:
            while s.pending_requests() > 100:
                time.sleep(0.001)
    while s.pending_requests():
        time.sleep(0.01)
    print(rss() - base)
    s.close(True)


def memory(live: int) -> None:
    got = {}
    for session in (False, True):
        out = subprocess.run(
            [sys.executable, "-m", "bench.studies.operate", "--memory-child", str(live), str(int(session))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        got[session] = int(out.split()[-1])
    delta = got[True] - got[False]
    print(f"tombstones: {live} ended sessions remembered")
    print(f"  resident memory  {delta / 1e6:8.1f} MB ({delta / live:.0f} bytes each)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--live", type=int, default=100_000)
    p.add_argument("--memory-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], bool(args.memory_child[1]))
        return
    import logging

    logging.basicConfig(level=logging.WARNING)
    asyncio.run(scrape(args.reps))
    listing(args.live, max(5, args.reps // 5))
    if Path("/proc/self/statm").exists():
        memory(args.live)


if __name__ == "__main__":
    main()
