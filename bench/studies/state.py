"""Implicit-state copy cost per step, by state size, strategy and how the model hands its state back.

    python -m bench.studies.state                       # 4 B .. 1 MiB, Direct and Oldest, every mode
    python -m bench.studies.state --sizes 4,1048576 --modes fresh,next --reps 5

Workload: ``--sequences`` (16) sequences of ``--steps`` steps, each keeping ``--depth`` (2) steps in
flight through ``Server.infer`` on one event loop, a python-backend model with ``max_batch_size``
16 and one FP32 state of ``size`` bytes per sequence (Direct: 16 slots; Oldest: 16 candidate
sequences, no queue delay). Every step adds the request's INPUT to every element of the state
and returns the first and the last element: the client checks both against its own running sum
at each sequence's last step, so a lost or misplaced state update fails the run.

Modes (how the model produces its next state):
  fresh    ``new = state + x``: a new array, copied into the state store (what every model did
           before in-place state existed)
  next     ``np.add(state, x, out=batch.next_state(name))``: written into the buffer the engine
           offers, which becomes the state without a copy where the layout allows
  inplace  ``use_same_buffer_for_input_output: true``: ``np.add(state, x, out=state)``

Printed per configuration: per-request latency median and p99 (submit -> reply, steps after the
pipeline filled), steps/s (median over reps), the process's CPU time per step (client, event
loop and executor together: it moves little with the machine's load, where wall-clock figures
move a lot) and that minus the 4-byte figure of the same strategy and mode (the state's cost
per step), the engine's compute_input (state gather included) and compute_output (state
write-back included) per batch, and the average batch.
Configurations run in alternating rounds (rep 1 of every configuration, then rep 2, ...), so a
load change on a shared machine spreads over all of them. ``--json`` writes the raw figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.api.statistics import statistics_json
from seqserve.engine import ExecuteBatch, Server

perf = time.perf_counter_ns
MODES = ("fresh", "next", "inplace")

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 16
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 600000000
  {strategy}
  state [ {{
    input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ {n} ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ {n} ] zero_data: true }}
    use_same_buffer_for_input_output: {same}
  }} ]
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
STRATEGY = {"direct": "direct { }", "oldest": "oldest { max_candidate_sequences: 16 }"}

MODEL = """\
import numpy as np

MODE = {mode!r}


class Model:
    def execute(self, batch):
        s = batch.states["S_IN"]
        x = batch.inputs["INPUT"]
        if MODE == "fresh":
            new = s + x
        elif MODE == "next":
            new = np.add(s, x, out=batch.next_state("S_IN"))
        else:
            new = np.add(s, x, out=s)
        return {{"OUTPUT": new[:, [0, -1]], "S_OUT": new}}
