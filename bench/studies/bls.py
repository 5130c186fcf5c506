"""What one BLS call costs: a sequence step sent to the demo `accumulator` directly, against the
same step sent to a model that calls `accumulator` from its execute.

    python -m bench.studies.bls                      # well under a minute
    python -m bench.studies.bls --steps 400 --sequences 1,16 --json bench/results/bls.json

One in-process ``Server`` serves four models: the demo ``accumulator`` (Direct, implicit state,
two instances), ``bls_triton`` (a Triton-style Python model whose execute calls accumulator with
``pb_utils.InferenceRequest(...).exec()``, one request after the other, passing its sequence's
correlation id and flags), ``bls_async`` (the same with ``async def execute``: a batch's calls go
out at once with ``async_exec`` and ``asyncio.gather``) and ``bls_batch`` (a batch-level model
calling it with ``ctx.infer``, one row after the other). The callers are Direct sequence models
with two instances, as accumulator.

Workload: ``--sequences`` closed-loop sequences (each awaits its step before sending the next) of
``--steps`` steps, through ``await Server.infer``; every sum is checked. Latency is per step
(``time.perf_counter_ns`` around the await), median and p99 over all steps after ``--warmup``
steps per sequence; steps/s is all steps over the wall time. ``--reps`` repetitions, the four
models taking turns (so that a noisy moment of a shared machine hits all of them); the figures
are the median over the repetitions. ``added`` is the
caller's median minus the direct median: what one BLS call adds to a step (the caller's own
batch, the loop hop to queue the call, the callee's batch, and the hop back to the caller's
executor thread, which waits with the GIL released).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.engine import Server

DEMO = Path(__file__).resolve().parents[2] / "src" / "seqserve" / "examples" / "models"

CALLER_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  direct {{ }}
}}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""

TRITON_CALLER = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="accumulator",
                requested_output_names=["OUTPUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT")],
                correlation_id=request.correlation_id(),
                flags=request.flags(),
            )
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return responses
"""

#: the demo BLS model: the calls of a batch go out together (async execute, async_exec)
ASYNC_CALLER = (DEMO / "accumulator_bls" / "1" / "model.py").read_text()

BATCH_CALLER = """\
import numpy as np


class Model:
    def initialize(self, ctx):
        self.ctx = ctx

    def execute(self, batch):
        out = np.zeros_like(batch.inputs["INPUT"])
        for i in range(batch.size):
            if batch.ready[i]:
                r = self.ctx.infer(
                    "accumulator",
                    {"INPUT": batch.inputs["INPUT"][i : i + 1]},
                    sequence_id=int(batch.corrid[i]),
                    sequence_start=bool(batch.start[i]),
                    sequence_end=bool(batch.end[i]),
                )
                out[i] = r.outputs["OUTPUT"][0]
        return {"OUTPUT": out}
"""


MODELS = ("accumulator", "bls_triton", "bls_async", "bls_batch")


def write_repo(root: Path) -> None:
    shutil.copytree(DEMO / "accumulator", root / "accumulator", ignore=shutil.ignore_patterns("__pycache__"))
    for name, source in (("bls_triton", TRITON_CALLER), ("bls_async", ASYNC_CALLER), ("bls_batch", BATCH_CALLER)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CALLER_CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(source)


async def one_sequence(server: Server, model: str, sid: int, steps: int, warmup: int, lat: list[int]) -> None:
    total = 0.0
    for k in range(steps):
        x = float(k % 7)
        total += x
        t0 = time.perf_counter_ns()
        r = await server.infer(
            model,
            {"INPUT": np.array([[x]], np.float32)},
            sequence_id=sid,
            sequence_start=k == 0,
            sequence_end=k == steps - 1,
        )
        t1 = time.perf_counter_ns()
        got = float(r.outputs["OUTPUT"].reshape(-1)[0])
        if got != total:
            raise AssertionError(f"{model} sequence {sid} step {k}: sum {got}, expected {total}")
        if k >= warmup:
            lat.append(t1 - t0)


class Ids:
    """Fresh sequence ids for every run."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> int:
        first = self.next
        self.next += n
        return first


async def run_once(
    server: Server, model: str, sequences: int, steps: int, warmup: int, ids: Ids
) -> tuple[list[int], float]:
    """One repetition: every step's latency (after warm-up) and the wall time."""
    lat: list[int] = []
    first = ids.take(sequences)
    t0 = time.perf_counter()
    await asyncio.gather(*(one_sequence(server, model, first + i, steps, warmup, lat) for i in range(sequences)))
    return lat, time.perf_counter() - t0


def summary(model: str, sequences: int, steps: int, reps: list[tuple[list[int], float]]) -> dict[str, Any]:
    """Median of the repetitions' medians (and p99s); steps/s: the median repetition's."""
    medians = [statistics.median(lat) / 1000 for lat, _ in reps]
    p99s = [sorted(lat)[min(len(lat) - 1, int(len(lat) * 0.99))] / 1000 for lat, _ in reps]
    rates = [sequences * steps / wall for _, wall in reps]
    return {
        "model": model,
        "sequences": sequences,
        "steps": steps,
        "reps": len(reps),
        "median_us": statistics.median(medians),
        "rep_medians_us": medians,
        "p99_us": statistics.median(p99s),
        "steps_per_s": statistics.median(rates),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_repo(root)
        server = Server(root)
        await server.start()
        try:
            ids = Ids()
            for sequences in args.sequences:
                reps: dict[str, list[tuple[list[int], float]]] = {m: [] for m in MODELS}
                for model in MODELS:  # warm-up
                    await run_once(server, model, sequences, args.warmup + 2, args.warmup, ids)
                for _ in range(args.reps):  # the models take turns, so that a noisy moment hits all
                    for model in MODELS:
                        reps[model].append(await run_once(server, model, sequences, args.steps, args.warmup, ids))
                rows += [summary(m, sequences, args.steps, reps[m]) for m in MODELS]
        finally:
            await server.shutdown(timeout_s=5)
    for row in rows:
        direct = next(r for r in rows if r["model"] == "accumulator" and r["sequences"] == row["sequences"])
        row["added_us"] = row["median_us"] - direct["median_us"]
    return {
        "command": "python -m bench.studies.bls " + " ".join(args.argv),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "rows": rows,
    }


def report(doc: dict[str, Any]) -> str:
    lines = [
        f"# {doc['command']}",
        f"# python {doc['machine']['python']}, {doc['machine']['cpus']} CPUs, {doc['machine']['platform']}",
        "",
        f"{'path':<12} {'sequences':>9} {'median us':>10} {'p99 us':>9} {'steps/s':>9} {'added us':>9}",
    ]
    for r in doc["rows"]:
        lines.append(
            f"{r['model']:<12} {r['sequences']:>9} {r['median_us']:>10.1f} {r['p99_us']:>9.1f} "
            f"{r['steps_per_s']:>9.0f} {r['added_us']:>9.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import sys

    raw = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="steps per sequence (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="steps per sequence left out of the figures")
    p.add_argument(
        "--sequences",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 16],
        help="concurrent sequences, comma separated (default 1,16)",
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions, the models taking turns (default 3)")
    p.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = p.parse_args(raw)
    args.argv = raw
    doc = asyncio.run(main_async(args))
    print(report(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
