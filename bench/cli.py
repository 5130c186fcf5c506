"""``python -m bench``: closed-loop or paced sequence load against KServe v2 servers (see bench/README.md)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import report
from bench.cpu import CpuSample, ProcessTreeCpu, SystemCpu, find_listener_pid
from bench.floors import FLOORS
from bench.loadgen import MODES, RunConfig, RunResult, SequenceIds, id_base, run_coro, run_load
from bench.target import SpawnedFloor, SpawnedServer, Target, fetch_metadata, url_port, wait_ready
from bench.transports import TRANSPORTS, TransportSpec, resolve_transport
from bench.workload import Workload, from_data_file, from_metadata

# what the demo accumulator's metadata says; used when a server gives none
DEFAULT_METADATA = {
    "name": "accumulator",
    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 1]}],
    "outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 1]}],
}


def _int_list(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return out


def _transport_list(value: str) -> list[str]:
    try:
        return [resolve_transport(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _floor_list(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    for n in names:
        if n != "auto" and n not in FLOORS:
            raise argparse.ArgumentTypeError(f"unknown floor {n!r} (choose from {', '.join(FLOORS)}, or auto)")
    return names


def _shape(value: str) -> tuple[str, list[int]]:
    try:
        name, dims = value.split("=", 1)
        return name, [int(d) for d in dims.split(",") if d.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=d1,d2,...") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Load generator for stateful (sequence) models on KServe v2 servers: closed loop or "
        "real-time paced, over HTTP (JSON, binary) and gRPC (unary, stream).",
    )
    t = p.add_argument_group("target")
    t.add_argument("--spawn", action="store_true", help="start seqserve on free loopback ports, stop it at the end")
    t.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the spawned `seqserve serve` (repeatable; use --server-arg=--flag)",
    )
    t.add_argument("--http-url", help="HTTP endpoint host:port of a running server (e.g. 127.0.0.1:8000)")
    t.add_argument("--grpc-url", help="gRPC endpoint host:port of a running server (e.g. 127.0.0.1:8001)")
    t.add_argument(
        "--server-pid",
        metavar="PID|auto",
        help="root pid of a running server, for server CPU per step (its whole process tree is "
        "counted); 'auto' finds the process listening on the URL's port. Implied by --spawn",
    )
    t.add_argument(
        "--spawn-floor",
        type=_floor_list,
        default=[],
        metavar="NAMES",
        help=f"also run the plan against floor servers ({', '.join(FLOORS)}; 'auto': one per planned "
        "transport), started here one at a time: server CPU per step as a multiple of the floor's, "
        "and the generator's ceiling",
    )
    t.add_argument(
        "--ceiling",
        action="store_true",
        help="measure the generator's ceiling against the floor for each transport (--spawn-floor auto) "
        "and warn when a run's throughput or client CPU is near it",
    )
    t.add_argument("--model", default="accumulator", help="model name (default: accumulator)")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--transports",
        type=_transport_list,
        default=["http-binary", "grpc-unary", "grpc-stream"],
        help=f"comma-separated, from {', '.join(TRANSPORTS)} (aliases: http, json, grpc, stream); "
        "default: http-binary,grpc-unary,grpc-stream",
    )
    w.add_argument("--mode", choices=MODES, default="closed", help="closed loop (default) or paced open loop")
    w.add_argument(
        "--concurrency",
        type=_int_list,
        default=[1, 16],
        help="closed: comma-separated numbers of concurrent sequences, one run each (default: 1,16)",
    )
    w.add_argument(
        "--streams",
        type=_int_list,
        default=[1, 8],
        help="paced: comma-separated numbers of streams, one run each (default: 1,8)",
    )
    w.add_argument(
        "--period-ms",
        type=float,
        default=20.0,
        help="paced: each stream sends one step every this many ms (default: 20, i.e. 20 ms audio frames)",
    )
    w.add_argument("--seq-len", type=int, default=100, help="steps per sequence (default: 100)")
    w.add_argument(
        "--seq-len-jitter",
        type=float,
        default=0.0,
        metavar="F",
        help="vary sequence length uniformly in seq-len * (1 +- F), 0 <= F < 1 (default: 0)",
    )
    w.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default: 10)")
    w.add_argument("--steps", type=int, help="measure this many steps per run instead of --duration (1 process)")
    w.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default: 2)")
    w.add_argument("--pause", type=float, default=0.5, help="seconds between runs (default: 0.5)")
    w.add_argument(
        "--grpc-streams",
        type=int,
        default=1,
        metavar="N",
        help="grpc-stream: number of bidi streams the sequences are spread over, 0 = one per sequence "
        "(default: 1). Triton answers a stream's requests in order, so with more sequences than the "
        "model has slots one shared stream stalls there (until the sequence idle timeout): use 0, or "
        "--grpc-reply-order completion against seqserve",
    )
    w.add_argument(
        "--grpc-reply-order",
        choices=["request", "completion"],
        default="request",
        help="grpc-stream: 'completion' opens the streams with the seqserve-reply-order: completion header, so "
        "seqserve writes each reply as it completes and a shared stream does not stall behind a backlogged "
        "START; 'request' (default) sends no header: request order, as Triton",
    )
    w.add_argument("--string-ids", action="store_true", help="string sequence ids instead of uint64")
    w.add_argument(
        "--data",
        type=Path,
        metavar="FILE.json",
        help="per-sequence step data ({'data': [[{INPUT: [..]}, ...], ...]}, see bench/workload.py); "
        "default: random data shaped by the model's metadata",
    )
    w.add_argument(
        "--shape",
        type=_shape,
        action="append",
        default=[],
        metavar="NAME=d1,d2",
        help="shape to send for an input with variable dims, batch dim included (repeatable)",
    )
    w.add_argument("--input-name", default="INPUT", help="input whose running sum is verified (default: INPUT)")
    w.add_argument("--output-name", default="OUTPUT", help="output to request and verify (default: OUTPUT)")
    w.add_argument(
        "--verify",
        choices=["auto", "on", "off"],
        default="auto",
        help="check every reply against the running sum of the inputs; auto (default): when the model "
        "looks like the demo accumulator (one FP32 input, one element per step)",
    )
    w.add_argument("--no-verify", dest="verify", action="store_const", const="off", help="same as --verify off")
    w.add_argument("--seed", type=int, default=0, help="random data and sequence lengths (default: 0)")
    w.add_argument("--request-timeout", type=float, default=30.0, help="per-step timeout in seconds (default: 30)")
    w.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="spread each run's sequences over N generator processes (default: 1)",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", type=Path, metavar="PATH", help="write machine-readable results here")
    o.add_argument("--plot", type=Path, metavar="PATH.png", help="latency vs load and latency CDF (needs matplotlib)")
    o.add_argument(
        "--loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="client event loop (default: uvloop when installed)",
    )
    o.add_argument("--quiet", action="store_true", help="no progress bar, no per-run lines")
    return p


class ProgressBar:
    """One stderr line redrawn with \\r: a bar over the whole plan and the current run's state.
    Off when stderr is not a terminal or with --quiet; per-run result lines are printed either way
    (unless --quiet)."""

    def __init__(self, quiet: bool, total_runs: int) -> None:
        self.quiet = quiet
        self.bar = not quiet and sys.stderr.isatty()
        self.total = max(1, total_runs)
        self.done_runs = 0
        self.prefix = ""
        self.drawn = False

    def update(self, frac: float, text: str) -> None:
        if not self.bar:
            return
        overall = min(1.0, (self.done_runs + max(0.0, min(1.0, frac))) / self.total)
        width = 24
        fill = int(overall * width)
        line = f"[{'#' * fill}{'.' * (width - fill)}] {overall:4.0%} {self.prefix} {text}"
        cols = shutil.get_terminal_size((100, 20)).columns
        sys.stderr.write("\r\x1b[K" + line[: cols - 1])
        sys.stderr.flush()
        self.drawn = True

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            self.drawn = False
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def run_done(self) -> None:
        self.done_runs += 1

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.drawn = False


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
    out = Outcome()
    for i, run in enumerate(runs, 1):
        prog.prefix = run.tag
        transport = TRANSPORTS[run.transport](TransportSpec(**_spec(args, target, workload, run.load)))
        await transport.open()
        try:
            result = await run_load(transport, _cfg(args, run, run.load), workload, ids, server_cpu, prog.update)
        finally:
            await transport.close()
        _finish_run(prog, out, result)
        if target.spawned is not None:
            target.spawned.check_alive()
        if i < len(runs) and args.pause > 0:
            await asyncio.sleep(args.pause)
    return out


def _run_multi(
    args: argparse.Namespace, target: Target, runs: list[RunSpec], workload: Workload, pool: Any, prog: ProgressBar
) -> Outcome:
    from bench.multiproc import Job, split_lanes

    server_cpu = ProcessTreeCpu(target.server_pid) if target.server_pid else None
    system_cpu = SystemCpu()
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

        def at_window(edge: str) -> None:
            samples[edge] = (server_cpu.sample() if server_cpu else None, system_cpu.sample())  # noqa: B023

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
        merged.system_cpu_s = (sys1.cpu_s - sys0.cpu_s) if sys0 and sys1 else None
        _finish_run(prog, out, merged)
        if target.spawned is not None:
            target.spawned.check_alive()
        if i < len(runs) and args.pause > 0:
            time.sleep(args.pause)
    return out


def _primary_target(args: argparse.Namespace) -> Target | None:
    if args.spawn:
        srv = SpawnedServer(extra_args=list(args.server_arg))
        srv.start()
        assert srv.proc is not None
        return Target(srv.http_url, srv.grpc_url, args.model, srv.proc.pid, srv, "seqserve")
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
    """The floor for each planned transport: gRPC's, and for HTTP what seqserve serves HTTP with
    (granian when it is installed, else hypercorn)."""
    out = []
    if any(t.startswith("grpc") for t in transports):
        out.append("grpc-stream")
    if any(t.startswith("http") for t in transports):
        try:
            import granian  # noqa: F401

            out.append("http-granian")
        except ImportError:
            out.append("http-hypercorn")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    floors, explicit = _floors_for(args)
    loads = args.streams if args.mode == "paced" else args.concurrency
    has_primary = bool(args.spawn or args.http_url or args.grpc_url)
    if args.spawn and (args.http_url or args.grpc_url):
        raise SystemExit("--spawn and --http-url/--grpc-url are exclusive")
    if not has_primary and not floors:
        raise SystemExit("give --http-url and/or --grpc-url, or --spawn (and/or --spawn-floor / --ceiling)")
    plans: list[tuple[str, list[RunSpec]]] = []  # ("primary" or a floor name, its runs)
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
    prog = ProgressBar(args.quiet, sum(len(runs) for _, runs in plans))
    base = id_base()
    ids = SequenceIds(string_ids=args.string_ids, base=base)
    pool = None
    if args.processes > 1:
        from bench.multiproc import GeneratorPool

        pool = GeneratorPool(args.processes, base, args.string_ids)
    outcomes: list[Outcome] = []
    workload: Workload | None = None
    meta: dict[str, Any] = {}
    targets_meta: list[dict[str, Any]] = []
    try:
        for which, runs in plans:
            if which == "primary":
                primary = _primary_target(args)
                assert primary is not None
                target = primary
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
                    print(f"bench: {target.label}: {e}", file=sys.stderr)
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
    if args.plot is not None and rows:
        report.plot(args.plot, list(zip(rows, results, strict=True)))
        print(f"plot: {args.plot}")
    if args.json:
        import tritonclient

        meta_doc = {
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
            "processes": args.processes,
            "client_loop": outcomes[0].loop if outcomes else None,
            "cpu_count": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "tritonclient": getattr(tritonclient, "__version__", None),
        }
        report.write_json(args.json, meta_doc, rows, floor_comparison=comps, warnings=warns, problems=issues)
    return 1 if issues else 0
