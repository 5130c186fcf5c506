"""``python -m bench``: closed-loop or paced sequence load against KServe v2 servers
(bench/docs/load-generator.md)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.floors import FLOORS
from bench.loadgen import report, sweep
from bench.loadgen.cpu import CpuSample, ProcessTreeCpu, SystemCpu, find_listener_pid, split_delta
from bench.loadgen.model_stats import StatsReader, StatsSnapshot, window
from bench.loadgen.options import build_parser
from bench.loadgen.progress import ProgressBar
from bench.loadgen.runner import RunConfig, RunResult, SequenceIds, id_base, run_coro, run_load
from bench.loadgen.target import SpawnedFloor, SpawnedServer, Target, fetch_metadata, url_port, wait_ready
from bench.loadgen.transports import TRANSPORTS, TransportSpec
from bench.loadgen.workload import Workload, from_data_file, from_metadata

# what the demo accumulator's metadata says; used when a server gives none
DEFAULT_METADATA = {
    "name": "accumulator",
    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 1]}],
    "outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 1]}],
}


CEILING_MIN_CONCURRENCY = 16


@dataclass(frozen=True)
class RunSpec:
    transport: str
    load: int  # concurrency (closed) or streams (paced)
    mode: str
    label: str  # the target's label, "ceiling:<floor>" for a ceiling run

    @property
    def tag(self) -> str:
        return f"{self.label} {self.transport} {'s' if self.mode == 'paced' else 'c'}={self.load}:"


@dataclass
class Outcome:
    rows: list[dict[str, Any]] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    loop: str = "asyncio"


def _spec(args: argparse.Namespace, target: Target, workload: Workload, conc: int) -> dict[str, Any]:
    return {
        "http_url": target.http_url,
        "grpc_url": target.grpc_url,
        "model": target.model,
        "output_name": workload.output_name,
        "concurrency": conc,
        "request_timeout_s": args.request_timeout,
        "streams": args.grpc_streams,
        "reply_order": args.grpc_reply_order,
        "channels": args.grpc_channels,
    }


def _cfg(args: argparse.Namespace, run: RunSpec, conc: int) -> RunConfig:
    return RunConfig(
        transport=run.transport,
        concurrency=conc,
        mode=run.mode,
        period_s=args.period_ms / 1e3,
        total_lanes=run.load,
        seq_len=args.seq_len,
        seq_len_jitter=args.seq_len_jitter,
        warmup_s=args.warmup,
        duration_s=None if args.steps else args.duration,
        steps=args.steps,
        request_timeout_s=args.request_timeout,
        seed=args.seed,
        label=run.label,
    )


def _finish_run(prog: ProgressBar, out: Outcome, result: RunResult) -> None:
    row = report.summarize(result)
    out.rows.append(row)
    out.results.append(result)
    prog.run_done()
    prog.line(report.progress_line(row))


async def _run_single(
    args: argparse.Namespace,
    target: Target,
    runs: list[RunSpec],
    workload: Workload,
    ids: SequenceIds,
    prog: ProgressBar,
) -> Outcome:
    server_cpu = ProcessTreeCpu(target.server_pid) if target.server_pid else None
    stats = _stats_reader(args, target)
    out = Outcome()
    for i, run in enumerate(runs, 1):
        prog.prefix = run.tag
        transport = TRANSPORTS[run.transport](TransportSpec(**_spec(args, target, workload, run.load)))
        snaps: dict[str, StatsSnapshot] = {}
        edge = (lambda e: snaps.__setitem__(e, stats.read())) if stats else None  # noqa: B023
        await transport.open()
        try:
            result = await run_load(
                transport, _cfg(args, run, run.load), workload, ids, server_cpu, prog.update, at_edge=edge
            )
        finally:
            await transport.close()
        if snaps:
            result.model_stats = window(snaps["start"], snaps["end"])
        _finish_run(prog, out, result)
        if target.spawned is not None:
            target.spawned.check_alive()
        if i < len(runs) and args.pause > 0:
            await asyncio.sleep(args.pause)
    return out


def _stats_reader(args: argparse.Namespace, target: Target) -> StatsReader | None:
    """--model-stats: the model's statistics, for the server under test (not the floors: they keep none)."""
    if not args.model_stats or target.label.startswith(("floor:", "ceiling:")) or not target.http_url:
        return None
    return StatsReader(target.http_url, target.model)


