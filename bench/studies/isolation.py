"""What process isolation costs per batch (docs/isolation.md).

    python -m bench.studies.isolation                       # about a minute
    python -m bench.studies.isolation --batches 2000 --reps 1 --json out.json   # quick

Sections:

1. ``execute`` per batch, called directly on a model instance (no scheduler, no event loop):
   the same batch-level model run in the server process (thread isolation) and in a child
   process (``IsolatedInstance``). Cases: the demo accumulator's batch (FP32 [B, 1] input and
   state, START/END/READY/CORRID) at B=1 and B=8, and the same model with 1 MiB of implicit
   state (FP32 [1, 262144]). After each call the bench does what the engine does with the
   result: copies outputs that are views (``Delivery``) and copies the state (``set_state``).
   Reported per batch: wall time median and p99 for each mode, the difference (the overhead
   isolation adds), and CPU time per batch in the server's calling thread and in the child.
   1b. The same process-isolated call with the caller busy for a while between batches (the
   gap), as a single client's closed loop leaves the child idle between steps: on a virtual
   machine an idle vCPU takes far longer to wake than a busy one.
2. End to end through ``Server.infer`` (in process): one sequence, one step at a time, on the
   demo accumulator, thread vs process isolation.
3. Where the time goes: a round trip between two processes with each wake-up mechanism
   (pipes, as used; a Unix socket; eventfd; a futex through ctypes; busy-polling shared memory,
   no syscall at all, which burns both cores), and the CPU cost of each protocol step measured
   alone in one process (parent encode, child decode, child encode, parent decode).

Wall times on a shared machine are noisy: every figure is the median over ``--reps``
repetitions of the per-repetition median (and p99). A calibration figure (a fixed pure-Python
loop) is printed so runs on different machines can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import mmap
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.engine import Server
from seqserve.engine.backends import InstanceContext, ModelContext, find_backend
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.config import finish_model_config, parse_model_config
from seqserve.engine.isolation import IsolatedInstance
from seqserve.engine.isolation import batches as batch_codec
from seqserve.engine.isolation import results as result_codec

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "seqserve" / "examples" / "models"
STATE_1MIB = 262144  # FP32 values

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  direct {{ }}
  state [ {{
    input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ {state} ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ {state} ] zero_data: true }}
  }} ]
}}
"""

MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total[:, :1], "SUM_OUT": total}
"""


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def calibration() -> float:
    """Microseconds for a fixed pure-Python loop (CPU speed and contention)."""
    return min(timeit.repeat("for i in range(1000): x = i * 2", number=200, repeat=5)) / 200 * 1e6


def child_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- section 1


def make_model(root: Path, name: str, state: int) -> ModelContext:
    d = root / name
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(CONFIG.format(name=name, state=state))
    (d / "1" / "model.py").write_text(MODEL)
    cfg = parse_model_config(d, name=name)
    finish_model_config(cfg, d)
    return ModelContext(name, 1, cfg, d, d / "1", {})


def make_batch(size: int, state: int) -> ExecuteBatch:
    rng = np.random.default_rng(1)
    return ExecuteBatch(
        size=size,
        instance=0,
        inputs={"INPUT": rng.normal(size=(size, 1)).astype(np.float32)},
        states={"SUM_IN": rng.normal(size=(size, state)).astype(np.float32)},
        controls={},
        start=np.zeros(size, bool),
        end=np.zeros(size, bool),
        ready=np.ones(size, bool),
        corrid=np.arange(1, size + 1, dtype=np.uint64),
        request_rows=[1] * size,
        request_outputs=[("OUTPUT",)] * size,
        request_ids=[""] * size,
    )


def run_batches(inst: Any, batch: ExecuteBatch, n: int, child_pid: int | None) -> dict[str, float]:
    walls: list[float] = []
    perf, tcpu = time.perf_counter_ns, time.thread_time
    c0, k0 = tcpu(), child_cpu_s(child_pid) if child_pid else 0.0
    for _ in range(n):
        t = perf()
        out = inst.execute(batch)
        o = out["OUTPUT"]
        if o.base is not None:  # the engine copies outputs that are views
            o = o.copy()
        s = np.array(out["SUM_OUT"])  # set_state copies into the core's store
        walls.append((perf() - t) / 1000)
    del o, s
    return {
        "median_us": statistics.median(walls),
        "p99_us": pct(walls, 0.99),
        "server_cpu_us": (tcpu() - c0) / n * 1e6,
        "child_cpu_us": ((child_cpu_s(child_pid) - k0) / n * 1e6) if child_pid else 0.0,
    }


def run_with_gaps(inst: Any, batch: ExecuteBatch, n: int, gap_us: float) -> float:
    walls: list[float] = []
    perf = time.perf_counter_ns
    for _ in range(n):
        t = perf()
        inst.execute(batch)
        walls.append((perf() - t) / 1000)
        end = perf() + gap_us * 1000
        while perf() < end:  # busy, as a caller that does other work
            pass
    return statistics.median(walls)


def section_gaps(root: Path, batches: int, reps: int) -> list[dict[str, Any]]:
    ctx = make_model(root, "gaps", 1)
    ictx = InstanceContext(ctx, 0, "gaps_0", "cpu")
    iso = IsolatedInstance(ictx)
    iso.wait_ready()
    batch = make_batch(1, 1)
    rows = []
    try:
        run_with_gaps(iso, batch, batches // 5, 0)
        for gap in (0, 25, 50, 100, 200, 500, 1000):
            n = max(200, batches // 5 if gap < 200 else batches // 20)
            p50 = statistics.median(run_with_gaps(iso, batch, n, gap) for _ in range(reps))
            rows.append({"gap_us": gap, "process_median_us": p50})
    finally:
        iso.finalize()
    return rows


def section_execute(root: Path, batches: int, reps: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case, size, state in (("small, B=1", 1, 1), ("small, B=8", 8, 1), ("1 MiB state, B=1", 1, STATE_1MIB)):
        ctx = make_model(root, f"m{len(rows)}", state)
        ictx = InstanceContext(ctx, 0, f"{ctx.name}_0", "cpu")
        inproc = find_backend(ctx.config)(ctx).create_instance(ictx)
        iso = IsolatedInstance(ictx)
        iso.wait_ready()
        pid = iso._child.pid if iso._child else None
        batch = make_batch(size, state)
        n = batches if state == 1 else max(200, batches // 10)
        res: dict[str, list[dict[str, float]]] = {"thread": [], "process": []}
        run_batches(inproc, batch, n // 5, None)  # warm-up
        run_batches(iso, batch, n // 5, pid)
        for _ in range(reps):
            res["thread"].append(run_batches(inproc, batch, n, None))
            res["process"].append(run_batches(iso, batch, n, pid))
        iso.finalize()
        row: dict[str, Any] = {"case": case, "batches": n, "reps": reps}
        for mode in ("thread", "process"):
            for key in ("median_us", "p99_us", "server_cpu_us", "child_cpu_us"):
                row[f"{mode}_{key}"] = statistics.median(r[key] for r in res[mode])
        row["added_median_us"] = row["process_median_us"] - row["thread_median_us"]
        row["added_p99_us"] = row["process_p99_us"] - row["thread_p99_us"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------- section 2


async def serve_steps(isolation: str, steps: int, syscalls: dict[str, list[float]] | None = None) -> dict[str, float]:
    server = Server(DEMO, python_isolation=isolation)
    await server.start(["accumulator"])
    lat: list[float] = []
    try:
        x = np.array([[1.0]], np.float32)
        for k in range(steps + 50):
            if k == 50 and syscalls is not None:
                for v in syscalls.values():
                    v.clear()
            t = time.perf_counter_ns()
            await server.infer("accumulator", {"INPUT": x}, sequence_id=1, sequence_start=k == 0)
            if k >= 50:
                lat.append((time.perf_counter_ns() - t) / 1000)
    finally:
        await server.shutdown(timeout_s=0)
    return {"median_us": statistics.median(lat), "p99_us": pct(lat, 0.99)}


def timed_channel_io(calls: dict[str, list[float]]) -> Any:
    """Patch the server side's Channel.send/recv to record their wall time (section 2b)."""
    from seqserve.engine.isolation import channel

    send, recv = channel.Channel.send, channel.Channel.recv
    perf = time.perf_counter_ns

    def timed_send(self: Any, body: Any, fds: Any = None) -> None:
        t = perf()
        send(self, body, fds)
        calls["send"].append((perf() - t) / 1000)

    def timed_recv(self: Any, timeout: float | None = None) -> Any:
        t = perf()
        out = recv(self, timeout)
        calls["recv"].append((perf() - t) / 1000)
        return out

    channel.Channel.send, channel.Channel.recv = timed_send, timed_recv  # type: ignore[method-assign]

    def undo() -> None:
        channel.Channel.send, channel.Channel.recv = send, recv  # type: ignore[method-assign]

    return undo


