"""Engine micro-benchmarks in one process, no network: where a step's time goes, and what 100,000
live sequences cost.

    python -m bench.engine_scale                        # all sections, about a minute
    python -m bench.engine_scale --sections split --split-steps 2000
    python -m bench.engine_scale --sections live,reap --counts 1000,100000 --json out.json

Every section drives ``seqserve.engine.Server`` in process (``await server.submit(...)`` on a
uvloop loop) with an accumulator-like python model: FP32 ``INPUT`` [1] -> ``OUTPUT`` [1], and an
implicit FP32 state of ``--state-elems`` elements (``--state-elems`` x 4 bytes per sequence).

split  per-step cost split, Direct, ``--split-mbs`` slots, that many sequences in a closed loop:
       enqueue (own timestamps around ``Server.submit``), queue wait (stats ``queue``), batch
       assembly (stats ``compute_input``: state reset + gather), execute call (stats
       ``compute_infer`` minus the model body, which the model times itself), scatter (stats
       ``compute_output``: output state + splitting the outputs per request) and completion
       (own: the awaiting caller sees its reply, minus the model's exit, minus scatter). Per batch
       and per step (= per batch / real rows).

live   N live sequences, most idle, in two layouts (each run in a fresh process, so RSS deltas
       are its own):
         direct  Direct, max_batch_size 64, 1 instance: 64 slots. ``--active`` sequences take slots
                 first; of the N idle ones the first fill the remaining slots (and sit idle there),
                 the rest wait in the backlog, each with its START request pending (a client that
                 sent START and waits): Direct has no other place for a sequence without a slot.
         oldest  Oldest, max_batch_size 64, ``max_candidate_sequences`` = N + active: every
                 sequence holds a slot; an idle one ran its START step and then sends nothing
                 (a paused stream), so nothing of it is queued.
       Reports: time to open the N (slot assignment / backlog insertion, per sequence); memory per
       idle sequence = RSS delta (model load + opening the N) / N, minus the state bytes; the
       throughput of ``--active`` closed-loop sequences with no idle ones, then with the N; the
       core's non-executor thread CPU (the idle reaper) during an idle window; direct only: backlog
       hand-off (a slot's sequence ends -> the backlog's first sequence runs its START there).
reap   idle reaping cost as the number of sequences grows (``--counts``), Oldest layout (every
       sequence in a slot), in a fresh process each:
         none expiring  idle timeout 600 s; N idle sequences; CPU over an idle window.
         some expiring  ``--expiring`` sequences opened over 0.5 s, then (1 s later) N more; the
                        idle timeout is set so that the first ones expire inside the window and
                        the N do not. Reaping cost must not grow with N.
       and, for comparison, direct-layout "none expiring" (N - 64 in the backlog).

CPU of the reaper: the core starts one executor thread per instance and (Direct/Oldest) one reaper
thread, all C++ threads; the core does not name them or give their ids, so the benchmark takes the
threads that appeared when the model loaded, drops those the model saw itself executing in and
those Python knows (``threading.enumerate()``), and reads what is left ("reaper") with per-thread
CPU clocks (ns resolution). Process CPU (all threads) is reported next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.api.statistics import statistics_json

perf = time.perf_counter_ns
PAGE = os.sysconf("SC_PAGE_SIZE")
SLOTS_DIRECT = 64

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  state [ {{
    input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ {elems} ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ {elems} ] zero_data: true }}
  }} ]
}}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
"""

