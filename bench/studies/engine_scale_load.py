"""In-process load for the engine_scale study: the probe model written to a repository, a Server
started with it, sequences opened, backlogged, run in a closed loop and ended."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.studies.engine_models import PROBE_MODEL_PY, sequence_config, write_model
from bench.studies.engine_threads import CoreThreads, tids
from seqserve.api.statistics import statistics_json

perf = time.perf_counter_ns


def write_probe_model(
    root: Path,
    name: str,
    *,
    strategy: str,
    mbs: int,
    idle_us: int = 600_000_000,
    capacity: int = 0,
    instances: int = 1,
    elems: int = 1,
) -> None:
    config = sequence_config(
        name, mbs=mbs, strategy=strategy, capacity=capacity, idle_us=idle_us, instances=instances, state_elems=elems
    )
    write_model(root, name, config, PROBE_MODEL_PY.format(name=name))


def x1() -> np.ndarray:
    return np.ones((1, 1), np.float32)


def _consume(fut: Any) -> None:
    if not fut.cancelled():
        fut.exception()  # failed at shutdown: retrieved, so asyncio does not log each one


def start_backlogged(server: Any, name: str, ids: list[int]) -> list[Any]:
    """START for every id without waiting (Direct: those that find no slot stay in the backlog)."""
    out = [server.submit(name, {"INPUT": x1()}, sequence_id=s, sequence_start=True) for s in ids]
    for f in out:
        f.add_done_callback(_consume)
    return out


# ----------------------------------------------------------------------------------- helpers


async def closed_loop(
    server: Any, model: str, ids: list[int], seconds: float, started: bool, warmup: float = 0.5
) -> dict[str, Any]:
    """``ids`` sequences in a closed loop for ``seconds`` (they START first unless ``started``);
    each is left open. Returns steps/s, latency and process CPU per step."""
    lats: list[int] = []
    stop = False
    submit = server.submit
    bad = [0]

    async def one(sid: int) -> None:
        first = not started
        expected = None
        while not stop:
            t0 = perf()
            r = await submit(model, {"INPUT": x1()}, sequence_id=sid, sequence_start=first)
            lats.append(perf() - t0)
            out = float(r.outputs["OUTPUT"][0, 0])
            if expected is not None and out != expected + 1.0:
                bad[0] += 1
            expected = out
            first = False

    def counts() -> tuple[int, int]:
        st = statistics_json(server.statistics(model))["model_stats"][0]
        return st["execution_count"], st["inference_count"]

    tasks = [asyncio.create_task(one(s)) for s in ids]
    await asyncio.sleep(warmup)
    e0, i0 = counts()
    n0, c0, t0 = len(lats), time.process_time_ns(), perf()
    marks = [(n0, t0)]
    while (perf() - t0) / 1e9 < seconds:  # sub-windows: their median rate shrugs off bursts of other load
        await asyncio.sleep(0.2)
        marks.append((len(lats), perf()))
    n1, c1, t1 = len(lats), time.process_time_ns(), perf()
    e1, i1 = counts()
    stop = True
    await asyncio.gather(*tasks)
    window = np.asarray(lats[n0:n1], np.int64)
    n = max(1, n1 - n0)
    if bad[0]:
        raise RuntimeError(f"{bad[0]} wrong running sums")
    rates = [(b[0] - a[0]) / ((b[1] - a[1]) / 1e9) for a, b in itertools.pairwise(marks)]
    return {
        "steps": n1 - n0,
        "steps_per_s": float(np.median(rates)) if rates else 0.0,
        "steps_per_s_mean": (n1 - n0) / ((t1 - t0) / 1e9),
        "p50_us": float(np.percentile(window, 50) / 1e3) if window.size else float("nan"),
        "p99_us": float(np.percentile(window, 99) / 1e3) if window.size else float("nan"),
        "cpu_us_per_step": (c1 - c0) / n / 1e3,
        "rows_per_batch": (i1 - i0) / max(1, e1 - e0),
    }


async def end_sequences(server: Any, model: str, ids: list[int]) -> None:
    await asyncio.gather(*(server.submit(model, {"INPUT": x1()}, sequence_id=s, sequence_end=True) for s in ids))


async def open_in_slots(server: Any, model: str, ids: range | list[int], chunk: int = 1024) -> float:
    """START (one step) for every id, ``chunk`` at a time; returns seconds."""
    t0 = perf()
    ids = list(ids)
    for i in range(0, len(ids), chunk):
        await asyncio.gather(
            *(server.submit(model, {"INPUT": x1()}, sequence_id=s, sequence_start=True) for s in ids[i : i + chunk])
        )
    return (perf() - t0) / 1e9


async def start_server(repo: Path, names: list[str]) -> tuple[Any, dict[str, CoreThreads]]:
    from seqserve.engine import Server

    # no bound on the backlog: the sections measure 100,000 backlogged sequences
    server = Server(repo, max_backlog_sequences=0)
    await server.start(models=[])
    threads = {}
    for name in names:
        before = tids()
        await server.load_model(name)
        threads[name] = CoreThreads(before, name)
    return server, threads


async def warm_imports(root: Path, strategy: str, elems: int) -> None:
    """Load and drop a tiny model once, so that imports and first-use allocations are not counted."""
    write_probe_model(root, "warm", strategy=strategy, mbs=8, capacity=16, elems=elems)
    server, _ = await start_server(root, ["warm"])
    await open_in_slots(server, "warm", range(1, 9))
    await closed_loop(server, "warm", list(range(1, 9)), 0.2, started=True)
    await end_sequences(server, "warm", list(range(1, 9)))
    await server.shutdown(timeout_s=5)