"""


@dataclass(frozen=True)
class Case:
    strategy: str
    size: int
    mode: str

    @property
    def name(self) -> str:
        return f"st_{self.strategy}_{self.size}_{self.mode}"


@dataclass
class Result:
    lat: list[np.ndarray] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # process CPU ns per step, per rep
    executions: int = 0
    rows: int = 0
    input_ns: int = 0
    output_ns: int = 0


def write_repo(root: Path, cases: list[Case]) -> None:
    for c in cases:
        (root / c.name / "1").mkdir(parents=True)
        cfg = CONFIG.format(
            name=c.name, strategy=STRATEGY[c.strategy], n=max(1, c.size // 4), same=str(c.mode == "inplace").lower()
        )
        (root / c.name / "config.pbtxt").write_text(cfg)
        (root / c.name / "1" / "model.py").write_text(MODEL.format(mode=c.mode))


def stats(server: Server, model: str) -> tuple[int, int, int, int]:
    s = statistics_json(server.statistics(model))["model_stats"][0]
    bs = s["batch_stats"]
    return (
        s["execution_count"],
        s["inference_count"],
        sum(b["compute_input"]["ns"] for b in bs),
        sum(b["compute_output"]["ns"] for b in bs),
    )


async def one_rep(server: Server, model: str, args: argparse.Namespace, xs: np.ndarray, res: Result) -> None:
    nseq, steps, depth = args.sequences, args.steps, args.depth
    lat: list[int] = []
    bad: list[str] = []

    async def step(s: int, k: int) -> None:
        t0 = perf()
        r = await server.infer(
            model,
            {"INPUT": xs[s, k : k + 1, None]},
            sequence_id=s + 1,
            sequence_start=k == 0,
            sequence_end=k == steps - 1,
        )
        if k >= depth or args.order == "shuffled":
            lat.append(perf() - t0)
        if k == steps - 1:
            want = np.float32(0)
            for v in xs[s]:
                want = np.float32(want + v)
            got = r.outputs["OUTPUT"][0]
            if got[0] != want or got[1] != want:
                bad.append(f"sequence {s + 1}: {got.tolist()} != {want}")

    async def lockstep() -> None:
        # Every sequence's step k, submitted in a new random order, then step k + 1: Oldest's
        # batches come in that order, out of slot order (its state is gathered).
        order = np.random.default_rng(args.steps).permutation(nseq)
        for k in range(steps):
            np.random.default_rng(k).shuffle(order)
            await asyncio.gather(*(step(int(s), k) for s in order))

    async def sequence(s: int) -> None:
        sem = asyncio.Semaphore(depth)
        tasks = []
        for k in range(steps):  # steps of one sequence are submitted in order, `depth` at a time
            await sem.acquire()
            t = asyncio.get_running_loop().create_task(step(s, k))
            t.add_done_callback(lambda _t: sem.release())
            tasks.append(t)
        await asyncio.gather(*tasks)

    before = stats(server, model)
    c0 = time.process_time_ns()
    t0 = perf()
    if args.order == "shuffled":
        await lockstep()
    else:
        await asyncio.gather(*(sequence(s) for s in range(nseq)))
    wall = perf() - t0
    cpu = time.process_time_ns() - c0
    after = stats(server, model)
    if bad:
        raise RuntimeError(f"{model}: wrong running sums: {bad[:3]}")
    res.lat.append(np.array(lat, np.int64))
    res.rates.append(nseq * steps / wall * 1e9)
    res.cpu.append(cpu / (nseq * steps))
    res.executions += after[0] - before[0]
    res.rows += after[1] - before[1]
    res.input_ns += after[2] - before[2]
    res.output_ns += after[3] - before[3]


def supported_modes() -> set[str]:
    # Before in-place state existed the batch offered no next_state and read-only states.
    return set(MODES) if hasattr(ExecuteBatch, "next_state") else {"fresh"}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    modes = [m for m in args.modes.split(",") if m in supported_modes()]
    cases = [Case(st, size, m) for st in args.strategies.split(",") for size in args.sizes for m in modes]
    results = {c: Result() for c in cases}
    rng = np.random.default_rng(7)
    xs = rng.integers(-8, 8, (args.sequences, args.steps)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="seqserve-state-bench-") as tmp:
        write_repo(Path(tmp), cases)
        server = Server(tmp)
        await server.start()
        try:
            for rep in range(args.reps + 1):  # rep 0 warms every model up
                for c in cases:
                    gc.collect()
                    r = Result()
                    await one_rep(server, c.name, args, xs, r if rep == 0 else results[c])
                print(f"  round {rep}/{args.reps} done", file=sys.stderr, flush=True)
        finally:
            await server.shutdown(timeout_s=5)
    return {"args": vars(args), "modes": modes, "rows": [summary(c, results[c]) for c in cases]}


def summary(c: Case, r: Result) -> dict[str, Any]:
    lat = np.concatenate(r.lat)
    ex = max(1, r.executions)
    return {
        "strategy": c.strategy,
        "size": c.size,
        "mode": c.mode,
        "lat_p50_us": float(np.median(lat)) / 1e3,
        "lat_p99_us": float(np.percentile(lat, 99)) / 1e3,
        "steps_per_s": float(np.median(r.rates)),
        "steps_per_s_reps": [round(x) for x in r.rates],
        "cpu_us_per_step": float(np.median(r.cpu)) / 1e3,
        "avg_batch": r.rows / ex,
        "compute_input_us": r.input_ns / ex / 1e3,
        "compute_output_us": r.output_ns / ex / 1e3,
    }


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of several runs of one configuration set: medians over the runs, and the range of
    steps/s (``steps_per_s_reps`` then holds each run's median)."""
    by_key: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for run_ in runs:
        for r in run_["rows"]:
            by_key.setdefault((r["strategy"], r["size"], r["mode"]), []).append(r)
    rows = []
    for (strategy, size, mode), rs in by_key.items():
        row: dict[str, Any] = {"strategy": strategy, "size": size, "mode": mode}
        for key in (
            "lat_p50_us",
            "lat_p99_us",
            "steps_per_s",
            "cpu_us_per_step",
            "avg_batch",
            "compute_input_us",
            "compute_output_us",
        ):
            row[key] = float(np.median([r[key] for r in rs]))
        row["steps_per_s_reps"] = [round(r["steps_per_s"]) for r in rs]
        rows.append(row)
    args = dict(runs[0]["args"])
    args["reps"] = f"{len(runs)} runs x {args['reps']}"
    return {"args": args, "rows": rows}