MODEL_PY = """\
import threading
import time

SCALE_PROBE_MODEL = {name!r}
PROBE = []  # per batch, while RECORD[0]: (t_enter_ns, t_exit_ns, corrid, ready)
RECORD = [False]
TIDS = set()  # native ids of the threads execute() ran on
_perf = time.perf_counter_ns
_tid = threading.get_native_id


class Model:
    def execute(self, batch):
        t0 = _perf()
        TIDS.add(_tid())
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        out = {{"OUTPUT": total[:, :1], "SUM_OUT": total}}
        if RECORD[0]:
            PROBE.append((t0, _perf(), batch.corrid.copy(), batch.ready.copy()))
        return out
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_model(
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
    strat = "direct { }" if strategy == "direct" else f"oldest {{ max_candidate_sequences: {capacity} }}"
    d = root / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(
        CONFIG.format(name=name, mbs=mbs, idle_us=idle_us, strategy=strat, elems=elems, instances=instances)
    )
    (d / "1" / "model.py").write_text(MODEL_PY.format(name=name))


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


def settle_rss() -> int:
    gc.collect()
    return rss()


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
    write_model(root, "warm", strategy=strategy, mbs=8, capacity=16, elems=elems)
    server, _ = await start_server(root, ["warm"])
    await open_in_slots(server, "warm", range(1, 9))
    await closed_loop(server, "warm", list(range(1, 9)), 0.2, started=True)
    await end_sequences(server, "warm", list(range(1, 9)))
    await server.shutdown(timeout_s=5)


# ------------------------------------------------------------------------------------ split


async def section_split(args: argparse.Namespace) -> dict[str, Any]:
    mbs, steps, reps = args.split_mbs, args.split_steps, args.reps
    name = f"split_b{mbs}"
    with tempfile.TemporaryDirectory(prefix="seqserve-scale-") as tmp:
        write_model(Path(tmp), name, strategy="direct", mbs=mbs, elems=args.state_elems)
        server, _ = await start_server(Path(tmp), [name])
        mod = probe(name)
        per_rep: list[dict[str, Any]] = []
        try:
            for rep in range(reps + 1):
                per_rep.append(await _split_rep(server, name, mod, mbs, steps, base=(rep + 1) * 1_000_000))
                log(f"  split rep {rep}{' (warm-up)' if rep == 0 else ''}: {per_rep[-1]['steps_per_s']:,.0f} steps/s")
        finally:
            await server.shutdown(timeout_s=5)
    measured = per_rep[1:]
    out = {k: float(np.median([r[k] for r in measured])) for k in measured[0] if k != "rows"}
    out["rows"] = float(np.mean([r["rows"] for r in measured]))
    out.update(mbs=mbs, sequences=mbs, steps=steps, reps=reps)
    return out


def _batch_totals(stats: dict[str, Any]) -> dict[str, int]:
    tot = {"executions": stats["execution_count"], "inferences": stats["inference_count"]}
    for key in ("compute_input", "compute_infer", "compute_output"):
        tot[key] = sum(b[key]["ns"] for b in stats["batch_stats"])
    tot["queue_ns"] = stats["inference_stats"]["queue"]["ns"]
    tot["queue_count"] = stats["inference_stats"]["queue"]["count"]
    return tot


async def _split_rep(server: Any, name: str, mod: Any, nseq: int, steps: int, base: int) -> dict[str, Any]:
    per_seq = max(2, steps // nseq)
    n = per_seq * nseq
    t_sub0 = np.zeros(n, np.int64)
    t_sub1 = np.zeros(n, np.int64)
    t_done = np.zeros(n, np.int64)
    submit = server.submit
    wrong = [0]

    async def seq(s: int) -> None:
        expected = 0.0
        for k in range(per_seq):
            i = s * per_seq + k
            arr = x1()
            t_sub0[i] = perf()
            fut = submit(
                name, {"INPUT": arr}, sequence_id=base + s, sequence_start=k == 0, sequence_end=k == per_seq - 1
            )
            t_sub1[i] = perf()
            r = await fut
            t_done[i] = perf()
            expected += 1.0
            if float(r.outputs["OUTPUT"][0, 0]) != expected:
                wrong[0] += 1

    gc.collect()
    before = _batch_totals(statistics_json(server.statistics(name))["model_stats"][0])
    mod.PROBE.clear()
    mod.RECORD[0] = True
    c0, w0 = time.process_time_ns(), perf()
    await asyncio.gather(*(seq(s) for s in range(nseq)))
    c1, w1 = time.process_time_ns(), perf()
    mod.RECORD[0] = False
    after = _batch_totals(statistics_json(server.statistics(name))["model_stats"][0])
    if wrong[0]:
        raise RuntimeError(f"split: {wrong[0]} wrong running sums")
    d = {k: after[k] - before[k] for k in after}
    ex, inf = max(1, d["executions"]), max(1, d["inferences"])
    # requests -> the batch they ran in (k-th appearance of a sequence id = its step k)
    exit_of = np.zeros(n, np.int64)
    batch_of = np.zeros(n, np.int64)
    seen = [0] * nseq
    body = []
    for b, (t_in, t_out, corrid, ready) in enumerate(mod.PROBE):
        body.append(t_out - t_in)
        for c, ok in zip(corrid.tolist(), ready.tolist(), strict=True):
            if ok and base <= int(c) < base + nseq:
                s = int(c) - base
                if seen[s] < per_seq:
                    exit_of[s * per_seq + seen[s]] = t_out
                    batch_of[s * per_seq + seen[s]] = b
                    seen[s] += 1
    first_done = np.full(len(mod.PROBE), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first_done, batch_of, t_done)
    used = first_done < np.iinfo(np.int64).max
    exits = np.array([t[1] for t in mod.PROBE], np.int64)
    body_ns = float(np.mean(body)) if body else 0.0
    scatter_batch = d["compute_output"] / ex
    lat = t_done - t_sub0
    return {
        "rows": inf / ex,
        "batches": d["executions"],
        "enqueue_us": float(np.mean(t_sub1 - t_sub0) / 1e3),
        "queue_us": d["queue_ns"] / max(1, d["queue_count"]) / 1e3,
        "assembly_batch_us": d["compute_input"] / ex / 1e3,
        "execute_call_batch_us": (d["compute_infer"] / ex - body_ns) / 1e3,
        "model_body_batch_us": body_ns / 1e3,
        "scatter_batch_us": scatter_batch / 1e3,
        "completion_us": float(np.mean(t_done - exit_of) - scatter_batch) / 1e3,
        "completion_first_us": float(np.mean(first_done[used] - exits[used]) - scatter_batch) / 1e3,
        "latency_p50_us": float(np.percentile(lat, 50) / 1e3),
        "latency_p99_us": float(np.percentile(lat, 99) / 1e3),
        "steps_per_s": n / ((w1 - w0) / 1e9),
        "cpu_us_per_step": (c1 - c0) / n / 1e3,
        "wall_us_per_step": (w1 - w0) / n / 1e3,
    }


# ------------------------------------------------------------------------------------- live


async def child_live(p: dict[str, Any]) -> dict[str, Any]:
    """Two models of the same config on one server: ``base`` (only the active sequences) and ``idle``
    (the active ones + the N idle). Throughput windows alternate between them, so both see the same
    background load; RSS deltas are taken around loading ``idle`` and opening its N sequences."""
    layout, n, active, elems = p["layout"], p["n"], p["active"], p["state_elems"]
    with tempfile.TemporaryDirectory(prefix="seqserve-scale-") as tmp:
        root = Path(tmp)
        await warm_imports(root / "warm", layout, elems)
        capacity = n + active
        for name in ("base", "idle"):
            write_model(root / "repo", name, strategy=layout, mbs=64, capacity=capacity, elems=elems)
        server, _ = await start_server(root / "repo", ["base"])
        act = list(range(1, active + 1))
        out: dict[str, Any] = {"layout": layout, "n": n, "active": active, "state_bytes": 4 * elems}
        try:
            await closed_loop(server, "base", act, 0.5, started=False)  # warm-up
            rss0 = settle_rss()
            before = tids()
            await server.load_model("idle")
            th = CoreThreads(before, "idle")
            rss1 = settle_rss()
            m = server.model("idle")
            await closed_loop(server, "idle", act, 0.3, started=False)  # its active sequences hold slots first
            idle_ids = list(range(10_000_000, 10_000_000 + n))
            pending: list[Any] = []
            if layout == "oldest":
                out["open_s"] = await open_in_slots(server, "idle", idle_ids)
                out["slots"] = capacity
            else:
                t0 = perf()
                pending = start_backlogged(server, "idle", idle_ids)
                out["open_s"] = (perf() - t0) / 1e9
                out["slots"] = SLOTS_DIRECT
                await asyncio.sleep(0.2)  # the ones that got a slot run their START
            out["in_slots_idle"] = n if layout == "oldest" else sum(f.done() for f in pending)
            out["backlog"] = m._core.backlog_sequences()
            out["live"] = m.inflight_sequences
            await asyncio.sleep(0.3)
            rss2 = settle_rss()
            out.update(rss0=rss0, rss1=rss1, rss2=rss2)
            out["bytes_per_idle"] = (rss2 - rss0) / n
            out["capacity_bytes"] = rss1 - rss0
            out["open_bytes_per_idle"] = (rss2 - rss1) / n
            a = th.sample()
            await asyncio.sleep(p["idle_window"])
            out["idle_cpu"] = cpu_delta(a, th.sample())
            runs: dict[str, list[dict[str, Any]]] = {"base": [], "idle": []}
            for _ in range(p["alternations"]):
                for name in ("base", "idle"):
                    runs[name].append(
                        await closed_loop(server, name, act, p["seconds"] / p["alternations"], True, warmup=0.1)
                    )
            for name, key in (("base", "base"), ("idle", "with_idle")):
                rs = runs[name]
                out[key] = {k: float(np.median([r[k] for r in rs])) for k in rs[0]}
                out[key]["windows_steps_per_s"] = [round(r["steps_per_s"]) for r in rs]
            if layout == "direct" and pending:
                out["py_bytes_per_backlogged"] = py_bytes_per_backlogged(server, "idle")
                out["handoff_us"] = await _handoff_chain(server, "idle", act[0], idle_ids, pending, p["handoffs"])
            await end_sequences(server, "base", act)
            await end_sequences(server, "idle", act[1:] if "handoff_us" in out else act)
        finally:
            await server.shutdown(timeout_s=0.5)
        return out


def py_bytes_per_backlogged(server: Any, name: str, count: int = 5000) -> float:
    """Python-side bytes of one backlogged START request (its future, pending record, input array):
    tracemalloc around ``count`` more of them (the core's own allocations are not traced)."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    t0 = tracemalloc.get_traced_memory()[0]
    extra = start_backlogged(server, name, list(range(30_000_000, 30_000_000 + count)))
    t1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del extra
    return (t1 - t0) / count


async def _handoff_chain(
    server: Any, name: str, first: int, idle_ids: list[int], pending: list[Any], count: int
) -> dict[str, float]:
    """End the slot-holding sequence ``first``; the backlog's first sequence takes its slot and runs
    its START; end that one; and so on. Per hand-off: END submitted -> successor's START reply."""
    queue = [(s, f) for s, f in zip(idle_ids, pending, strict=True) if not f.done()]
    cur = first
    times = []
    for s, fut in queue[:count]:
        t0 = perf()
        await server.submit(name, {"INPUT": x1()}, sequence_id=cur, sequence_end=True)
        await fut
        times.append(perf() - t0)
        cur = s
    await server.submit(name, {"INPUT": x1()}, sequence_id=cur, sequence_end=True)
    arr = np.asarray(times, np.int64) / 1e3
    return {"count": len(times), "p50": float(np.median(arr)), "mean": float(arr.mean())} if times else {}


# ------------------------------------------------------------------------------------- reap


async def child_reap(p: dict[str, Any]) -> dict[str, Any]:
    layout, n, kind, elems = p["layout"], p["n"], p["kind"], p["state_elems"]
    e = p["expiring"] if kind == "some" else 0
    grow, hold = 0.5, 1.0  # the expiring ones open over `grow` s; the N open `hold` s later
    idle_us = 600_000_000
    if kind == "some":  # the N must be open before the window starts, and not expire inside it
        idle_us = int((grow + hold + 1.5 * p["open_s_hint"] + 1.0) * 1e6)
    elif kind == "backlog":  # Direct: the backlog waits longer than the idle timeout
        idle_us = 2_000_000
    with tempfile.TemporaryDirectory(prefix="seqserve-scale-") as tmp:
        root = Path(tmp)
        await warm_imports(root / "warm", layout, elems)
        name = f"reap_{layout}"
        write_model(root / "repo", name, strategy=layout, mbs=64, capacity=n + e, idle_us=idle_us, elems=elems)
        server, threads = await start_server(root / "repo", [name])
        m = server.model(name)
        th = threads[name]
        out: dict[str, Any] = {"layout": layout, "n": n, "kind": kind, "expiring": e, "idle_s": idle_us / 1e6}
        try:
            if kind == "none":
                ids = list(range(10_000_000, 10_000_000 + n))
                if layout == "oldest":
                    out["open_s"] = await open_in_slots(server, name, ids)
                else:
                    t0 = perf()
                    start_backlogged(server, name, ids)
                    out["open_s"] = (perf() - t0) / 1e9
                await asyncio.sleep(0.3)
                a = th.sample()
                await asyncio.sleep(p["window"])
                out["cpu"] = cpu_delta(a, th.sample())
            elif kind == "backlog":
                # 64 sequences hold every slot (a step each every 0.25 s keeps them from expiring);
                # the N wait in the backlog past their idle deadline: not reaped, re-checked
                keep = list(range(1, SLOTS_DIRECT + 1))
                await open_in_slots(server, name, keep)
                stop = asyncio.Event()

                async def keepalive() -> None:
                    while not stop.is_set():
                        await asyncio.gather(*(server.submit(name, {"INPUT": x1()}, sequence_id=s) for s in keep))
                        await asyncio.sleep(0.25)

                ka = asyncio.create_task(keepalive())
                t0 = perf()
                for i in range(10_000_000, 10_000_000 + n, 2000):  # let the keep-alive run in between
                    start_backlogged(server, name, list(range(i, min(i + 2000, 10_000_000 + n))))
                    await asyncio.sleep(0)
                out["open_s"] = (perf() - t0) / 1e9
                out["backlog"] = m._core.backlog_sequences()
                await asyncio.sleep(idle_us / 1e6 + 0.3)
                a = th.sample()
                await asyncio.sleep(p["window"])
                out["cpu"] = cpu_delta(a, th.sample())
                stop.set()
                await ka
            else:
                t_e = perf()
                step = max(1, e // 10)
                for i in range(0, e, step):
                    await open_in_slots(server, name, range(20_000_000 + i, 20_000_000 + min(e, i + step)))
                    await asyncio.sleep(grow / 10)
                await asyncio.sleep(max(0.0, hold - (perf() - t_e) / 1e9 + grow))
                t_n = perf()
                out["open_s"] = await open_in_slots(server, name, range(10_000_000, 10_000_000 + n))
                w0 = t_e + idle_us * 1000 - 100_000_000
                w1 = t_e + idle_us * 1000 + int((grow + 0.5) * 1e9)
                if perf() > w0:
                    raise RuntimeError("opening the non-expiring sequences took longer than planned")
                await asyncio.sleep((w0 - perf()) / 1e9)
                live0 = m.inflight_sequences
                a = th.sample()
                await asyncio.sleep((w1 - perf()) / 1e9)
                out["cpu"] = cpu_delta(a, th.sample())
                out["expired"] = live0 - m.inflight_sequences
                out["n_expire_after_s"] = (t_n + idle_us * 1000 - w1) / 1e9  # > 0: none of the N expired
        finally:
            await server.shutdown(timeout_s=0.5)
        return out


# ------------------------------------------------------------------------------------ driver


def run_child(kind: str, params: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.engine_scale", "--child", kind, json.dumps(params)]
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {params} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _loop_run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def fmt_split(s: dict[str, Any]) -> str:
    rows = s["rows"]
    lines = [
        f"per-step cost split: Server.submit in process, Direct, {s['mbs']} slots, {s['sequences']} sequences in "
        f"a closed loop, {s['steps']} steps x {s['reps']} reps (medians), {rows:.2f} real rows per batch",
        f"  {'stage':<28}{'per batch us':>13}{'per step us':>13}  source",
    ]

    def row(stage: str, batch: float | None, step: float, src: str) -> None:
        b = "-" if batch is None else f"{batch:.2f}"
        lines.append(f"  {stage:<28}{b:>13}{step:>13.2f}  {src}")

    row("enqueue (Server.submit)", None, s["enqueue_us"], "own timestamps around submit()")
    row("queue wait", None, s["queue_us"], "stats queue: arrival -> batch formed (waits for the batch before)")
    row("batch assembly", s["assembly_batch_us"], s["assembly_batch_us"] / rows, "stats compute_input")
    row(
        "execute call (w/o model)",
        s["execute_call_batch_us"],
        s["execute_call_batch_us"] / rows,
        "stats compute_infer - model body",
    )
    row("  model body", s["model_body_batch_us"], s["model_body_batch_us"] / rows, "own timestamps in execute()")
    row("scatter", s["scatter_batch_us"], s["scatter_batch_us"] / rows, "stats compute_output")
    row(
        "completion, 1st of batch",
        s["completion_first_us"],
        s["completion_first_us"] / rows,
        "own: first caller of the batch resumes - model exit - scatter",
    )
    row(
        "completion, mean",
        None,
        s["completion_us"],
        "own: each caller resumes - model exit - scatter (callers resume one after another)",
    )
    lines.append(
        f"  latency submit->reply p50 {s['latency_p50_us']:.1f} us, p99 {s['latency_p99_us']:.1f} us; "
        f"{s['steps_per_s']:,.0f} steps/s; CPU {s['cpu_us_per_step']:.2f} us/step (all threads), "
        f"wall {s['wall_us_per_step']:.2f} us/step"
    )
    return "\n".join(lines)


def fmt_live(rows: list[dict[str, Any]]) -> str:
    hdr = (
        f"  {'layout':<7}{'N':>8}{'slots':>8}{'backlog':>8}{'open us/seq':>12}{'B/idle seq':>11}{'- state':>9}"
        f"{'py B/req':>9}"
        f"{'capacity MB':>12}{'base st/s':>11}{'idle st/s':>11}{'ratio':>7}{'base p99':>9}{'idle p99':>9}"
        f"{'rows':>6}{'reaper ms/s':>12}{'hand-off us':>12}"
    )
    lines = [
        "live sequences: N idle + active closed-loop ones; B/idle seq = RSS delta (model load + opening) / N; "
        "'- state' = that minus the state bytes; reaper ms/s = core non-executor thread CPU per second of an "
        "idle window; hand-off = END of a slot's sequence -> the backlog's first runs its START (p50); py B/req = "
        "Python-side bytes of a backlogged START request (tracemalloc; included in B/idle seq); st/s = median of "
        "0.2 s sub-windows; rows = real rows per batch, base/idle",
        hdr,
    ]
    for r in rows:
        ho = r.get("handoff_us") or {}
        py = f"{r['py_bytes_per_backlogged']:,.0f}" if r.get("py_bytes_per_backlogged") else "-"
        lines.append(
            f"  {r['layout']:<7}{r['n']:>8,}{r['slots']:>8,}{r['backlog']:>8,}{r['open_s'] / r['n'] * 1e6:>12.1f}"
            f"{r['bytes_per_idle']:>11,.0f}{r['bytes_per_idle'] - r['state_bytes']:>9,.0f}"
            f"{py:>9}"
            f"{r['capacity_bytes'] / 2**20:>12.1f}{r['base']['steps_per_s']:>11,.0f}"
            f"{r['with_idle']['steps_per_s']:>11,.0f}{r['with_idle']['steps_per_s'] / r['base']['steps_per_s']:>7.2f}"
            f"{r['base']['p99_us']:>9,.0f}{r['with_idle']['p99_us']:>9,.0f}"
            f"{r['base']['rows_per_batch']:>3.0f}/{r['with_idle']['rows_per_batch']:<2.0f}"
            f"{r['idle_cpu']['reaper_ms'] / r['idle_cpu']['window_s']:>12.2f}"
            f"{ho.get('p50', float('nan')):>12,.0f}"
        )
    return "\n".join(lines)


KIND_LABEL = {"none": "none expiring", "some": "some expiring", "backlog": "backlog past idle t/o"}


def fmt_reap(rows: list[dict[str, Any]]) -> str:
    lines = [
        "idle reaping: core non-executor thread (reaper) and process CPU over the window; 'some expiring': the "
        "expiring sequences time out inside the window, the N do not; 'backlog past idle t/o': Direct, 64 slots "
        "kept busy, N backlogged sequences older than the 2 s idle timeout (not reaped, re-checked); process "
        "CPU there includes the 64 keep-alive steps every 0.25 s",
        f"  {'layout':<7}{'kind':<22}{'N':>8}{'expired':>8}{'window s':>9}{'reaper ms':>10}{'reaper ms/s':>12}"
        f"{'us/expiry':>10}{'process ms/s':>13}",
    ]
    for r in rows:
        c = r["cpu"]
        exp = r.get("expired", 0)
        per = f"{c['reaper_ms'] * 1e3 / exp:.1f}" if exp else "-"
        lines.append(
            f"  {r['layout']:<7}{KIND_LABEL[r['kind']]:<22}{r['n']:>8,}{exp:>8,}{c['window_s']:>9.2f}"
            f"{c['reaper_ms']:>10.2f}{c['reaper_ms'] / c['window_s']:>12.2f}{per:>10}"
            f"{c['process_ms'] / c['window_s']:>13.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        kind, params = argv[1], json.loads(argv[2])
        fn = {"live": child_live, "reap": child_reap}[kind]
        print(json.dumps(_loop_run(fn(params))))
        return 0
    doc = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.engine_scale", description=doc)
    p.add_argument("--sections", default="split,live,reap", help="comma-separated: split, live, reap")
    p.add_argument("--split-mbs", type=int, default=8, help="split: slots = sequences (default 8)")
    p.add_argument("--split-steps", type=int, default=4000, help="split: steps per repetition (default 4000)")
    p.add_argument("--reps", type=int, default=3, help="split: measured repetitions, +1 warm-up (default 3)")
    p.add_argument("--counts", default="1000,100000", help="live/reap: numbers of idle sequences (default 1000,100000)")
    p.add_argument("--reap-counts", help="reap: numbers of sequences (default: 1000,10000 and --counts)")
    p.add_argument("--layouts", default="direct,oldest", help="live: direct, oldest (default both)")
    p.add_argument("--active", type=int, default=8, help="live: closed-loop active sequences (default 8)")
    p.add_argument(
        "--seconds", type=float, default=2.0, help="live: measured seconds per model, all windows (default 2)"
    )
    p.add_argument(
        "--alternations", type=int, default=4, help="live: base / with-idle throughput windows each (default 4)"
    )
    p.add_argument("--idle-window", type=float, default=1.0, help="live/reap: idle window seconds (default 1)")
    p.add_argument("--handoffs", type=int, default=200, help="live direct: backlog hand-offs timed (default 200)")
    p.add_argument("--expiring", type=int, default=1000, help="reap: sequences that expire (default 1000)")
    p.add_argument("--state-elems", type=int, default=1, help="FP32 elements of state per sequence (default 1)")
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    counts = [int(c) for c in args.counts.split(",") if c.strip()]
    reap_counts = (
        [int(c) for c in args.reap_counts.split(",") if c.strip()]
        if args.reap_counts
        else sorted({1000, 10000, *counts})
    )
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    out: dict[str, Any] = {"env": env}
    texts = []
    t_start = time.monotonic()
    if "split" in sections:
        log("split ...")
        out["split"] = _loop_run(section_split(args))
        texts.append(fmt_split(out["split"]))
    if "live" in sections:
        out["live"] = []
        for layout in [s.strip() for s in args.layouts.split(",") if s.strip()]:
            for n in counts:
                log(f"live {layout} N={n} ...")
                params = {
                    "layout": layout,
                    "n": n,
                    "active": args.active,
                    "state_elems": args.state_elems,
                    "seconds": args.seconds,
                    "idle_window": args.idle_window,
                    "handoffs": args.handoffs,
                    "alternations": args.alternations,
                }
                out["live"].append(run_child("live", params))
        texts.append(fmt_live(out["live"]))
    if "reap" in sections:
        out["reap"] = []
        for n in reap_counts:
            base = {"n": n, "state_elems": args.state_elems, "window": args.idle_window, "expiring": args.expiring}
            log(f"reap oldest N={n} none expiring ...")
            none = run_child("reap", {**base, "layout": "oldest", "kind": "none"})
            out["reap"].append(none)
            log(f"reap oldest N={n} some expiring ...")
            out["reap"].append(
                run_child("reap", {**base, "layout": "oldest", "kind": "some", "open_s_hint": none["open_s"]})
            )
        for n in reap_counts:
            log(f"reap direct N={n} backlogged past the idle timeout ...")
            base = {"n": n, "state_elems": args.state_elems, "window": args.idle_window, "expiring": 0}
            out["reap"].append(run_child("reap", {**base, "layout": "direct", "kind": "backlog"}))
        texts.append(fmt_reap(out["reap"]))
    env["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    header = (
        f"seqserve engine scale bench: python {env['python']}, {env['cpus']} CPUs, load average at start "
        f"{env['loadavg_start'][0]}, at end {env['loadavg_end'][0]}; state {4 * args.state_elems} bytes per sequence"
    )
    text = "\n\n".join([header, *texts])
    print(text)
    log(f"total {time.monotonic() - t_start:.1f} s")
    if args.json:
        out["table"] = text
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
