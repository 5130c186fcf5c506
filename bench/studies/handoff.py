"""What the state store costs a replica (docs/state-store.md), in-process, on the demo accumulator:

    python -m bench.studies.handoff redis      # starts a throwaway redis-server (needs it installed)
    python -m bench.studies.handoff dir        # a dir:// store in a temporary folder

- steady step, without and with a store attached: one sequence live on its replica, 1000
  sequential steps per round, 5 alternating rounds (the common path the store must not slow);
- handover step: one session whose steps alternate between two replicas, so that every step
  asks the live owner to hand the sequence over (40 steps);
- step of a released sequence: checkpointed and released into the store, then its next step
  claims, restores and runs it (40 sequences);
- START: one new sequence's first step, without and with a store (it waits for its ownership
  record: one round trip), 200 sequential per round, and 8 at once (they share round trips);
- ``_needs_store``: the check every step without START pays with a store attached (timeit).
Each step's running sum is checked. Medians and spread; the machine's load moves them.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path

import numpy as np

from seqserve.engine import InferResult, Server, open_store
from seqserve.engine.replicas.store import SequenceKey
from seqserve.engine.request import InferRequest, SequenceId

DEMO = Path(__file__).resolve().parents[2] / "src" / "seqserve" / "examples" / "models"


async def step(s: Server, sid: SequenceId, *, start: bool = False, session: bool = False) -> InferResult:
    r = InferRequest(
        "accumulator", {"INPUT": np.ones((1, 1), np.float32)}, sequence_id=sid, sequence_start=start, session=session
    )
    return await s.enqueue(r)


async def replica(url: str | None, name: str) -> Server:
    s = Server(DEMO, exit_timeout_s=5)
    await s.start(["accumulator"])
    if url:
        await s.enable_state_store(open_store(url, name))
    return s


async def steady(s: Server, n: int = 1000) -> float:
    sid = uuid.uuid4().int % (1 << 60) + 1
    await step(s, sid, start=True)
    t = time.perf_counter()
    for _ in range(n):
        await step(s, sid)
    return (time.perf_counter() - t) / n * 1e6


async def starts(s: Server, n: int = 200) -> float:
    """Median latency (us) of a START, each of a new sequence (ended afterwards, untimed)."""
    lat = []
    for _ in range(n):
        sid = uuid.uuid4().int % (1 << 60) + 1
        t = time.perf_counter()
        await step(s, sid, start=True)
        lat.append((time.perf_counter() - t) * 1e6)
        await s.enqueue(
            InferRequest("accumulator", {"INPUT": np.ones((1, 1), np.float32)}, sequence_id=sid, sequence_end=True)
        )
    return statistics.median(lat)


async def burst(s: Server, n: int = 8) -> float:
    """Wall time (us) per START of ``n`` STARTs sent at once (fewer than the free slots; ended
    afterwards, untimed)."""
    ids = [uuid.uuid4().int % (1 << 60) + 1 for _ in range(n)]
    t = time.perf_counter()
    await asyncio.gather(*(step(s, sid, start=True) for sid in ids))
    dt = (time.perf_counter() - t) / n * 1e6
    for sid in ids:
        await s.enqueue(
            InferRequest("accumulator", {"INPUT": np.ones((1, 1), np.float32)}, sequence_id=sid, sequence_end=True)
        )
    return dt


def spread(v: list[float]) -> str:
    return f"median {statistics.median(v):.2f}, range {min(v):.2f}-{max(v):.2f}"


async def main(url: str) -> None:
    plain, a = await replica(None, ""), await replica(url, "A")
    rounds: dict[str, list[float]] = {"without a store": [], "with a store": []}
    for _ in range(5):
        rounds["without a store"].append(await steady(plain))
        rounds["with a store"].append(await steady(a))
    for k, v in rounds.items():
        print(f"steady step, {k} (us): {spread(v)}")
    start_rounds: dict[str, list[float]] = {"without a store": [], "with a store": []}
    burst_rounds: dict[str, list[float]] = {"without a store": [], "with a store": []}
    for _ in range(5):
        for k, srv in (("without a store", plain), ("with a store", a)):
            start_rounds[k].append(await starts(srv))
            burst_rounds[k].append(await burst(srv))
    for k, v in start_rounds.items():
        print(f"START of a new sequence, {k} (us, median of 200 per round): {spread(v)}")
    for k, v in burst_rounds.items():
        print(f"8 STARTs at once, {k} (us per START): {spread(v)}")
    b = await replica(url, "B")
    sid = "hv-" + uuid.uuid4().hex[:6]
    await step(a, sid, session=True)
    await asyncio.sleep(0.2)  # the registration reaches the store
    lat = []
    for i in range(40):
        t = time.perf_counter()
        r = await step(b if i % 2 == 0 else a, sid, session=True)
        lat.append((time.perf_counter() - t) * 1e3)
        assert float(r.outputs["OUTPUT"].reshape(-1)[0]) == i + 2
    print(f"handover step (ms): {spread(lat)}")
    h = a.replicas
    assert h is not None
    m = a.model("accumulator")
    lat = []
    for i in range(40):
        sid2 = 100000 + i
        await step(a, sid2, start=True)
        key = SequenceKey("accumulator", 1, sid2)
        ckpt = await h._checkpoint(m, key, time.monotonic() + 1)
        assert ckpt is not None
        await h.release_later(m, key, ckpt)
        t = time.perf_counter()
        r = await step(a, sid2)
        lat.append((time.perf_counter() - t) * 1e3)
        assert float(r.outputs["OUTPUT"].reshape(-1)[0]) == 2.0
    print(f"step of a released sequence: claim + restore + step (ms): {spread(lat)}")
    req = InferRequest("accumulator", {"INPUT": np.ones((1, 1), np.float32)}, sequence_id=sid2)
    n = 200_000
    checks = [timeit.timeit(lambda: h.arrivals._needs_store(m, req), number=n) / n * 1e9 for _ in range(3)]
    print(f"_needs_store on a live sequence (ns): {spread(checks)}")
    for s in (plain, a, b):
        await s.shutdown(timeout_s=2)


def run(kind: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        if kind == "redis":
            from tests.support.redis_server import redis_server

            with redis_server(Path(d)) as url:
                asyncio.run(main(url))
        elif kind == "dir":
            asyncio.run(main(f"dir://{d}/store"))
        else:
            raise SystemExit("usage: python -m bench.studies.handoff redis|dir")


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "redis")
