"""``python -m bench.vs_triton``: seqserve against the real Triton, side by side, in one run.

Starts Triton 2.51 from the environment's anchor (``bench.vs_triton.anchor``; its ``accum_py`` is the
same running sum as seqserve's demo ``accumulator``) and seqserve (``seqserve serve`` with the
default install and the demo models), both on free loopback ports, and measures both with the
same client (``bench.loadgen.runner`` over ``bench.loadgen.transports``, every reply checked against the running
sum), transport by transport, in alternating rounds: in round r the server that goes first
alternates per transport and per round, so slow drifts of the shared machine's load fall on both.
Both servers run for the whole bench; each run also records the other (idle) server's CPU.

Slots: Triton's model gets as many instances as seqserve's (``--triton-instances``, default
``match``; ``bench.vs_triton.repo``): the anchor's ``accum_py`` has 1 instance (8 slots) and the demo
``accumulator`` 2 (16), and with fewer slots than sequences Triton's extra sequences would wait in
its backlog. seqserve starts first so that its model's instance count can be read from its config
endpoint; Triton then runs on a temporary copy of its repository with that count (removed at exit),
or on the repository as it is when the count there already matches. Both slot counts are printed.

Reported (``bench.vs_triton.sbs_report``): per transport, the medians over the rounds of server CPU per step
(whole process tree, Triton's Python backend stubs included), p50/p99 latency and throughput with
their spread (min-max), the ratio seqserve / Triton per round (its median and spread) against the
issue's targets, and 0-wrong / 0-error checks. Exit status: 0, 1 when a reply was wrong or a
request failed, 2 when a server could not be started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from bench.loadgen import report
from bench.loadgen.cpu import ProcessTreeCpu
from bench.loadgen.model_stats import StatsReader, StatsSnapshot, window
from bench.loadgen.options import add_request_timeout, add_server_arg, add_warmup_and_pause, int_list, transport_list
from bench.loadgen.runner import MODES, RunConfig, SequenceIds, id_base, run_coro, run_load
from bench.loadgen.target import SpawnedServer, Target, fetch_metadata, wait_ready
from bench.loadgen.transports import TRANSPORTS, TransportSpec
from bench.loadgen.workload import Workload, from_metadata
from bench.vs_triton import sbs_report
from bench.vs_triton.anchor import SpawnedTriton, TritonUnavailable, anchor_problem, default_script
from bench.vs_triton.repo import RepoProblem, config_path, instance_count, read_config, repo_with_instances

MATCH = "match"


def instances_option(value: str) -> int | str:
    """``--triton-instances``: a count >= 1, or ``match`` (seqserve's model's count)."""
    if value == MATCH:
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a count nor {MATCH!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("the instance count must be >= 1")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.vs_triton",
        description="seqserve against Triton 2.51 (the anchor's accum_py), the same client, alternating rounds: "
        "server CPU per step, latency, throughput and their ratios.",
    )
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: 3)")
    p.add_argument(
        "--transports",
        type=transport_list,
        default=["grpc-stream", "http-binary", "grpc-unary"],
        help="comma-separated (default: grpc-stream,http-binary,grpc-unary)",
    )
    p.add_argument(
        "--concurrency",
        type=int_list,
        default=[16],
        help="concurrent sequences (paced: streams) (default: 16)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default="closed",
        help="closed loop (default: each sequence sends its next step when the reply came), or paced: each "
        "stream sends one step every --period-ms whatever the server does, so both servers get the same load "
        "and the latency tail is the server's, not the client's",
    )
    p.add_argument(
        "--period-ms",
        type=float,
        default=10.0,
        help="paced: each stream sends one step every this many ms (default: 10)",
    )
    p.add_argument("--seq-len", type=int, default=20, help="steps per sequence (default: 20)")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per run (default: 8)")
    add_warmup_and_pause(p)
    add_request_timeout(p)
    p.add_argument("--seed", type=int, default=0, help="random data (default: 0; round r uses seed + r)")
    p.add_argument(
        "--triton-script",
        type=Path,
        default=None,
        help=f"Triton's start script (default: {default_script()}; or set SEQSERVE_TRITON_ANCHOR)",
    )
    p.add_argument("--triton-repo", type=Path, help="model repository for Triton (default: the anchor's own)")
    p.add_argument("--triton-model", default="accum_py", help="Triton's model (default: accum_py)")
    p.add_argument(
        "--triton-instances",
        type=instances_option,
        default=MATCH,
        metavar="N|match",
        help="instances of Triton's model (its instance_group count; slots = count x max_batch_size): N, or "
        "match (default) the instance count of seqserve's model. When it differs from the repository's "
        "config, Triton runs on a temporary copy of the repository with the count set there (removed at exit)",
    )
    p.add_argument("--model", default="accumulator", help="seqserve's model (default: accumulator)")
    add_server_arg(p)
    p.add_argument("--no-triton", action="store_true", help="seqserve alone (a dry run of the mode; no ratios)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write every run and the summary here")
    p.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto", help="client event loop")
    p.add_argument("--quiet", action="store_true", help="no per-run lines")
    return p


@dataclass
class Side:
    """One server under test."""

    name: str  # "seqserve" or "Triton"
    target: Target
    cpu: ProcessTreeCpu
    stats: StatsReader
    check_alive: Callable[[], None]  # raises when the server is gone
    info: dict[str, Any]


def _get_json(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return dict(json.loads(resp.read()))
    except Exception:  # informational only
        return None


def _info(target: Target) -> dict[str, Any]:
    """What the JSON records about a server: its version and the model's scheduling."""
    server = _get_json(f"http://{target.http_url}/v2") or {}
    config = _get_json(f"http://{target.http_url}/v2/models/{target.model}/config") or {}
    instances = sum(int(g.get("count", 1)) for g in config.get("instance_group") or []) or None
    mbs = config.get("max_batch_size")
    return {
        "server": server.get("name"),
        "version": server.get("version"),
        "model": target.model,
        "max_batch_size": mbs,
        "instances": instances,
        "slots": mbs * instances if mbs and instances else None,  # Direct: one slot per batch row per instance
        "http_url": target.http_url,
        "grpc_url": target.grpc_url,
        "pid": target.server_pid,
    }


