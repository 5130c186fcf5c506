"""GPU instances against the CPU path (docs/gpu.md), in process, for the device check.

    python -m bench.studies.gpu --out DIR                  # about 2 minutes on one GPU
    python -m bench.studies.gpu --seconds 1 --out DIR      # quick

1. An LSTM cell (input 128, hidden 1024, TorchScript, h and c as implicit state), served twice:
   ``KIND_GPU`` and ``KIND_CPU``, Oldest with 512 candidate sequences and batches of up to 512.
   N sequences (1, 64, 512) each step in a closed loop (a sequence's next step is submitted when
   its previous one answered), through ``Server.submit``, for ``--seconds``. Reported: steps/s,
   p50 and p99 of a step's latency, and batches/s.
2. The state copies of one batch on the device (``DeviceStateTable``: reset, gather, scatter of
   h and c, 2 x 4 KiB per row), per batch size, timed over 200 batches with the stream
   synchronized at the end: the cost the device path adds to each batch.

Needs a CUDA device, torch with CUDA and cuda-python; without them it says why and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

INPUT, HIDDEN = 128, 1024
COUNTS = (1, 64, 512)

CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 512
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {input} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {hidden} ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  oldest {{ max_candidate_sequences: 512 max_queue_delay_microseconds: 200 }}
  state [
    {{ input_name: "H_IN" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ {hidden} ]
      initial_state {{ name: "h" data_type: TYPE_FP32 dims: [ {hidden} ] zero_data: true }} }},
    {{ input_name: "C_IN" output_name: "C_OUT" data_type: TYPE_FP32 dims: [ {hidden} ]
      initial_state {{ name: "c" data_type: TYPE_FP32 dims: [ {hidden} ] zero_data: true }} }}
  ]
}}
instance_group [ {{ count: 1 kind: {kind} }} ]
"""


def gpu_missing() -> str:
    from seqserve.engine.device.probe import torch_gpu_missing

    return torch_gpu_missing()


def write_models(repo: Path, cpu_only: bool) -> None:
    import torch
    from torch import Tensor, nn

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = nn.LSTMCell(INPUT, HIDDEN)

        def forward(self, INPUT: Tensor, H_IN: Tensor, C_IN: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            h, c = self.cell(INPUT, (H_IN, C_IN))
            return h, h, c

    torch.manual_seed(0)
    module = torch.jit.script(Cell())
    kinds = [("lstm_cpu", "KIND_CPU")] + ([] if cpu_only else [("lstm_gpu", "KIND_GPU")])
    for name, kind in kinds:
        (repo / name / "1").mkdir(parents=True)
        module.save(str(repo / name / "1" / "model.pt"))
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, input=INPUT, hidden=HIDDEN, kind=kind))


async def closed_loop(server: Any, model: str, sequences: int, seconds: float) -> dict[str, float]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, INPUT)).astype(np.float32)
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    base = 1_000_000 * (1 + sequences)

    async def one(sid: int) -> int:
        steps = 0
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await server.submit(model, {"INPUT": x}, sequence_id=base + sid, sequence_start=steps == 0)
            latencies.append(time.perf_counter() - t0)
            steps += 1
        await server.submit(model, {"INPUT": x}, sequence_id=base + sid, sequence_end=True)
        return steps

    (before,) = server.statistics(model)
    t0 = time.perf_counter()
    steps = sum(await asyncio.gather(*(one(i) for i in range(sequences))))
    elapsed = time.perf_counter() - t0
    (after,) = server.statistics(model)
    lat = np.array(latencies) * 1e6
    return {
        "steps_per_s": steps / elapsed,
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
        "batches_per_s": (after.execution_count - before.execution_count) / elapsed,
    }


def state_copy_cost(batch_sizes: tuple[int, ...], reps: int = 200) -> list[dict[str, float]]:
    import torch

    from seqserve.engine._core import StateSpec
    from seqserve.engine.device.cuda import CudaStream
    from seqserve.engine.device.state_table import DeviceStateTable

    zeros = np.zeros(HIDDEN, np.float32).tobytes()
    specs = [
        StateSpec(input_name=n, output_name=n + "_OUT", dtype=np.dtype(np.float32), dims=[HIDDEN], initial=zeros,
                  initial_dims=[HIDDEN])
        for n in ("H", "C")
    ]  # fmt: skip
    stream = CudaStream(0)
    table = DeviceStateTable(specs, slots=512, max_rows=512, batched=True, memory=stream)
    rng = np.random.default_rng(2)
    out = []
    try:
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.handle)):
            for b in batch_sizes:
                nxt = torch.zeros((b, HIDDEN), device="cuda:0")
                slots = rng.permutation(512)[:b].astype(np.int32)  # out of order: gathered
                ready, start = np.ones(b, bool), np.zeros(b, bool)
                start[:: max(1, b // 8)] = True
                stream.synchronize()
                t0 = time.perf_counter()
                for _ in range(reps):
                    table.begin(slots, ready, start)
                    table.commit("H", nxt)
                    table.commit("C", nxt)
                    table.finish()
                stream.synchronize()
                out.append({"batch": b, "us_per_batch": (time.perf_counter() - t0) / reps * 1e6})
    finally:
        table.close()
        stream.close()
    return out


async def run(seconds: float, counts: tuple[int, ...], cpu_only: bool) -> dict[str, Any]:
    from seqserve.engine import Server

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        write_models(repo, cpu_only)
        server = Server(repo)
        await server.start()
        try:
            rows = []
            for model in ("lstm_cpu",) if cpu_only else ("lstm_gpu", "lstm_cpu"):
                await closed_loop(server, model, 8, min(1.0, seconds))  # warm-up
                for n in counts:
                    r = await closed_loop(server, model, n, seconds)
                    r.update(model=model, sequences=n)
                    rows.append(r)
                    print(
                        f"{model:9} {n:4} seqs  {r['steps_per_s']:10.0f} steps/s  p50 {r['p50_us']:9.0f} us  "
                        f"p99 {r['p99_us']:9.0f} us  {r['batches_per_s']:8.0f} batches/s",
                        flush=True,
                    )
        finally:
            await server.shutdown()
    copies = [] if cpu_only else state_copy_cost((1, 64, 512))
    for c in copies:
        print(f"state copies (reset+gather+scatter of h, c), B={c['batch']:3}: {c['us_per_batch']:.1f} us per batch")
    return {"lstm": rows, "state_copies": copies}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per measured point (default 5)")
    ap.add_argument("--out", type=Path, help="folder for gpu_bench.json")
    ap.add_argument("--counts", default=",".join(map(str, COUNTS)), help="sequence counts (default 1,64,512)")
    ap.add_argument("--cpu-only", action="store_true", help="the CPU path only (checks the bench without a GPU)")
    args = ap.parse_args()
    counts = tuple(int(c) for c in args.counts.split(","))
    why = "" if args.cpu_only else gpu_missing()
    if why:
        print(f"bench.studies.gpu: no GPU ({why})", file=sys.stderr)
        return 2
    import torch

    device = "CPU only" if args.cpu_only else torch.cuda.get_device_name(0)
    print(f"device: {device}, torch {torch.__version__}, cpu threads {os.cpu_count()}")
    doc = asyncio.run(run(args.seconds, counts, args.cpu_only))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_bench.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
