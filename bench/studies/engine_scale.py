"""Engine micro-benchmarks in one process, no network: where a step's time goes, and what 100,000
live sequences cost.

    python -m bench.studies.engine_scale                        # all sections, about a minute
    python -m bench.studies.engine_scale --sections split --split-steps 2000
    python -m bench.studies.engine_scale --sections live,reap --counts 1000,100000 --json out.json

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
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.studies.engine_models import log
from bench.studies.engine_scale_load import (
    closed_loop,
    end_sequences,
    open_in_slots,
    start_backlogged,
    start_server,
    warm_imports,
    write_probe_model,
    x1,
)
from bench.studies.engine_scale_report import fmt_live, fmt_reap, fmt_split
from bench.studies.engine_threads import CoreThreads, cpu_delta, probe, settle_rss, tids
from seqserve.api.statistics import statistics_json

perf = time.perf_counter_ns

SLOTS_DIRECT = 64


# ------------------------------------------------------------------------------------ split


async def section_split(args: argparse.Namespace) -> dict[str, Any]:
    mbs, steps, reps = args.split_mbs, args.split_steps, args.reps
    name = f"split_b{mbs}"
    with tempfile.TemporaryDirectory(prefix="seqserve-scale-") as tmp:
        write_probe_model(Path(tmp), name, strategy="direct", mbs=mbs, elems=args.state_elems)
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
            write_probe_model(root / "repo", name, strategy=layout, mbs=64, capacity=capacity, elems=elems)
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
        write_probe_model(root / "repo", name, strategy=layout, mbs=64, capacity=n + e, idle_us=idle_us, elems=elems)
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
    cmd = [sys.executable, "-m", "bench.studies.engine_scale", "--child", kind, json.dumps(params)]
    root = str(Path(__file__).resolve().parents[2])
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


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        kind, params = argv[1], json.loads(argv[2])
        fn = {"live": child_live, "reap": child_reap}[kind]
        print(json.dumps(_loop_run(fn(params))))
        return 0
    doc = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.studies.engine_scale", description=doc)
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