def _workload(side: Side, seed: int) -> Workload:
    meta = fetch_metadata(side.target)
    try:
        return from_metadata(meta, input_name="INPUT", output_name="OUTPUT", verify="on", shapes={}, seed=seed)
    except ValueError as e:
        raise SystemExit(f"bench.vs_triton: {side.name}'s model {side.target.model!r}: {e}") from None


def plan(rounds: int, transports: list[str], loads: list[int], sides: list[str]) -> list[tuple[int, str, int, str]]:
    """(round, transport, load, side) in run order: per round, transport and load, the sides in turn,
    the first side alternating with every (round, transport, load) so neither always goes first."""
    out = []
    k = 0
    for r in range(1, rounds + 1):
        for t in transports:
            for n in loads:
                order = sides if k % 2 == 0 else sides[::-1]
                out += [(r, t, n, s) for s in order]
                k += 1
    return out


class _Edges:
    """Sampled at a run's window edges (``run_load``'s ``at_edge``): the statistics of the model under
    test, and the CPU of the server(s) not under test, idle meanwhile."""

    def __init__(self, side: Side, others: list[Side]) -> None:
        self.side = side
        self.others = others
        self.stats: dict[str, StatsSnapshot] = {}
        self.idle: dict[str, tuple[float, float]] = {}  # edge -> (CPU seconds of the others, perf_counter)

    def __call__(self, edge: str) -> None:
        self.stats[edge] = self.side.stats.read()
        samples = [o.cpu.sample() for o in self.others]
        self.idle[edge] = (sum(s.cpu_s for s in samples if s), time.perf_counter())

    def idle_util(self) -> float | None:
        if not self.others:
            return None
        (c0, t0), (c1, t1) = self.idle["start"], self.idle["end"]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None


