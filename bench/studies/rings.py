"""What the worker -> engine shared-memory rings cost (issue 27; bench/docs/rings.md).

    python -m bench.studies.rings                          # about half a minute
    python -m bench.studies.rings --records 200000 --reps 1 --json out.json   # quick

Sections:

1. Throughput across processes: P producer processes (forked, each attaching to the region from
   its descriptors) push checked records into the request rings in C++ loops; the engine side
   (this process) drains them in C++ (``Region::drain_requests``, the path the engine will use)
   and checks each one (per-producer order, checksum, tensor bytes). Reported: records/s, wall
   ns per record (push + pop, all processes together), and the engine side's CPU ns per record
   (getrusage of this process around the drain). Cases: 1 and 4 producers; an engine that
   busy-polls, one that sleeps on its doorbell as soon as the rings are empty, and one that
   keeps looking for 50 us first; records with a 256-byte tensor in a slab block (allocated and
   written by the producer, read in place and freed by the engine).
2. Paced producers: each pushes one record, then pauses ``--pause-us``, so the engine sleeps
   between records; reported: the share of records that needed an eventfd write (a wake-up), and
   the engine's CPU per record when it sleeps instead of spinning.
3. Round trip through Python, both sides sleeping: a worker process pushes a request from Python
   and sleeps on its reply ring; this process wakes on the request ring, pops it in Python and
   pushes the reply. Median and p99 microseconds per round trip (two eventfd wake-ups each).
4. The Python methods alone, in one process: push_request + pop_request, push_reply + pop_reply
   (what a worker's event loop pays per record from Python; the engine will not use these).

Each figure is the median over ``--reps`` repetitions. The machine's load matters: on the
project's 2-CPU machine producers and the consumer share the cores.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.engine._core import RequestHeader, ShmRegion

FORK = multiprocessing.get_context("fork")
Fds = tuple[int, int, list[int]]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def producer(fds: Fds, worker: int, first_id: int, count: int, settings: dict[str, int], out: Connection) -> None:
    region = ShmRegion.attach(*fds)
    start = cpu_seconds()
    checksum = region.stress_produce(worker, first_id, count, **settings)
    out.send((checksum, cpu_seconds() - start))


def throughput(processes: int, records: int, *, sleep: bool, spin_us: float = 0, **settings: int) -> dict[str, Any]:
    """One run: `processes` producers, `records` in all, drained here."""
    region = ShmRegion(workers=max(1, min(processes, 4)), request_slots=1024, slab_classes=[(256, 256), (4096, 16)])
    fds = (region.fd, region.engine_eventfd, region.worker_eventfds)
    threads = settings.get("threads", 1)
    producers = processes * threads
    count = records // producers  # per producer thread
    pipes = []
    children = []
    for p in range(processes):
        ours, theirs = FORK.Pipe(duplex=False)
        args = (fds, p % region.workers, p * threads, count, settings, theirs)
        child = FORK.Process(target=producer, args=args, daemon=True)
        child.start()
        pipes.append(ours)
        children.append(child)
    cpu_before = cpu_seconds()
    result = region.stress_consume(producers, count * producers, sleep=sleep, limit=600, spin_us=spin_us)
    engine_cpu = cpu_seconds() - cpu_before
    if result["records"] < count * producers:  # ran past the limit: producers would spin forever
        for child in children:
            child.terminate()
        raise SystemExit(f"only {result['records']} of {count * producers} records arrived: {result}")
    sent = [pipe.recv() for pipe in pipes]
    for child in children:
        child.join()
    checksum = sum(s for s, _ in sent) & ((1 << 64) - 1)
    ok = (
        result["records"] == count * producers
        and result["misordered"] == 0
        and result["bad"] == 0
        and int(result["checksum"]) == checksum
    )
    n = result["records"]
    counters = region.counters()
    return {
        "records": n,
        "ok": ok,
        "records_per_s": n / result["seconds"],
        "wall_ns_per_record": result["seconds"] * 1e9 / n,
        "engine_cpu_ns_per_record": engine_cpu * 1e9 / n,
        "producer_cpu_ns_per_record": sum(c for _, c in sent) * 1e9 / n,
        "wakes_per_record": counters["engine_wakes"] / n,
        "engine_sleeps": counters["engine_sleeps"],
    }


def round_trip_worker(fds: Fds, trips: int, out: Connection) -> None:
    region = ShmRegion.attach(*fds)
    times = []
    for handle in range(1, trips + 1):
        start = time.perf_counter()
        while not region.push_request(0, 0, RequestHeader(handle=handle)):
            pass
        while (reply := region.pop_reply(0)) is None:
            region.wait_replies(0, 10.0)
        times.append(time.perf_counter() - start)
        assert reply[0] == handle
    out.send(times)


def round_trips(trips: int) -> dict[str, float]:
    region = ShmRegion(workers=1)
    ours, theirs = FORK.Pipe(duplex=False)
    fds = (region.fd, region.engine_eventfd, region.worker_eventfds)
    child = FORK.Process(target=round_trip_worker, args=(fds, trips, theirs), daemon=True)
    child.start()
    for _ in range(trips):
        while (record := region.pop_request(0)) is None:
            region.wait_requests(10.0)
        region.push_reply(0, record[2].handle)
    times = sorted(ours.recv())
    child.join()
    return {
        "trips": trips,
        "median_us": statistics.median(times) * 1e6,
        "p99_us": times[int(len(times) * 0.99)] * 1e6,
    }


def python_calls(records: int) -> dict[str, float]:
    region = ShmRegion(workers=1, request_slots=1024, reply_slots=1024)
    header = RequestHeader(handle=1, sequence_id=5, start=True)
    block = region.alloc(0, True, 64)
    inputs = [(0, block, 64, [16])]
    batch = 512
    start = time.perf_counter()
    for _ in range(records // batch):
        for _ in range(batch):
            region.push_request(0, 0, header, inputs)
        for _ in range(batch):
            region.pop_request(0)
    requests = (time.perf_counter() - start) * 1e9 / (records // batch * batch)
    start = time.perf_counter()
    for _ in range(records // batch):
        for h in range(batch):
            region.push_reply(0, h)
        for _ in range(batch):
            region.pop_reply(0)
    replies = (time.perf_counter() - start) * 1e9 / (records // batch * batch)
    return {"request_push_pop_ns": requests, "reply_push_pop_ns": replies} | tensor_copies(region, records // 10)


def tensor_copies(region: ShmRegion, n: int) -> dict[str, float]:
    """A worker's copy of one FP32 [1, 1] tensor into a block and of one out of it: through a
    view (``buffer``: a memoryview that pybind11 ties to the region with a weak reference) and
    through ``write`` / ``read`` (a copy in C++, no view)."""
    block = region.alloc(0, False, 64)
    arr: Any = np.ones((1, 1), np.float32)
    dtype = arr.dtype

    def timed(step: Callable[[], object]) -> float:
        start = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - start) * 1e9 / n

    out: dict[str, float] = {
        "copy_in_view_ns": timed(
            lambda: region.buffer(block, 4).__setitem__(slice(None), arr.reshape(-1).view(np.uint8))
        ),
        "copy_in_write_ns": timed(lambda: region.write(block, arr)),
        "copy_out_view_ns": timed(lambda: np.frombuffer(region.buffer(block, 4), dtype).reshape((1, 1)).copy()),
        "copy_out_read_ns": timed(lambda: np.frombuffer(region.read(block, 4), dtype).reshape((1, 1))),
    }
    region.free(0, False, block)
    return out


# (name, producer processes, engine sleeps, engine spins before sleeping (us), producer settings)
CASES: list[tuple[str, int, bool, float, dict[str, int]]] = [
    ("1 producer, busy engine", 1, False, 0, {}),
    ("1 producer, sleeping engine", 1, True, 0, {}),
    ("1 producer, engine spins 50 us, then sleeps", 1, True, 50, {}),
    ("4 producers, busy engine", 4, False, 0, {}),
    ("4 producers, sleeping engine", 4, True, 0, {}),
    ("4 producers, engine spins 50 us, then sleeps", 4, True, 50, {}),
    ("4 producers x 2 threads, spin 50 us", 4, True, 50, {"threads": 2}),
    ("4 producers, 256 B tensor, spin 50 us", 4, True, 50, {"tensor_bytes": 256}),
]


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": all(r["ok"] for r in runs), "reps": len(runs)}
    for key in runs[0]:
        if key != "ok":
            out[key] = statistics.median(float(r[key]) for r in runs)
    return out


def report(doc: dict[str, Any]) -> str:
    lines = [f"# rings: {doc['machine']}", "", "## 1. throughput across processes (C++ push and drain)", ""]
    lines.append(f"{'case':<44} {'records/s':>12} {'wall ns/rec':>12} {'engine CPU ns/rec':>18} {'wakes/rec':>10} ok")
    for row in doc["throughput"]:
        lines.append(
            f"{row['case']:<44} {row['records_per_s']:>12,.0f} {row['wall_ns_per_record']:>12.1f} "
            f"{row['engine_cpu_ns_per_record']:>18.1f} {row['wakes_per_record']:>10.3f} {row['ok']}"
        )
    lines += ["", f"## 2. paced producers (one record, then {doc['pause_us']} us), sleeping engine", ""]
    for row in doc["paced"]:
        lines.append(
            f"{row['case']:<44} {row['records_per_s']:>12,.0f} records/s, engine CPU "
            f"{row['engine_cpu_ns_per_record']:.0f} ns/rec, {row['wakes_per_record']:.2f} wakes/rec, ok {row['ok']}"
        )
    rt = doc["round_trip"]
    lines += [
        "",
        "## 3. round trip through Python, both sides sleeping (two eventfd wake-ups)",
        "",
        f"{rt['trips']:.0f} trips: median {rt['median_us']:.1f} us, p99 {rt['p99_us']:.1f} us",
        "",
        "## 4. the Python methods alone (one process)",
        "",
        f"push_request + pop_request: {doc['python']['request_push_pop_ns']:.0f} ns; "
        f"push_reply + pop_reply: {doc['python']['reply_push_pop_ns']:.0f} ns",
        *copy_lines(doc["python"]),
    ]
    return "\n".join(lines)


def copy_lines(python: dict[str, Any]) -> list[str]:
    return [
        f"an FP32 [1, 1] tensor into a block: through a view {python['copy_in_view_ns']:.0f} ns, "
        f"write {python['copy_in_write_ns']:.0f} ns; out of one into an array: through a view "
        f"{python['copy_out_view_ns']:.0f} ns, read {python['copy_out_read_ns']:.0f} ns",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000, help="records per throughput run")
    ap.add_argument("--paced-records", type=int, default=20_000, help="records per paced run")
    ap.add_argument("--pause-us", type=int, default=50, help="paced producers' pause after each record")
    ap.add_argument("--trips", type=int, default=5000, help="round trips through Python")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--python-only", action="store_true", help="section 4 only: the Python methods, a few seconds")
    args = ap.parse_args(argv)
    if args.python_only:
        python = median_of([python_calls(args.records // 10) | {"ok": True} for _ in range(args.reps)])
        print(f"# rings --python-only: {platform.node()} {platform.machine()}, Python {platform.python_version()}")
        print(f"push_request + pop_request: {python['request_push_pop_ns']:.0f} ns; "
              f"push_reply + pop_reply: {python['reply_push_pop_ns']:.0f} ns")  # fmt: skip
        print("\n".join(copy_lines(python)))
        if args.json:
            args.json.write_text(
                json.dumps({"settings": vars(args) | {"json": str(args.json)}, "python": python}, indent=2)
            )
        return 0
    doc: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()}, Python {platform.python_version()}",
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "pause_us": args.pause_us,
        "throughput": [],
        "paced": [],
    }
    for name, processes, sleep, spin_us, settings in CASES:
        runs = [throughput(processes, args.records, sleep=sleep, spin_us=spin_us, **settings) for _ in range(args.reps)]
        doc["throughput"].append({"case": name} | median_of(runs))
    for processes in (1, 4):
        runs = [
            throughput(processes, args.paced_records, sleep=True, burst=1, pause_us=args.pause_us)
            for _ in range(args.reps)
        ]
        doc["paced"].append({"case": f"{processes} paced producer(s)"} | median_of(runs))
    doc["round_trip"] = median_of([round_trips(args.trips) | {"ok": True} for _ in range(args.reps)])
    doc["python"] = median_of([python_calls(args.records // 10) | {"ok": True} for _ in range(args.reps)])
    print(report(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    ok = all(row["ok"] for row in doc["throughput"] + doc["paced"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