def section_server(steps: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": steps, "reps": reps}
    for mode in ("thread", "process"):
        runs = [asyncio.run(serve_steps(mode, steps)) for _ in range(reps)]
        out[f"{mode}_median_us"] = statistics.median(r["median_us"] for r in runs)
        out[f"{mode}_p99_us"] = statistics.median(r["p99_us"] for r in runs)
    out["added_median_us"] = out["process_median_us"] - out["thread_median_us"]
    # 2b: one more process run with the server's pipe writes and reads timed
    calls: dict[str, list[float]] = {"send": [], "recv": []}
    undo = timed_channel_io(calls)
    try:
        asyncio.run(serve_steps("process", steps, calls))
    finally:
        undo()
    n = min(len(calls["send"]), len(calls["recv"]))
    out["server_write_us"] = statistics.median(calls["send"][:n])
    out["server_wait_us"] = statistics.median(calls["recv"][:n])
    return out


# ---------------------------------------------------------------------------- section 3

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_FUTEX = 202 if platform.machine() == "x86_64" else 98  # x86_64 / aarch64


def _futex(addr: int, op: int, val: int) -> None:
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), op, val, None, None, 0)


def _pingpong(kind: str, n: int) -> list[float]:
    """Round trips of a tiny message between this process and a forked one."""
    perf = time.perf_counter_ns
    ts: list[float] = []
    if kind in ("pipe", "socket", "eventfd"):
        if kind in ("pipe", "socket"):  # os.read/os.write work on both
            if kind == "pipe":
                r1, w1 = os.pipe()
                r2, w2 = os.pipe()
                ends = ((r1, w2), (r2, w1))
            else:
                sa, sb = socket.socketpair()
                fa, fb = sa.detach(), sb.detach()
                ends = ((fb, fb), (fa, fa))

            def put(fd: int) -> None:
                os.write(fd, b"x" * 64)

            def get(fd: int) -> bool:
                return bool(os.read(fd, 256))

        else:
            e1, e2 = os.eventfd(0), os.eventfd(0)

            def put(fd: int) -> None:
                os.eventfd_write(fd, 1)

            def get(fd: int) -> bool:
                return os.eventfd_read(fd) == 1

            ends = ((e1, e2), (e2, e1))
        (c_in, c_out), (p_in, p_out) = ends
        pid = os.fork()
        if pid == 0:
            if kind == "pipe":
                os.close(p_in)
                os.close(p_out)
            while get(c_in):
                put(c_out)
            os._exit(0)
        for _ in range(n):
            t = perf()
            put(p_out)
            get(p_in)
            ts.append((perf() - t) / 1000)
        closed = {p_out}
        if kind == "eventfd":
            os.eventfd_write(p_out, 2)
            closed = set()
        elif kind == "pipe":
            os.close(p_out)
        else:
            sock = socket.socket(fileno=p_out)
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        os.waitpid(pid, 0)
        for fd in {c_in, c_out, p_in, p_out} - closed:
            os.close(fd)
        return ts
    mm = mmap.mmap(-1, 4096)
    words = (ctypes.c_int32 * 2).from_buffer(mm)
    base = ctypes.addressof(words)
    spin = kind == "spin"
    pid = os.fork()
    if pid == 0:
        seq = 0
        while True:
            cur = words[0]
            if cur == seq:
                if not spin:
                    _futex(base, 0, seq)  # FUTEX_WAIT while it still holds seq
                continue
            seq = cur
            if seq < 0:
                os._exit(0)
            words[1] = seq
            if not spin:
                _futex(base + 4, 1, 1)  # FUTEX_WAKE
    for i in range(1, n + 1):
        t = perf()
        words[0] = i
        if not spin:
            _futex(base, 1, 1)
        while True:
            cur = words[1]
            if cur == i:
                break
            if not spin:
                _futex(base + 4, 0, cur)
        ts.append((perf() - t) / 1000)
    words[0] = -1
    if not spin:
        _futex(base, 1, 1)
    os.waitpid(pid, 0)
    del words
    return ts


def section_wakeups(n: int) -> list[dict[str, Any]]:
    rows = []
    for kind in ("pipe", "socket", "eventfd", "futex", "spin"):
        ts = _pingpong(kind, n)
        rows.append({"mechanism": kind, "median_us": statistics.median(ts), "p99_us": pct(ts, 0.99)})
    return rows