async def _one_run(
    args: argparse.Namespace, side: Side, others: list[Side], transport: str, load: int, rnd: int,
    workload: Workload, ids: SequenceIds,
) -> dict[str, Any]:  # fmt: skip
    tgt = side.target
    spec = TransportSpec(
        http_url=tgt.http_url, grpc_url=tgt.grpc_url, model=tgt.model, output_name="OUTPUT",
        concurrency=load, request_timeout_s=args.request_timeout,
        streams=0,  # one stream per sequence: a shared one stalls on Triton when sequences outnumber its slots
    )  # fmt: skip
    cfg = RunConfig(
        transport=transport, concurrency=load, mode=args.mode, period_s=args.period_ms / 1000.0,
        seq_len=args.seq_len, warmup_s=args.warmup,
        duration_s=args.duration, request_timeout_s=args.request_timeout, seed=args.seed + rnd, label=side.name,
    )  # fmt: skip
    edges = _Edges(side, others)
    t = TRANSPORTS[transport](spec)
    await t.open()
    try:
        result = await run_load(t, cfg, workload, ids, side.cpu, at_edge=edges)
    finally:
        await t.close()
    result.model_stats = window(edges.stats["start"], edges.stats["end"])
    result.extra["idle_server_cpu_util"] = edges.idle_util()
    row = report.summarize(result)
    row["round"] = rnd
    return row


async def _measure(
    args: argparse.Namespace, sides: dict[str, Side], workloads: dict[str, Workload]
) -> list[dict[str, Any]]:
    ids = SequenceIds(base=id_base())
    rows: list[dict[str, Any]] = []
    runs = plan(args.rounds, args.transports, args.concurrency, list(sides))
    for i, (rnd, transport, load, name) in enumerate(runs, 1):
        side = sides[name]
        others = [s for s in sides.values() if s is not side]
        row = await _one_run(args, side, others, transport, load, rnd, workloads[name], ids)
        rows.append(row)
        if not args.quiet:
            print(f"[{i}/{len(runs)}] round {rnd} {report.progress_line(row)}", file=sys.stderr, flush=True)
        for s in sides.values():
            s.check_alive()
        if i < len(runs) and args.pause > 0:
            await asyncio.sleep(args.pause)
    return rows


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through the finally blocks that stop the servers


class _StartFailed(Exception):
    """A server could not be started; the message says why (exit status 2)."""


def _triton_repo(args: argparse.Namespace, script: Path, seqserve_info: dict[str, Any],
                 stack: contextlib.ExitStack) -> tuple[Path | None, int, str]:  # fmt: skip
    """The repository Triton runs on (None: the script's own), the instance count its model will
    have, and where that count comes from (for the output)."""
    src = args.triton_repo or script.parent / "models"  # the script's default repository
    try:
        have = instance_count(read_config(config_path(src, args.triton_model)))
    except RepoProblem as e:
        raise _StartFailed(f"Triton's model {args.triton_model!r}: {e} (see --triton-repo, --triton-model)") from None
    want = args.triton_instances
    if want == MATCH:
        want = seqserve_info.get("instances")
        if not want:
            raise _StartFailed(f"cannot read the instance count of seqserve's model {args.model!r} from its "
                               "config endpoint: give --triton-instances N")  # fmt: skip
    if want == have:
        return args.triton_repo, have, f"{have} instance(s) as configured in {config_path(src, args.triton_model)}"
    try:
        repo = stack.enter_context(repo_with_instances(src, args.triton_model, want))
    except RepoProblem as e:
        raise _StartFailed(str(e)) from None
    how = "to match seqserve's model" if args.triton_instances == MATCH else "by --triton-instances"
    return repo, want, f"instance_group count set to {want} (configured: {have}) {how}, in a temporary copy {repo}"