def _run_multi(
    args: argparse.Namespace, target: Target, runs: list[RunSpec], workload: Workload, pool: Any, prog: ProgressBar
) -> Outcome:
    from bench.loadgen.multiproc import Job, split_lanes

    server_cpu = ProcessTreeCpu(target.server_pid) if target.server_pid else None
    system_cpu = SystemCpu()
    stats = _stats_reader(args, target)
    out = Outcome(loop="uvloop" if args.loop != "asyncio" else "asyncio")
    for i, run in enumerate(runs, 1):
        prog.prefix = run.tag
        start_at = time.perf_counter_ns() + 500_000_000  # time for the children to open their transports
        jobs = []
        offset = 0
        for n in split_lanes(run.load, len(pool)):
            cfg = _cfg(args, run, n)
            cfg.lane_offset = offset
            offset += n
            jobs.append(Job(_spec(args, target, workload, n), cfg, workload, start_at, args.loop))
        samples: dict[str, tuple[CpuSample | None, CpuSample | None]] = {}

        snaps: dict[str, StatsSnapshot] = {}

        def at_window(edge: str) -> None:
            if stats is not None and edge == "start":  # outside the CPU window, as in run_load
                snaps[edge] = stats.read()  # noqa: B023
            samples[edge] = (server_cpu.sample() if server_cpu else None, system_cpu.sample())  # noqa: B023
            if stats is not None and edge == "end":
                snaps[edge] = stats.read()  # noqa: B023

        parts = pool.run(
            jobs, at_window, prog.update, timeout_s=args.warmup + args.duration + 60 + args.request_timeout
        )
        merged = parts[0]
        for p in parts[1:]:
            merged = merged.merge(p)
        (srv0, sys0), (srv1, sys1) = samples["start"], samples["end"]
        merged.server_cpu_s = (srv1.cpu_s - srv0.cpu_s) if srv0 and srv1 else None
        merged.server_nprocs = srv1.nprocs if srv1 else None
        if srv0 and srv1 and srv0.threads is not None and srv1.threads is not None:
            d = {k: v - srv0.threads.get(k, 0.0) for k, v in srv1.threads.items()}
            merged.server_threads_cpu_s = {k: round(v, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1]) if v > 0}
        merged.engine_cpu_s, merged.workers_cpu_s = split_delta(srv0, srv1)
        merged.system_cpu_s = (sys1.cpu_s - sys0.cpu_s) if sys0 and sys1 else None
        if snaps:
            merged.model_stats = window(snaps["start"], snaps["end"])
        _finish_run(prog, out, merged)
        if target.spawned is not None:
            target.spawned.check_alive()
        if i < len(runs) and args.pause > 0:
            time.sleep(args.pause)
    return out


def _primary_target(args: argparse.Namespace, workers: int | None = None, label: str = "seqserve") -> Target | None:
    if args.spawn:
        srv = SpawnedServer(extra_args=[*args.server_arg, *sweep.server_flags(workers)])
        srv.start()
        assert srv.proc is not None
        return Target(srv.http_url, srv.grpc_url, args.model, srv.proc.pid, srv, label)
    if not (args.http_url or args.grpc_url):
        return None
    pid: int | None = None
    if args.server_pid == "auto":
        port = url_port(args.grpc_url or args.http_url)
        pid = find_listener_pid(port)
        if pid is None:
            print(f"bench: no visible process listens on port {port}; server CPU not measured", file=sys.stderr)
        else:
            print(f"bench: server pid {pid} (listening on port {port})", file=sys.stderr)
    elif args.server_pid:
        pid = int(args.server_pid)
    return Target(args.http_url, args.grpc_url, args.model, pid, None, "server")


