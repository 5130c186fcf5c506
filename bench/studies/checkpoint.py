"""What moving a sequence costs: checkpoint and restore per sequence, by state size.

    python -m bench.studies.checkpoint                 # about a minute
    python -m bench.studies.checkpoint --sizes 4,1024 --reps 500

Two servers in this process serve one Direct model (python backend, one FP32 implicit state of
the given size, 8 slots); one sequence is started on the first, then moved back and forth:

    checkpoint(release=True) on the holder -> to_bytes -> from_bytes -> restore on the other

Each operation is timed on its own (time.perf_counter around the call, on the event loop, as a
coordinator would call it), ``--reps`` moves per size after ``--warmup``; the table gives the
median and p99 of each in microseconds, ``ckpt+restore`` (the engine's part: checkpoint and
restore, per sequence) and ``total`` (all four). ``copy`` is the floor: ``bytes()`` of a buffer
of the state's size. Every ``--verify`` moves a step runs on the sequence and its sum is checked.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from seqserve.engine import SequenceCheckpoint, Server

MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        s = batch.states["S"]
        new = s + batch.inputs["X"][:, :1]
        return {"Y": new[:, :1].copy(), "S_OUT": new}
"""


def config(elems: int) -> str:
    return textwrap.dedent(f"""
        name: "m"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        sequence_batching {{
          max_sequence_idle_microseconds: 600000000
          direct {{ }}
          state [ {{
            input_name: "S" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ {elems} ]
            initial_state {{ data_type: TYPE_FP32 dims: [ {elems} ] zero_data: true name: "z" }}
          }} ]
        }}
    """)


def stats_us(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e6, xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e6


async def one_size(nbytes: int, reps: int, warmup: int, verify: int) -> dict[str, tuple[float, float]]:
    elems = max(1, nbytes // 4)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        (repo / "m" / "1").mkdir(parents=True)
        (repo / "m" / "config.pbtxt").write_text(config(elems))
        (repo / "m" / "1" / "model.py").write_text(MODEL)
        servers = [Server(repo), Server(repo)]
        for s in servers:
            await s.start()
        try:
            return await moves(servers, nbytes, reps, warmup, verify)
        finally:
            for s in servers:
                await s.shutdown(timeout_s=0)


async def moves(
    servers: list[Server], nbytes: int, reps: int, warmup: int, verify: int
) -> dict[str, tuple[float, float]]:
    one = np.ones((1, 1), np.float32)
    await servers[0].infer("m", {"X": one}, sequence_id=1, sequence_start=True)
    total = 1.0
    times: dict[str, list[float]] = {k: [] for k in ("checkpoint", "to_bytes", "from_bytes", "restore")}
    pc = time.perf_counter
    holder = 0
    for i in range(warmup + reps):
        src, dst = servers[holder], servers[1 - holder]
        t0 = pc()
        ckpt = src.checkpoint_sequence("m", 1, 1, release=True)
        t1 = pc()
        assert ckpt is not None
        data = ckpt.to_bytes()
        t2 = pc()
        back = SequenceCheckpoint.from_bytes(data)
        t3 = pc()
        dst.restore_sequence(back)
        t4 = pc()
        holder = 1 - holder
        # The previous move's buffers are freed here, outside the timed calls (freeing 1 MiB
        # returns it to the OS: it would land on whichever call dropped the last reference).
        del ckpt, data, back
        if i >= warmup:
            for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[k].append(dt)
        if verify and i % verify == 0:
            r = await dst.infer("m", {"X": one}, sequence_id=1)
            total += 1.0
            got = float(r.outputs["Y"][0, 0])
            assert got == total, (got, total)
    buf = bytearray(nbytes)
    copies = []
    for _ in range(reps):
        t0 = pc()
        bytes(buf)
        copies.append(pc() - t0)
    out = {k: stats_us(v) for k, v in times.items()}
    out["ckpt+restore"] = stats_us([a + b for a, b in zip(times["checkpoint"], times["restore"], strict=True)])
    out["total"] = stats_us([sum(x) for x in zip(*times.values(), strict=True)])
    out["copy"] = stats_us(copies)
    return out


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B"


async def main(args: argparse.Namespace) -> None:
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"checkpoint bench: python {platform.python_version()}, {platform.machine()}, reps {args.reps}")
    cols = ("checkpoint", "to_bytes", "from_bytes", "restore", "ckpt+restore", "total", "copy")
    print(f"{'state':>8}  " + "  ".join(f"{c:>17}" for c in cols))
    print(f"{'':>8}  " + "  ".join(f"{'p50 / p99 us':>17}" for _ in cols))
    for n in sizes:
        reps = args.reps if n < 1 << 18 else max(50, args.reps // 10)
        r = await one_size(n, reps, args.warmup, args.verify)
        print(f"{human(n):>8}  " + "  ".join(f"{r[c][0]:8.1f} /{r[c][1]:8.1f}" for c in cols), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4,1024,65536,1048576", help="state sizes in bytes, comma-separated")
    p.add_argument("--reps", type=int, default=2000, help="timed moves per size (a tenth from 256 KiB up)")
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--verify", type=int, default=100, help="run and check a step every N moves (0: never)")
    asyncio.run(main(p.parse_args()))
