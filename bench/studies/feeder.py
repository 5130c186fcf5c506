"""The engine's own CPU per step on the compiled ring path (issue 27; bench/docs/rings.md).

    python -m bench.studies.feeder --json bench/results/feeder.json   # about a minute

The engine side is this process: the demo ``accumulator`` (a Python model: one line of numpy
per batch) with Oldest batching, ``max_batch_size`` 64, served to the rings by a
``RingFeeder``: its drain thread submits every record to the scheduler and writes every reply
in C++; Python runs once per batch (``execute`` and the per-batch hand-off of the outputs).
Worker processes (forked before the engine starts its threads) step their sequences in lock
step from Python: push one step of each of their sequences, wait for the replies, check every
running sum, repeat. What is measured: the engine process's CPU (getrusage: every thread of it,
the model's ``execute`` included) per step, wall steps/s, and the mean batch size.

Cases: 1 sequence (batches of 1: every step crosses both rings and wakes the engine) with the
drain thread spinning 50 us before it sleeps and with no spin; 64 sequences over 2 workers,
batches formed as soon as a step is there (up to 64), and batches held up to 5 ms for 64 steps
(Oldest's ``max_queue_delay_microseconds``: the workers' lock step fills them). Each figure is
the median over ``--reps`` repetitions. On the project's 2-CPU machine the workers and the
engine share the cores.

``--batch-sizes 1,4,8,16,32,64`` runs exact batch sizes instead (n sequences, Oldest holding
up to 5 ms for a batch of n): the engine's CPU per step and per batch at each size, so that the
per-batch and per-row costs can be told apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import RequestHeader, RingFeeder, ShmRegion
from seqserve.engine.model.loaded import LoadedModel

FORK = multiprocessing.get_context("fork")
Fds = tuple[int, int, list[int]]
TARGET = 1
MODEL_SOURCE = Path(__file__).resolve().parents[2] / "src/seqserve/examples/models/accumulator"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker_loop(fds: Fds, worker: int, sequences: list[int], steps: int, out: Connection) -> None:
    """Steps `sequences` in lock step; sends back how many running sums were wrong."""
    region = ShmRegion.attach(*fds)
    sums = dict.fromkeys(sequences, 0.0)
    wrong = 0
    for step in range(steps):
        for seq in sequences:
            block = region.alloc(worker, True, 4)
            np.frombuffer(region.buffer(block, 4), dtype=np.float32)[0] = seq
            sums[seq] += seq
            header = RequestHeader(handle=step * 100_000 + seq, sequence_id=seq, start=step == 0, end=step == steps - 1)
            while not region.push_request(worker, TARGET, header, [(0, block, 4, [1, 1])]):
                time.sleep(0.0001)
        answered = 0
        while answered < len(sequences):
            replies = region.pop_replies(worker)
            if not replies:
                region.wait_replies(worker, 1.0)
                continue
            for handle, _flags, code, _error, outputs in replies:
                _, offset, nbytes, _ = outputs[0]
                got = float(np.frombuffer(region.buffer(offset, nbytes), dtype=np.float32)[0])
                wrong += code != 0 or got != sums[handle % 100_000]
                region.free(worker, False, offset)
                answered += 1
    out.send(wrong)


def load_model(model_dir: Path, delay_us: int, preferred: int = 64) -> LoadedModel:
    config = (MODEL_SOURCE / "config.pbtxt").read_text()
    config = config.replace("max_batch_size: 8", "max_batch_size: 64")
    oldest = (
        f"max_candidate_sequences: 1024 preferred_batch_size: [ {preferred} ] max_queue_delay_microseconds: {delay_us}"
    )
    config = config.replace("direct { }", f"oldest {{ {oldest} }}")
    config = config.replace("count: 2", "count: 1")
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "1" / "model.py").write_text((MODEL_SOURCE / "1" / "model.py").read_text())
    cfg = text_format.Parse(config, mc.ModelConfig())
    return LoadedModel(cfg, version=1, model_dir=model_dir, loop=asyncio.new_event_loop())


def run_case(
    sequences: int, workers: int, steps: int, spin_us: float, delay_us: int = 0, preferred: int = 64
) -> dict[str, Any]:
    region = ShmRegion(workers=workers)
    fds = (region.fd, region.engine_eventfd, region.worker_eventfds)
    pipes = [FORK.Pipe(duplex=False) for _ in range(workers)]
    go = [FORK.Pipe(duplex=False) for _ in range(workers)]
    children = []
    for w in range(workers):
        mine = list(range(1 + w, sequences + 1, workers))
        child = FORK.Process(target=start_when_told, args=(go[w][0], fds, w, mine, steps, pipes[w][1]), daemon=True)
        child.start()
        children.append(child)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_model(Path(tmp), delay_us, preferred)
        feeder = RingFeeder(region, spin_us=spin_us)
        try:
            assert model.serve_rings(feeder, TARGET)
            cpu0, wall0 = cpu_seconds(), time.perf_counter()
            for _, send in go:
                send.send(True)
            wrong = sum(receive.recv() for receive, _ in pipes)
            wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
            stats = model.statistics()
        finally:
            feeder.close()
            model.close(force=True)
    for child in children:
        child.join(timeout=30)
    total = sequences * steps
    return {
        "steps": total,
        "wrong": wrong,
        "steps_per_s": total / wall,
        "engine_cpu_us_per_step": cpu / total * 1e6,
        "engine_cpu_us_per_batch": cpu / max(1, stats["execution_count"]) * 1e6,
        "mean_batch": stats["inference_count"] / max(1, stats["execution_count"]),
    }


def start_when_told(go: Connection, *args: Any) -> None:
    go.recv()  # the engine is up: start stepping
    worker_loop(*args)


def median_case(reps: int, **case: Any) -> dict[str, Any]:
    runs = [run_case(**case) for _ in range(reps)]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "wrong"}
    out["wrong"] = sum(r["wrong"] for r in runs)
    return out | {"case": case}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps-single", type=int, default=5000, help="steps of the one sequence")
    ap.add_argument("--steps-batched", type=int, default=300, help="steps of each of the 64 sequences")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--batch-sizes",
        default="",
        help="instead of the cases above: exact batches of each size (e.g. 1,4,8,16,32,64): that many "
        "sequences over 2 workers in lock step, Oldest holding up to 5 ms for a batch of that size",
    )
    args = ap.parse_args(argv)
    cases = {
        "batch 1, spin 50 us": {"sequences": 1, "workers": 1, "steps": args.steps_single, "spin_us": 50.0},
        "batch 1, no spin": {"sequences": 1, "workers": 1, "steps": args.steps_single, "spin_us": 0.0},
        "batches up to 64, spin 50 us": {"sequences": 64, "workers": 2, "steps": args.steps_batched, "spin_us": 50.0},
        "batches of 64 (queue delay 5 ms)": {
            "sequences": 64,
            "workers": 2,
            "steps": args.steps_batched,
            "spin_us": 50.0,
            "delay_us": 5000,
        },
    }
    if args.batch_sizes:
        cases = {
            f"batches of {n}": {
                "sequences": n,
                "workers": min(2, n),
                "steps": max(args.steps_batched, 2000 // n),
                "spin_us": 50.0,
                "delay_us": 5000,
                "preferred": n,
            }
            for n in (int(x) for x in args.batch_sizes.split(","))
        }
    results = {}
    load = os.getloadavg()
    print(f"# feeder: python -m bench.studies.feeder {' '.join(argv or sys.argv[1:])}")
    print(f"# Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load[0]:.1f} at the start")
    print(f"{'case':<32} {'steps/s':>9} {'engine CPU us/step':>19} {'us/batch':>9} {'mean batch':>11} {'wrong':>6}")
    for name, case in cases.items():
        r = median_case(args.reps, **case)
        results[name] = r
        print(
            f"{name:<32} {r['steps_per_s']:>9.0f} {r['engine_cpu_us_per_step']:>19.2f} "
            f"{r['engine_cpu_us_per_batch']:>9.1f} "
            f"{r['mean_batch']:>11.1f} {r['wrong']:>6d}"
        )
    doc = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_average_at_start": load[0]},
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