def _auto_floors(transports: list[str]) -> list[str]:
    """The floor for each planned transport: on the servers seqserve serves gRPC and HTTP with by
    default (its builtin ones)."""
    out = []
    if any(t.startswith("grpc") for t in transports):
        out.append("grpc-builtin")  # seqserve's default gRPC server
    if any(t.startswith("http") for t in transports):
        out.append("http-builtin")  # seqserve's default HTTP server
    return out


def _floors_for(args: argparse.Namespace) -> tuple[list[str], set[str]]:
    """(every floor to start, the floors that run the whole plan). ``--ceiling`` adds the automatic
    floors for its ceiling runs."""
    explicit: list[str] = []
    for n in args.spawn_floor:
        explicit += _auto_floors(args.transports) if n == "auto" else [n]
    every = explicit + (_auto_floors(args.transports) if args.ceiling else [])
    return list(dict.fromkeys(every)), set(explicit)


def _workload(args: argparse.Namespace, meta: dict[str, Any]) -> Workload:
    shapes = dict(args.shape)
    try:
        if args.data:
            batched = bool(meta["inputs"] and meta["inputs"][0]["shape"][:1] == [-1])
            return from_data_file(
                args.data,
                meta,
                input_name=args.input_name,
                output_name=args.output_name,
                verify=args.verify,
                batched=batched,
                shapes=shapes,
            )
        return from_metadata(
            meta,
            input_name=args.input_name,
            output_name=args.output_name,
            verify=args.verify,
            shapes=shapes,
            seed=args.seed,
        )
    except ValueError as e:
        raise SystemExit(f"bench: {e}") from None


def _check_args(args: argparse.Namespace) -> None:
    if args.seq_len < 1:
        raise SystemExit("--seq-len must be >= 1")
    if not 0.0 <= args.seq_len_jitter < 1.0:
        raise SystemExit("--seq-len-jitter must be in [0, 1)")
    if args.period_ms <= 0:
        raise SystemExit("--period-ms must be > 0")
    if args.processes < 1:
        raise SystemExit("--processes must be >= 1")
    sweep.check_workers_args(args)
    if args.processes > 1 and args.steps:
        raise SystemExit("--steps needs one generator process; use --duration with --processes")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SystemExit(
                "--plot needs matplotlib: pip install '.[bench]' in the seqserve checkout (or pip install matplotlib)"
            ) from None
    needs_http = any(t.startswith("http") for t in args.transports)
    needs_grpc = any(t.startswith("grpc") for t in args.transports)
    if (args.http_url or args.grpc_url) and ((needs_http and not args.http_url) or (needs_grpc and not args.grpc_url)):
        raise SystemExit("the chosen transports need --http-url and/or --grpc-url (or use --spawn)")


def _plans(
    args: argparse.Namespace, has_primary: bool, floors: list[str], explicit: set[str], loads: list[int]
) -> list[tuple[str, list[RunSpec]]]:
    """("primary" or a floor name, its runs), in the order they run."""
    plans: list[tuple[str, list[RunSpec]]] = []
    if has_primary:
        label = "seqserve" if args.spawn else "server"
        plans.append(("primary", [RunSpec(t, n, args.mode, label) for t in args.transports for n in loads]))
    ceiling_conc = max(max(loads), CEILING_MIN_CONCURRENCY)
    for f in floors:
        trs = [t for t in args.transports if t in FLOORS[f][1]]
        runs = [RunSpec(t, n, args.mode, f"floor:{f}") for t in trs for n in loads] if f in explicit else []
        if args.ceiling:  # the generator flat out against the floor: closed loop, at least 16 sequences
            runs += [RunSpec(t, ceiling_conc, "closed", f"ceiling:{f}") for t in trs]
        if runs:
            plans.append((f, runs))
        else:
            print(f"bench: floor {f} serves none of the chosen transports; skipped", file=sys.stderr)
    return plans