def section_steps(root: Path) -> list[dict[str, Any]]:
    """CPU time of each protocol step, alone, in this process (thread_time, best of 5)."""
    batch = make_batch(1, 1)
    writer = batch_codec.BatchWriter()
    body, fds = writer.encode(batch, 1)
    reader = batch_codec.BatchReader()
    reader.decode(memoryview(body), [os.dup(fds[0])], 0, True)
    body, _ = writer.encode(batch, 2)
    mb = memoryview(body)
    reader.decode(mb, [], 0, True)
    names = ("OUTPUT", "SUM_OUT")
    produced = {"OUTPUT": np.ones((1, 1), np.float32), "SUM_OUT": np.ones((1, 1), np.float32)}
    rwriter = result_codec.ResultWriter(names)
    rbody, rfds = rwriter.encode(produced)
    rreader = result_codec.ResultReader(names)
    rreader.decode(memoryview(rbody), [os.dup(rfds[0])])
    rbody, _ = rwriter.encode(produced)
    mrb = memoryview(rbody)
    steps = {
        "server: batch -> request slab + EXEC": lambda: writer.encode(batch, 3),
        "child: EXEC -> views + ExecuteBatch": lambda: reader.decode(mb, [], 0, True),
        "child: result -> reply slab + RESULT": lambda: rwriter.encode(produced),
        "server: RESULT -> views": lambda: rreader.decode(mrb, []),
    }
    rows = []
    for name, fn in steps.items():
        n = 20000
        t = min(timeit.repeat(fn, number=n, repeat=5, timer=time.thread_time)) / n * 1e6
        rows.append({"step": name, "cpu_us": t})
    writer.close()
    rwriter.close()
    return rows


# ------------------------------------------------------------------------------- report


def report(doc: dict[str, Any]) -> str:
    lines = [
        f"seqserve isolation bench  python {doc['python']}  {doc['cpus']} CPUs  load {doc['load']}",
        f"calibration: {doc['calibration_us']:.1f} us for a 1000-iteration Python loop",
        "",
        "1. execute per batch, direct (us; median of per-rep medians / p99s)",
        f"{'case':18} {'thread p50':>10} {'p99':>8} {'process p50':>11} {'p99':>8} "
        f"{'added p50':>9} {'added p99':>9} {'server cpu':>10} {'child cpu':>9}",
    ]
    for r in doc["execute"]:
        lines.append(
            f"{r['case']:18} {r['thread_median_us']:10.1f} {r['thread_p99_us']:8.1f} "
            f"{r['process_median_us']:11.1f} {r['process_p99_us']:8.1f} {r['added_median_us']:9.1f} "
            f"{r['added_p99_us']:9.1f} {r['process_server_cpu_us']:10.1f} {r['process_child_cpu_us']:9.1f}"
        )
    lines += ["", "1b. process-isolated execute (small, B=1) after the caller was busy for a gap (us)"]
    for r in doc["gaps"]:
        lines.append(f"   gap {r['gap_us']:5d}   p50 {r['process_median_us']:7.1f}")
    s = doc["server"]
    lines += [
        "",
        f"2. Server.infer, one sequence, one step at a time ({s['steps']} steps x {s['reps']} reps, us)",
        f"   thread  p50 {s['thread_median_us']:.1f}  p99 {s['thread_p99_us']:.1f}",
        f"   process p50 {s['process_median_us']:.1f}  p99 {s['process_p99_us']:.1f}"
        f"   added p50 {s['added_median_us']:.1f}",
        f"2b. in that loop, the server's write of EXEC (wakes the child) p50 {s['server_write_us']:.1f} us,",
        f"    its wait for RESULT (child's work + its write + waking the server) p50 {s['server_wait_us']:.1f} us",
        "",
        "3a. round trip between two processes, tiny message (us)",
    ]
    for r in doc["wakeups"]:
        lines.append(f"   {r['mechanism']:8} p50 {r['median_us']:6.1f}  p99 {r['p99_us']:8.1f}")
    lines += ["", "3b. CPU per protocol step, alone (us)"]
    for r in doc["steps"]:
        lines.append(f"   {r['step']:40} {r['cpu_us']:6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=10000, help="batches per repetition (small tensors)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000, help="Server.infer steps per repetition")
    ap.add_argument("--roundtrips", type=int, default=20000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    doc: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "calibration_us": calibration(),
    }
    doc["wakeups"] = section_wakeups(args.roundtrips)  # forks: before any thread starts
    with tempfile.TemporaryDirectory() as tmp:
        doc["steps"] = section_steps(Path(tmp))
        doc["execute"] = section_execute(Path(tmp), args.batches, args.reps)
        doc["gaps"] = section_gaps(Path(tmp), args.batches, args.reps)
    doc["server"] = section_server(args.steps, args.reps)
    doc["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(report(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