def _start_triton(args: argparse.Namespace, seqserve_info: dict[str, Any], stack: contextlib.ExitStack) -> Side:
    script = args.triton_script or default_script()
    repo, count, how = _triton_repo(args, script, seqserve_info, stack)
    triton = SpawnedTriton(script, repo)
    stack.callback(triton.stop)  # registered before start: start may leave a server behind when it fails
    print(f"bench.vs_triton: starting Triton ({script}); {args.triton_model}: {how}", file=sys.stderr, flush=True)
    try:
        triton.start()
    except TritonUnavailable as e:
        raise _StartFailed(str(e)) from None
    assert triton.pid is not None
    tt = Target(triton.http_url, triton.grpc_url, args.triton_model, triton.pid, None, "Triton")
    try:
        wait_ready(tt, timeout_s=30)
    except (RuntimeError, TimeoutError) as e:
        raise _StartFailed(f"Triton: {e}") from None
    info = {**_info(tt), "repository": str(repo) if repo else None, "instances_how": how}
    if info["instances"] != count:  # what Triton reports it loaded, not what we wrote
        raise _StartFailed(f"Triton reports {info['instances']} instance(s) of {args.triton_model}, not {count}")
    return Side("Triton", tt, ProcessTreeCpu(triton.pid), StatsReader(triton.http_url, tt.model),
                triton.check_alive, info)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rounds < 1 or args.seq_len < 1 or args.duration <= 0:
        raise SystemExit("--rounds and --seq-len must be >= 1, --duration > 0")
    if args.period_ms <= 0:
        raise SystemExit("--period-ms must be > 0")
    if not args.no_triton:  # before anything starts: a missing anchor fails at once
        problem = anchor_problem(args.triton_script or default_script())
        if problem:
            print(f"bench.vs_triton: {problem}", file=sys.stderr)
            return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    sides: dict[str, Side] = {}
    # closed in reverse: the servers stop first, then the temporary repository goes
    with contextlib.ExitStack() as stack:
        try:
            seqserve = SpawnedServer(extra_args=list(args.server_arg))
            stack.callback(seqserve.stop)
            seqserve.start()
            assert seqserve.proc is not None
            st = Target(seqserve.http_url, seqserve.grpc_url, args.model, seqserve.proc.pid, seqserve, "seqserve")
            try:
                wait_ready(st)
            except (RuntimeError, TimeoutError) as e:
                raise _StartFailed(f"seqserve: {e}") from None
            stats = StatsReader(seqserve.http_url, args.model)
            sides["seqserve"] = Side("seqserve", st, ProcessTreeCpu(seqserve.proc.pid), stats, seqserve.check_alive,
                                     _info(st))  # fmt: skip
            if not args.no_triton:
                sides["Triton"] = _start_triton(args, sides["seqserve"].info, stack)
            workloads = {name: _workload(s, args.seed) for name, s in sides.items()}
            for name, s in sides.items():
                print(f"bench.vs_triton: {name} pid {s.target.server_pid}: {s.info}", file=sys.stderr, flush=True)
            print(f"bench.vs_triton: {sbs_report.slots_line(_infos(sides))}", file=sys.stderr, flush=True)
            rows, loop = run_coro(_measure(args, sides, workloads), args.loop)
        except _StartFailed as e:
            print(f"bench.vs_triton: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            print(f"bench.vs_triton: interrupted ({e or 'Ctrl-C'}); stopping the servers", file=sys.stderr)
            return 130
    summary = sbs_report.summarize(rows, args.transports, args.concurrency, list(sides))
    print(sbs_report.format_text(summary, args, _infos(sides), loop))
    if args.json:
        sbs_report.write_json(args.json, args, argv, summary, rows, _infos(sides), loop)
    return 0 if summary["checks_ok"] else 1


def _infos(sides: dict[str, Side]) -> dict[str, dict[str, Any]]:
    return {n: s.info for n, s in sides.items()}


if __name__ == "__main__":
    sys.exit(main())