def size_name(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1024 else f"{n} B"


def report(out: dict[str, Any]) -> None:
    rows = out["rows"]
    base = {(r["strategy"], r["mode"]): r for r in rows if r["size"] == min(x["size"] for x in rows)}
    print(
        f"{'strategy':8} {'state':>7} {'mode':8} {'p50 us':>8} {'p99 us':>8} {'steps/s':>8} {'cpu us':>7} "
        f"{'+cpu us':>7} {'in us/b':>8} {'out us/b':>8} {'batch':>5}  steps/s per rep"
    )
    for r in rows:
        b = base[(r["strategy"], r["mode"])]
        extra = r["cpu_us_per_step"] - b["cpu_us_per_step"]
        print(
            f"{r['strategy']:8} {size_name(r['size']):>7} {r['mode']:8} {r['lat_p50_us']:8.0f} "
            f"{r['lat_p99_us']:8.0f} {r['steps_per_s']:8.0f} {r['cpu_us_per_step']:7.1f} {extra:7.1f} "
            f"{r['compute_input_us']:8.1f} {r['compute_output_us']:8.1f} {r['avg_batch']:5.1f}  "
            f"{r['steps_per_s_reps']}"
        )
    a = out["args"]
    print(
        f"\n{a['sequences']} sequences x {a['steps']} steps, order {a.get('order', 'slots')}, depth {a['depth']}, "
        f"{a['reps']} reps (alternating "
        "rounds); cpu us: the process's CPU time per step (all threads: client, event loop, executor), "
        "+cpu us: minus the smallest state's (the state's cost per step); in/out us/b: the engine's "
        "compute_input / compute_output per batch (state gather / write-back included; a lazily "
        "gathered Oldest state is copied inside compute_infer, when the model reads it)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[4, 1024, 65536, 1 << 20])
    p.add_argument("--strategies", default="direct,oldest")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--order",
        choices=("slots", "shuffled"),
        default="slots",
        help="slots: every sequence keeps --depth steps in flight (Oldest's rows mostly in slot order); "
        "shuffled: all sequences step k in a random order, then step k + 1 (rows out of slot order)",
    )
    p.add_argument("--json", help="write the raw figures here")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="print the medians of earlier --json runs and exit")
    args = p.parse_args(argv)
    if args.merge:
        report(merge([json.loads(Path(f).read_text()) for f in args.merge]))
        return 0
    out = asyncio.run(run(args))
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