def _print_report(
    args: argparse.Namespace, rows: list[dict[str, Any]], workload: Workload | None, loads: list[int]
) -> tuple[list[str], list[dict[str, Any]], list[str]]:
    """The table and its notes on stdout; returns the floor warnings, the floor comparison and the
    problems (wrong answers, errors)."""
    print(report.format_table(rows))
    print()
    measured = all(r["server_cpu_us_per_step"] is not None for r in rows)
    srv_note = "whole server process tree" if measured else "'-': not measured, give --server-pid"
    what = f"paced, one step per stream every {args.period_ms:g} ms" if args.mode == "paced" else "closed loop"
    seq = (
        "data file"
        if args.data
        else f"seq-len {args.seq_len}" + (f" +-{args.seq_len_jitter:.0%}" if args.seq_len_jitter else "")
    )
    print(f"{what}; {seq}; warm-up {args.warmup:g}s excluded; CPU per measured step (srv: {srv_note}).")
    if workload is not None:
        print(workload.describe())
    if args.mode == "paced":
        print(
            "paced: a step misses its deadline when its reply arrives after the stream's next scheduled send; "
            "'streams on time' had no miss in the window; lag = how late steps were sent behind schedule."
        )
    print(report.ceiling_note(rows))
    overhead = report.format_overhead(rows)
    if overhead:
        print()
        print(
            "the server's own cost per step (--model-stats): server CPU per measured step minus the model's "
            "execute (batch compute_infer, wall time) per request the model served, both over the measured window:"
        )
        print(overhead)
        medians = report.overhead_medians(rows)
        if medians:
            print("\nthe same, medians of the runs of each load (min-max):")
            print(medians)
    table, warns, comps = report.compare_floors(rows)
    if table:
        print()
        print("against the floors (same transport and load): server CPU per step as a multiple of the floor's;")
        print(
            "ceiling = what the generator did flat out against the floor (closed loop, "
            f"{max(max(loads), CEILING_MIN_CONCURRENCY)} sequences); a ceiling run under 50% client CPU per "
            "process was machine-bound, not generator-bound:"
        )
        print(table)
    for line in warns:
        print(line)
    issues = report.problems(rows)
    for line in issues:
        print(line)
    return warns, comps, issues


