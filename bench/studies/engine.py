"""In-process engine benchmark: per-step overhead of the sequence (Direct) path.

    python -m bench.studies.engine                 # default run, well under a minute
    python -m bench.studies.engine --json out.json --steps 400 --reps 5

Workload (every path): ``--sequences`` (64) sequences of ``--steps`` steps each, FP32 [1] input, a
no-op model, Direct strategy, one instance, slots = max_batch_size, so with 64 sequences all but
``max_batch_size`` of them wait in the backlog and take over a slot when one ends. ``--depth`` is
how many steps each sequence keeps in flight: 1 is a closed loop (a client that awaits every
step), 4 keeps the executor supplied with full batches (throughput / per-step overhead).

Paths:
  (a) api   ``await Server.infer(...)`` on one event loop, a python-backend model that returns
            INPUT as OUTPUT. Everything a caller pays: validation, futures, the loop wake-up.
  (b) core  ``_core.Scheduler`` driven directly: submit from Python, a runner that reads the batch
            (handles + inputs()) and returns True; completions are recorded in the runner and
            handed to the submitting thread through a SimpleQueue. Core cost + one Python call
            per batch + the GIL hand-off between the submitting thread and the executor thread.
  (c) floor the same driver loop with the core removed: the batches (b) formed are replayed in
            one thread, one Python call per batch that np.copyto's the batch's bytes into a
            preallocated buffer. (b) - (c) is the core's overhead per step.

Numbers: ns/step comes from per-request completion timestamps, over windows of ``--window``
consecutive completions (default 64: one step of every sequence, several batches, so that the
bursty per-request completions of (a) do not split a batch): window duration / window steps,
median and p99 over all windows of all repetitions; steps/s is the median over repetitions.
Latency is per request (submit -> completion seen by the caller) for steps submitted while
their sequence held a slot (step >= depth), so it excludes the backlog wait.
Completion timestamps are per request (a: after the await returns) or per batch, given to each
of its rows (b, c: at runner entry). The first ``--warmup-frac`` and last ``--tail-frac`` of
completions of each repetition are excluded, one whole warm-up repetition is discarded, inputs
come from a fixed seed, gc stays enabled (collected before each repetition).

The breakdown section explains (b): submit() alone with the executor stopped, then the executor
draining that pre-queued work while the main thread sleeps (GIL uncontended, every batch full),
with runners that read nothing / handles / handles+inputs() / everything LoadedModel._run reads.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import queue
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.studies.engine_floor import FakeBatch, run_floor
from bench.studies.engine_models import ECHO_MODEL_PY, log, sequence_config, write_model
from bench.studies.engine_report import TARGET_NS, environment, explain, report
from bench.studies.engine_workload import Rep, Summary, Workload, api_stats, core_stats_delta, progress, summarize
from seqserve.engine import Server, _core

TYPE_FP32 = 11  # model_config.proto DataType
perf = time.perf_counter_ns


# ---------------------------------------------------------------------------- (a) Server.infer


def write_repo(root: Path, mbs_list: list[int]) -> dict[int, str]:
    names = {}
    for mbs in mbs_list:
        name = f"bench_noop_b{mbs}"
        write_model(root, name, sequence_config(name, mbs=mbs), ECHO_MODEL_PY)
        names[mbs] = name
    return names


async def api_rep(server: Server, model: str, wl: Workload) -> Rep:
    n, steps, depth = wl.n, wl.steps, wl.depth
    t_sub = [0] * n
    t_done = [0] * n
    arrs = wl.arrs
    infer = server.infer
    bad: list[int] = []

    async def closed(s: int) -> None:
        base = s * steps
        last = steps - 1
        for k in range(steps):
            i = base + k
            t_sub[i] = perf()
            r = await infer(model, {"INPUT": arrs[i]}, sequence_id=s + 1, sequence_start=k == 0, sequence_end=k == last)
            t_done[i] = perf()
            if k == last and r.outputs["OUTPUT"][0, 0] != arrs[i][0, 0]:
                bad.append(i)

    async def one(i: int, s: int, k: int) -> None:
        t_sub[i] = perf()
        r = await infer(
            model, {"INPUT": arrs[i]}, sequence_id=s + 1, sequence_start=k == 0, sequence_end=k == steps - 1
        )
        t_done[i] = perf()
        if k == steps - 1 and r.outputs["OUTPUT"][0, 0] != arrs[i][0, 0]:
            bad.append(i)

    async def pipelined(s: int) -> None:
        inflight: deque[asyncio.Task[None]] = deque()
        create = asyncio.get_running_loop().create_task
        for k in range(steps):
            if len(inflight) >= depth:
                await inflight.popleft()
            inflight.append(create(one(s * steps + k, s, k)))
        while inflight:
            await inflight.popleft()

    body = closed if depth == 1 else pipelined
    c0 = time.process_time_ns()
    t0 = perf()
    await asyncio.gather(*(body(s) for s in range(wl.nseq)))
    wall = perf() - t0
    cpu = time.process_time_ns() - c0
    if bad:
        raise RuntimeError(f"(a) wrong OUTPUT for requests {bad[:5]}")
    return Rep(np.array(t_sub, np.int64), np.array(t_done, np.int64), wall, cpu_ns=cpu)


async def run_api(wls: list[Workload], args: argparse.Namespace) -> list[Summary]:
    out = []
    with tempfile.TemporaryDirectory(prefix="seqserve-bench-") as tmp:
        names = write_repo(Path(tmp), sorted({w.mbs for w in wls}))
        server = Server(tmp)
        await server.start()
        try:
            for wl in wls:
                model = names[wl.mbs]
                reps = []
                for rep in range(args.reps + 1):
                    gc.collect()
                    before = api_stats(server, model)
                    r = await api_rep(server, model, wl)
                    r.stats = core_stats_delta(before, api_stats(server, model))
                    progress("a", wl, rep, args.reps, r)
                    if rep:  # rep 0 is the warm-up
                        reps.append(r)
                out.append(summarize("(a) Server.infer", wl, reps, args))
                inline = getattr(server.model(model), "inline_stats", None)  # absent before inline execution
                if inline is not None:
                    log(
                        f"  (a) mbs={wl.mbs} depth={wl.depth} inline execution so far: {inline.inline_batches} batches "
                        f"inline, {inline.thread_batches} on the executor, {inline.promotions} promotions, "
                        f"{inline.demotions} demotions"
                    )
        finally:
            await server.shutdown(timeout_s=5)
    return out


# --------------------------------------------------------------------------- (b) _core direct


def make_scheduler(name: str, mbs: int, runner: Callable[[Any], bool]) -> Any:
    def on_fail(handles: list[int], code: int, msg: str) -> None:
        log(f"  on_fail: {len(handles)} requests: {code} {msg}")

    core: Any = _core  # also drives cores from before the typed boundary, for baselines
    if hasattr(core, "ModelSpec"):
        spec = core.ModelSpec(
            name=name,
            strategy=core.Strategy.DIRECT,
            max_batch_size=mbs,
            slots_per_instance=max(1, mbs),
            idle_us=600_000_000,
            inputs=[core.InputSpec(name="INPUT", dtype=np.dtype(np.float32), default_shape=[1])],
        )
        return core.Scheduler(spec, runner=runner, on_fail=on_fail, on_warning=log)
    kw: dict[str, Any] = dict(
        name=name,
        strategy=core.DIRECT,
        max_batch_size=mbs,
        instance_count=1,
        slots_per_instance=max(1, mbs),
        idle_us=600_000_000,
        max_queue_delay_us=0,
        min_slot_utilization=0.0,
        controls=[],
        states=[],
        delay_requests=0,
        delay_backlog_requests=0,
        runner=runner,
        on_fail=on_fail,
        on_warning=log,
    )
    try:  # inputs: (name, dtype, shapes must match, default item shape); older cores took 3 fields
        return core.Scheduler(inputs=[("INPUT", TYPE_FP32, False, [1])], **kw)
    except TypeError:
        return core.Scheduler(inputs=[("INPUT", TYPE_FP32, False)], **kw)


def core_stats(sched: Any) -> dict[str, Any]:
    """``Scheduler.stats()`` in the raw shape core_stats_delta reads (older cores gave a dict)."""
    s = sched.stats()
    if isinstance(s, dict):
        return s

    def dur(d: Any) -> dict[str, int]:
        return {"count": d.count, "ns": d.ns}

    return {
        "execution_count": s.execution_count,
        "inference_count": s.inference_count,
        "queue": dur(s.queue),
        "batch_stats": [
            {k: dur(getattr(b, k)) for k in ("compute_input", "compute_infer", "compute_output")}
            for b in s.batches.values()
        ],
    }


def make_runner(reads: str, rec: list[Any], q: queue.SimpleQueue[Any] | None) -> Callable[[Any], bool]:
    """A trivial runner: one timestamp, read part of the batch, record it, return True."""
    rec_append = rec.append
    put = q.put if q is not None else (lambda _x: None)

    if reads == "none":  # touches nothing on the batch: pure dispatch cost

        def runner(cb: Any) -> bool:
            rec_append(perf())
            return True
    elif reads == "handles":

        def runner(cb: Any) -> bool:
            t = perf()
            hs = cb.handles
            rec_append((t, hs))
            put(hs)
            return True
    elif reads == "inputs":

        def runner(cb: Any) -> bool:
            t = perf()
            hs = cb.handles
            cb.inputs()
            rec_append((t, hs))
            put(hs)
            return True
    elif reads == "full":  # what LoadedModel._run reads before calling the model

        def runner(cb: Any) -> bool:
            t = perf()
            hs = cb.handles
            cb.inputs(), cb.states(), cb.controls(), cb.start, cb.end, cb.ready, cb.corrid, cb.size
            rec_append((t, hs))
            put(hs)
            return True
    else:
        raise ValueError(reads)
    return runner


def core_rep(sched: Any, wl: Workload, rec: list[Any], q: queue.SimpleQueue[Any]) -> Rep:
    rec.clear()
    n, steps, nseq = wl.n, wl.steps, wl.nseq
    first = min(wl.depth, steps)
    last = steps - 1
    arrs = wl.arrs
    submit = sched.submit
    header = _core.RequestHeader
    q_get = q.get
    t_sub = [0] * n
    c0 = time.process_time_ns()
    t0 = perf()
    for s in range(nseq):
        for k in range(first):
            h = s * steps + k + 1
            t_sub[h - 1] = perf()
            head = header(handle=h, sequence_id=s + 1, start=k == 0, end=k == last)
            if type(submit(head, (arrs[h - 1],))) is not int:  # a Refusal
                raise RuntimeError("submit refused")
    next_step = [first] * nseq
    done = 0
    while done < n:
        hs = q_get(timeout=30)
        for h in hs:
            if h:
                done += 1
                s = (h - 1) // steps
                k = next_step[s]
                if k < steps:
                    h2 = s * steps + k + 1
                    t_sub[h2 - 1] = perf()
                    head = header(handle=h2, sequence_id=s + 1, start=k == 0, end=k == last)
                    if type(submit(head, (arrs[h2 - 1],))) is not int:
                        raise RuntimeError("submit refused")
                    next_step[s] = k + 1
    wall = perf() - t0
    cpu = time.process_time_ns() - c0
    t_done = np.zeros(n, np.int64)
    batches = []
    for t, hs in rec:
        batches.append(hs)
        for h in hs:
            if h:
                t_done[h - 1] = t
    if np.count_nonzero(t_done) != n:
        raise RuntimeError("(b) lost completions")
    return Rep(np.array(t_sub, np.int64), t_done, wall, batches, cpu_ns=cpu)


def run_core(wl: Workload, args: argparse.Namespace) -> tuple[Summary, list[Rep]]:
    rec: list[Any] = []
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    sched = make_scheduler(f"bench_core_b{wl.mbs}", wl.mbs, make_runner(args.core_reads, rec, q))
    sched.start()
    reps = []
    try:
        for rep in range(args.reps + 1):
            gc.collect()
            before = core_stats(sched)
            r = core_rep(sched, wl, rec, q)
            r.stats = core_stats_delta(before, core_stats(sched))
            progress("b", wl, rep, args.reps, r)
            if rep:
                reps.append(r)
    finally:
        sched.close(False)
    return summarize("(b) _core.Scheduler", wl, reps, args), reps


# ----------------------------------------------------------------------------- breakdown


def drain_once(
    mbs: int, reads: str, calls: list[Any], batches: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """submit() every request with the executor stopped, then start it and let it drain the queues
    while this thread waits (GIL free). Returns (ns per submit, median ns per batch)."""
    rec: list[Any] = []
    done = threading.Event()
    inner = make_runner(reads, rec, None)
    count = [0]
    cpu: list[int] = []  # executor thread CPU time at the first and the last batch

    def runner(cb: Any) -> bool:
        inner(cb)
        count[0] += 1
        if count[0] == 1:
            cpu.append(time.thread_time_ns())
        elif count[0] == batches:
            cpu.append(time.thread_time_ns())
            done.set()
        return True

    sched = make_scheduler(f"bench_drain_b{mbs}", mbs, runner)
    submit = sched.submit
    gc.collect()
    t0 = perf()
    for h, tup, cid, st, en in calls:
        submit(_core.RequestHeader(handle=h, sequence_id=cid, start=st, end=en), tup)
    submit_ns = (perf() - t0) / len(calls)
    sched.start()
    if not done.wait(60):
        raise RuntimeError("drain did not finish")
    sched.close(False)
    ts = np.array([x if isinstance(x, int) else x[0] for x in rec], np.int64)
    lo, hi = int(len(ts) * args.warmup_frac), int(len(ts) * (1 - args.tail_frac))
    cpu_share = (cpu[1] - cpu[0]) / max(1, ts[-1] - ts[0])
    return submit_ns, float(np.median(np.diff(ts[lo:hi]))), cpu_share


def thread_ping_pong(n: int = 5000) -> float:
    """ns per round trip between two Python threads through SimpleQueues: two wake-ups and two
    GIL hand-offs, the cross-thread cost any Python submitter + executor pair pays."""
    q1: queue.SimpleQueue[None] = queue.SimpleQueue()
    q2: queue.SimpleQueue[None] = queue.SimpleQueue()

    def other() -> None:
        for _ in range(n):
            q1.get()
            q2.put(None)

    th = threading.Thread(target=other)
    th.start()
    t0 = perf()
    for _ in range(n):
        q1.put(None)
        q2.get()
    dt = perf() - t0
    th.join()
    return dt / n


def breakdown(mbs: int, args: argparse.Namespace) -> dict[str, Any]:
    """Where (b)'s time goes, each part measured alone."""
    wl = Workload(mbs, args.steps, args.sequences, args.steps, args.seed)
    n, steps = wl.n, wl.steps
    calls = [
        (s * steps + k + 1, (wl.arrs[s * steps + k],), s + 1, k == 0, k == steps - 1)
        for s in range(wl.nseq)
        for k in range(steps)
    ]
    # All queued up front: mbs sequences fill the slots, the rest take them over as they end,
    # so every batch is full and there are steps * ceil(nseq / slots) of them.
    slots = max(1, mbs)
    batches = steps * -(-wl.nseq // slots)
    out: dict[str, Any] = {"mbs": mbs, "requests": n, "batches": batches}

    def nop(*_a: Any) -> None:
        return None

    best = float("inf")
    for _ in range(args.reps + 1):
        t0 = perf()
        for h, tup, cid, st, en in calls:
            nop(h, tup, cid, st, en, 0, 1)
        best = min(best, (perf() - t0) / n)
    out["py_call_loop_ns"] = best
    submit_all = []
    for reads in ("none", "handles", "inputs", "full"):
        drain_once(mbs, reads, calls, batches, args)  # warm-up
        res = [drain_once(mbs, reads, calls, batches, args) for _ in range(args.reps)]
        submit_all += [r[0] for r in res]
        out[f"batch_ns_{reads}"] = min(r[1] for r in res)
        out[f"executor_cpu_share_{reads}"] = float(np.median([r[2] for r in res]))
    out["submit_ns"] = min(submit_all)
    # The same runner bodies called from Python on a fake batch, no core: the per-batch floor.
    fb = FakeBatch([1] * slots, np.zeros((slots, 1), np.float32), np.zeros((slots, 1), np.float32))
    for reads in ("none", "handles"):
        fn = make_runner(reads, [], None)
        best = float("inf")
        for _ in range(3):
            t0 = perf()
            for _i in range(20000):
                fn(fb)
            best = min(best, (perf() - t0) / 20000)
        out[f"py_runner_ns_{reads}"] = best
    out["thread_ping_pong_ns"] = min(thread_ping_pong() for _ in range(3))
    return out


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.studies.engine", description=__doc__.split("\n")[0])
    p.add_argument("--mbs", type=parse_ints, default=[1, 8], help="max_batch_size values (default 1,8)")
    p.add_argument(
        "--depth",
        type=parse_ints,
        default=[1, 4],
        help="steps in flight per sequence: 1 = closed loop (default 1,4)",
    )
    p.add_argument("--sequences", type=int, default=64)
    p.add_argument("--steps", type=int, default=200, help="steps per sequence (default 200)")
    p.add_argument("--reps", type=int, default=5, help="measured repetitions (+1 warm-up)")
    p.add_argument(
        "--window",
        type=int,
        default=64,
        help="consecutive completions per ns/step window (default 64; 0 = max_batch_size)",
    )
    p.add_argument("--warmup-frac", type=float, default=0.10)
    p.add_argument("--tail-frac", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--paths", default="a,b,c", help="which of a,b,c to run (c needs b)")
    p.add_argument(
        "--core-reads",
        choices=("handles", "inputs", "full"),
        default="inputs",
        help="what the (b) runner reads from the batch (default: handles + inputs())",
    )
    p.add_argument("--no-breakdown", action="store_true", help="skip the breakdown section")
    p.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop for (a); auto = uvloop when installed, as the server uses",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    paths = set(args.paths.split(","))
    if "c" in paths:
        paths.add("b")

    loop_name = "asyncio"
    runner_factory: Any = None
    if args.loop in ("auto", "uvloop"):
        try:
            import uvloop

            runner_factory = uvloop.new_event_loop
            loop_name = "uvloop"
        except ImportError:
            if args.loop == "uvloop":
                raise
    env = environment(loop_name)
    env["loadavg_start"] = round(os.getloadavg()[0], 2)
    wls = [Workload(m, d, args.sequences, args.steps, args.seed) for m in args.mbs for d in args.depth]
    t_start = time.monotonic()
    results: list[Summary] = []
    if "a" in paths:
        log("(a) Server.infer ...")
        with asyncio.Runner(loop_factory=runner_factory) as r:
            results += r.run(run_api(wls, args))
    overhead = []
    if "b" in paths:
        log("(b) _core.Scheduler / (c) floor ...")
        for wl in wls:
            sb, core_reps = run_core(wl, args)
            results.append(sb)
            if "c" in paths:
                sc = run_floor(wl, core_reps, args)
                results.append(sc)
                overhead.append(
                    {
                        "mbs": wl.mbs,
                        "depth": wl.depth,
                        "core_overhead_ns": sb.step_p50 - sc.step_p50,
                        "core_overhead_p99_ns": sb.step_p99 - sc.step_p99,
                        "core_overhead_cpu_ns": sb.cpu_per_step - sc.cpu_per_step,
                        "target_ns": TARGET_NS,
                        "met": sb.step_p50 - sc.step_p50 < TARGET_NS,
                    }
                )
    bds = []
    if "b" in paths and not args.no_breakdown:
        log("breakdown ...")
        bds = [breakdown(m, args) for m in args.mbs]
        by_mbs = {b["mbs"]: b for b in bds}
        core: dict[tuple[Any, Any], Summary] = {(s.mbs, s.depth): s for s in results if s.path.startswith("(b)")}
        for o in overhead:
            explain(o, core[(o["mbs"], o["depth"])], by_mbs[o["mbs"]], args.core_reads)
    env["loadavg_end"] = round(os.getloadavg()[0], 2)
    text = report(results, overhead, bds, env, args)
    print(text)
    log(f"total {time.monotonic() - t_start:.1f} s")
    if args.json:
        doc = {
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "env": env,
            "results": [{k: v for k, v in vars(s).items()} for s in results],
            "core_overhead": overhead,
            "breakdown": bds,
            "table": text,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
