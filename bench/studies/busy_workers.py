"""The engine's CPU per step when its worker processes are busy (issue 27; bench/docs/workers.md).

    python -m bench.studies.busy_workers --json bench/results/busy_workers.json   # about 2 minutes

Issue 27 asks that one engine process cost at most 10 µs of CPU per step, so that it can feed
8+ busy workers. ``python -m bench`` cannot make the workers busy on a 2-core machine: its
generator processes (tritonclient, Python) spend several times the server's CPU per step, so
they hold the load at about 5,000 steps/s there, and the engine, mostly idle, pays its wake-up
and its batch's Python for small batches. This study drives the same server with ``seqload``
(bench/golang/seqload: grpc-go, a fraction of the CPU per step), so that the workers, not the
generator, set the pace.

Per run: ``seqserve serve --workers N`` on the bench's ``accumulator_oldest_1024`` (spawned here,
free loopback ports), ``seqload`` with S sequences, one gRPC stream each, over ``--conns``
connections, every running sum checked. Over seqload's measured window: the engine process's CPU
(its own threads, by thread name too) and the workers' (the rest of the process tree) per step
the model executed, steps/s, the mean batch, latency percentiles, and how busy the machine was.
Each figure is the median over ``--reps`` runs; the runs of one repetition share a server.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import golang
from bench.loadgen.cpu import CpuSample, ProcessTreeCpu, SystemCpu
from bench.loadgen.model_stats import StatsReader, StatsSnapshot
from bench.loadgen.target import SpawnedServer, Target, wait_ready

MODEL = "accumulator_oldest_1024"
REPOSITORY = Path(__file__).resolve().parents[1] / "models"
# the engine's threads worth naming in the report; the rest are summed as "other"
NAMED_THREADS = ("seqserve-drain", "seqserve-exec")


class Window:
    """The samples taken when seqload opens and closes its measured window."""

    def __init__(self, server_pid: int, stats: StatsReader, generator_pid: int) -> None:
        self._server = ProcessTreeCpu(server_pid)
        self._generator = ProcessTreeCpu(generator_pid)
        self._system = SystemCpu()
        self._stats = stats
        self.samples: list[tuple[CpuSample | None, CpuSample | None, CpuSample | None, StatsSnapshot]] = []

    def sample(self) -> None:
        self.samples.append(
            (self._server.sample(), self._generator.sample(), self._system.sample(), self._stats.read())
        )


def run_generator(binary: Path, target: Target, pid: int, sequences: int, args: argparse.Namespace) -> dict[str, Any]:
    """One seqload run against the server; its report with the window's server-side figures."""
    cmd = [
        str(binary), "-addr", str(target.grpc_url), "-model", target.model, "-sequences", str(sequences),
        "-conns", str(args.conns), "-seconds", str(args.seconds), "-warmup", str(args.warmup),
        "-steps", str(args.sequence_steps),
    ]  # fmt: skip
    assert target.http_url is not None
    stats = StatsReader(target.http_url, target.model)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        window = Window(pid, stats, proc.pid)
        report: dict[str, Any] = {}
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            if line.startswith("# window"):
                window.sample()
            elif line.startswith("{"):
                report = json.loads(line)
        err = proc.stderr.read()
    if proc.returncode != 0 or not report or len(window.samples) != 2:
        raise RuntimeError(f"seqload failed (exit {proc.returncode}): {err.strip()[-2000:]}")
    (srv0, gen0, sys0, st0), (srv1, gen1, sys1, st1) = window.samples
    if srv0 is None or srv1 is None or srv0.root_cpu_s is None or srv1.root_cpu_s is None:
        raise RuntimeError("the server exited during the window")
    steps = st1.inference_count - st0.inference_count
    batches = st1.execution_count - st0.execution_count
    wall = srv1.wall_s - srv0.wall_s
    engine = srv1.root_cpu_s - srv0.root_cpu_s
    workers = (srv1.children_cpu_s or 0.0) - (srv0.children_cpu_s or 0.0)
    threads = {k: v - (srv0.threads or {}).get(k, 0.0) for k, v in (srv1.threads or {}).items()}
    per_step = 1e6 / max(steps, 1)
    by_thread = {name: threads.get(name, 0.0) * per_step for name in NAMED_THREADS}
    by_thread["other"] = (engine - sum(threads.get(name, 0.0) for name in NAMED_THREADS)) * per_step
    generator = None if gen0 is None or gen1 is None else (gen1.cpu_s - gen0.cpu_s) * per_step
    machine = None if sys0 is None or sys1 is None else (sys1.cpu_s - sys0.cpu_s) / wall / (os.cpu_count() or 1)
    return {
        "sequences": sequences,
        "steps_per_s": steps / wall,
        "engine_us_per_step": engine * per_step,
        "engine_us_per_step_by_thread": by_thread,
        "workers_us_per_step": workers * per_step,
        "workers_cpu_cores": workers / wall,
        "generator_us_per_step": generator,
        "machine_busy": machine,
        "mean_batch": steps / max(batches, 1),
        "p50_ms": report["p50_ms"],
        "p99_ms": report["p99_ms"],
        "wrong": report["wrong"],
        "errors": report["errors"],
        "first_error": report.get("first_error"),
        "generator_steps": report["steps"],
    }