def _meta_doc(
    args: argparse.Namespace,
    argv: list[str] | None,
    targets_meta: list[dict[str, Any]],
    workload: Workload | None,
    meta: dict[str, Any],
    outcomes: list[Outcome],
) -> dict[str, Any]:
    """The JSON's ``meta``: the settings, the targets and the environment of the run."""
    import tritonclient

    return {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else argv,
        "model": args.model,
        "targets": targets_meta,
        "mode": args.mode,
        "period_ms": args.period_ms if args.mode == "paced" else None,
        "seq_len": args.seq_len,
        "seq_len_jitter": args.seq_len_jitter,
        "data": str(args.data) if args.data else None,
        "workload": workload.describe() if workload else None,
        "model_metadata": meta,
        "warmup_s": args.warmup,
        "grpc_streams": args.grpc_streams,
        "grpc_reply_order": args.grpc_reply_order,
        "grpc_channels": args.grpc_channels,
        "processes": args.processes,
        "workers": args.workers_sweep if args.workers_sweep is not None else args.workers,
        "client_loop": outcomes[0].loop if outcomes else None,
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tritonclient": getattr(tritonclient, "__version__", None),
    }


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    floors, explicit = _floors_for(args)
    loads = args.streams if args.mode == "paced" else args.concurrency
    has_primary = bool(args.spawn or args.http_url or args.grpc_url)
    if args.spawn and (args.http_url or args.grpc_url):
        raise SystemExit("--spawn and --http-url/--grpc-url are exclusive")
    if args.model_stats and not (args.spawn or args.http_url):
        raise SystemExit("--model-stats reads the statistics over HTTP: give --http-url (or --spawn)")
    if not has_primary and not floors:
        raise SystemExit("give --http-url and/or --grpc-url, or --spawn (and/or --spawn-floor / --ceiling)")
    plans = _plans(args, has_primary, floors, explicit, loads)
    prog = ProgressBar(args.quiet, sum(len(runs) for _, runs in plans))
    base = id_base()
    ids = SequenceIds(string_ids=args.string_ids, base=base)
    pool = None
    if args.processes > 1:
        from bench.loadgen.multiproc import GeneratorPool

        pool = GeneratorPool(args.processes, base, args.string_ids)
    outcomes: list[Outcome] = []
    workload: Workload | None = None
    meta: dict[str, Any] = {}
    targets_meta: list[dict[str, Any]] = []
    worker_settings = sweep.settings(args)
    sweeping = args.workers_sweep is not None
    stages = [
        (which, runs, n)
        for which, runs in plans
        for n in (worker_settings if which == "primary" and args.spawn else [None])
    ]
    try:
        for which, runs, workers in stages:
            if which == "primary":
                label = sweep.label(workers, sweeping)
                primary = _primary_target(args, workers, label)
                assert primary is not None
                target = primary
                if sweeping:
                    runs = [dataclasses.replace(r, label=label) for r in runs]
            else:
                fl = SpawnedFloor(which)
                fl.start()
                target = fl.target(args.model)
            try:
                if target.spawned is not None:
                    prog.line(
                        f"bench: started {target.label} pid {target.server_pid} "
                        f"({target.http_url or target.grpc_url}, log {target.spawned.log_path})"
                    )
                try:
                    wait_ready(target)
                except (RuntimeError, TimeoutError) as e:
                    print(sweep.rejected_message(str(e), workers) or f"bench: {target.label}: {e}", file=sys.stderr)
                    return 2
                if workload is None:
                    try:
                        meta = fetch_metadata(target)
                    except Exception as e:  # a server without the metadata call: assume the accumulator's
                        print(f"bench: no model metadata ({e}); assuming the accumulator's", file=sys.stderr)
                        meta = dict(DEFAULT_METADATA, name=args.model)
                    workload = _workload(args, meta)
                    prog.line(f"bench: {workload.describe()}")
                wl = workload if which == "primary" else workload.without_verify()  # floors echo
                if pool is not None:
                    out = _run_multi(args, target, runs, wl, pool, prog)
                else:
                    out, loop_name = run_coro(_run_single(args, target, runs, wl, ids, prog), args.loop)
                    out.loop = loop_name
                if workers is not None:
                    for row in out.rows:
                        row["workers"] = workers
                outcomes.append(out)
                targets_meta.append(
                    {
                        "label": target.label,
                        "http_url": target.http_url,
                        "grpc_url": target.grpc_url,
                        "pid": target.server_pid,
                    }
                )
            finally:
                if target.spawned is not None:
                    target.spawned.stop()
    finally:
        prog.close()
        if pool is not None:
            pool.close()
    rows = [r for o in outcomes for r in o.rows]
    results = [r for o in outcomes for r in o.results]
    warns, comps, issues = _print_report(args, rows, workload, loads)
    sweep_table = sweep.sweep_rows(rows) if sweeping else []
    if sweep_table:
        print()
        print("the worker sweep: each setting on its own server (`seqserve serve --workers N`); x first = steps/s")
        print("over the first setting's; engine = the server process's own CPU, workers = its children's (summed):")
        print(sweep.format_sweep(sweep_table))
    if args.plot is not None and rows:
        report.plot(args.plot, list(zip(rows, results, strict=True)))
        print(f"plot: {args.plot}")
    if args.json:
        meta_doc = _meta_doc(args, argv, targets_meta, workload, meta, outcomes)
        extra: dict[str, Any] = {"workers_sweep": sweep_table} if sweeping else {}
        report.write_json(args.json, meta_doc, rows, floor_comparison=comps, warnings=warns, problems=issues, **extra)
    return 1 if issues else 0