def run_repetition(
    binary: Path, workers: int, sequence_counts: list[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    model = args.model
    flags = [
        "--model-repository",
        str(args.model_repository),
        "--model-control-mode",
        "explicit",
        "--load-model",
        model,
    ]
    server = SpawnedServer(extra_args=[*flags, "--workers", str(workers)])
    server.start()
    target = Target(server.http_url, server.grpc_url, model, spawned=server)
    try:
        wait_ready(target)
        assert server.proc is not None
        runs = []
        for sequences in sequence_counts:
            run = run_generator(binary, target, server.proc.pid, sequences, args)
            runs.append(run | {"workers": workers})
            print(
                f"#   workers {workers} sequences {sequences:4d}: {run['steps_per_s']:7.0f} steps/s, engine "
                f"{run['engine_us_per_step']:5.1f} us/step, batch {run['mean_batch']:5.1f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        server.stop()
    return runs


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    numeric = ("steps_per_s", "engine_us_per_step", "workers_us_per_step", "workers_cpu_cores", "mean_batch")
    row: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in numeric}
    for k in ("p50_ms", "p99_ms", "generator_us_per_step", "machine_busy"):
        values = [r[k] for r in runs if r[k] is not None]
        row[k] = statistics.median(values) if values else None
    row["engine_us_per_step_range"] = [
        min(r["engine_us_per_step"] for r in runs),
        max(r["engine_us_per_step"] for r in runs),
    ]
    row["engine_us_per_step_by_thread"] = {
        name: statistics.median(r["engine_us_per_step_by_thread"][name] for r in runs)
        for name in runs[0]["engine_us_per_step_by_thread"]
    }
    row["wrong"] = sum(r["wrong"] for r in runs)
    row["errors"] = sum(r["errors"] for r in runs)
    return row


def format_row(workers: int, sequences: int, row: dict[str, Any]) -> str:
    low, high = row["engine_us_per_step_range"]
    threads = row["engine_us_per_step_by_thread"]
    generator = row["generator_us_per_step"]
    return (
        f"{workers:>7d} {sequences:>9d} {row['steps_per_s']:>8.0f} {row['engine_us_per_step']:>7.1f} "
        f"({low:4.1f}-{high:4.1f}) {threads['seqserve-drain']:>6.1f} {threads['seqserve-exec']:>5.1f} "
        f"{threads['other']:>5.1f} {row['workers_us_per_step']:>8.1f} {row['workers_cpu_cores']:>6.2f} "
        f"{row['mean_batch']:>6.1f} {row['p50_ms']:>6.2f} {row['p99_ms']:>6.2f} "
        f"{'-' if generator is None else f'{generator:.1f}':>6} {_percent(row['machine_busy']):>5} "
        f"{row['wrong']:>5d} {row['errors']:>6d}"
    )


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


HEADER = (
    f"{'workers':>7} {'sequences':>9} {'steps/s':>8} {'engine us/step (range)':>22} {'drain':>6} {'exec':>5} "
    f"{'other':>5} {'workers':>8} {'cores':>6} {'batch':>6} {'p50':>6} {'p99':>6} {'gen':>6} {'busy':>5} "
    f"{'wrong':>5} {'errors':>6}"
)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive integers, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--workers", type=parse_counts, default=[2], help="worker processes, one setting or a list (default 2)"
    )
    ap.add_argument(
        "--sequences", type=parse_counts, default=[16, 64, 256], help="sequences in flight (default 16,64,256)"
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions; figures are their medians (default 3)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured window of each run (default 8)")
    ap.add_argument("--warmup", type=float, default=2.0, help="load before each window (default 2)")
    ap.add_argument("--conns", type=int, default=4, help="gRPC connections of the generator (default 4)")
    ap.add_argument("--sequence-steps", type=int, default=100, help="steps of each sequence (default 100)")
    ap.add_argument("--model-repository", type=Path, default=REPOSITORY, help="default: bench/models")
    ap.add_argument(
        "--model", default=MODEL, help=f"a running-sum model: FP32 INPUT -> OUTPUT [1], batching (default {MODEL})"
    )
    ap.add_argument("--seqload", type=Path, help="a seqload binary built already (default: build one now)")
    ap.add_argument("--json", type=Path, help="write the runs and their medians here")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.conns < 1 or args.seconds <= 0 or args.warmup < 0 or args.sequence_steps < 1:
        ap.error("--reps, --conns and --sequence-steps must be positive, --seconds above 0, --warmup 0 or more")

    with tempfile.TemporaryDirectory(prefix="seqserve-seqload-") as tmp:
        binary = args.seqload
        if binary is None:
            print("# building bench/golang/seqload (grpc-go, offline)", file=sys.stderr, flush=True)
            try:
                binary = golang.build(golang.SEQLOAD_SOURCE, Path(tmp))
            except golang.ToolchainMissing as e:
                print(f"busy_workers: cannot build seqload: {e}", file=sys.stderr)
                return 1
        load = os.getloadavg()
        began = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        runs: list[dict[str, Any]] = []
        for rep in range(args.reps):
            for workers in args.workers:
                print(f"# repetition {rep + 1}/{args.reps}, --workers {workers}", file=sys.stderr, flush=True)
                runs += [r | {"rep": rep} for r in run_repetition(binary, workers, args.sequences, args)]

    print(
        f"# busy_workers: python -m bench.studies.busy_workers {' '.join(argv if argv is not None else sys.argv[1:])}"
    )
    print(
        f"# {began}; Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} at the start"
    )
    print(
        f"# medians of {args.reps} runs, in us per step the model executed: the engine process (range; by thread:"
        " drain, exec, other), the workers together (and the cores they used), the generator (gen);"
        " p50/p99 in ms; busy: the machine's CPUs"
    )
    print(HEADER)
    medians = []
    for workers in args.workers:
        for sequences in args.sequences:
            row = median_row([r for r in runs if r["workers"] == workers and r["sequences"] == sequences])
            medians.append(row | {"workers": workers, "sequences": sequences})
            print(format_row(workers, sequences, row))
    if args.json:
        doc = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_average_at_start": load[0]},
            "began": began,
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "medians": medians,
            "runs": runs,
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0 if all(r["wrong"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
