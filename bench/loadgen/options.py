"""``python -m bench``'s options (the argument parser); the run itself is in ``bench.loadgen.cli``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

from bench.floors import FLOORS
from bench.loadgen.runner import MODES
from bench.loadgen.transports import TRANSPORTS, resolve_transport


def int_list(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("values must be >= 1")
    return out


def transport_list(value: str) -> list[str]:
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


class Group(Protocol):
    """A parser or an argument group: what the shared options below are added to."""

    def add_argument(self, *args: Any, **kwargs: Any) -> Any: ...


# Options that python -m bench and python -m bench.vs_triton share, word for word.


def add_server_arg(p: Group) -> None:
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the spawned `seqserve serve` (repeatable; use --server-arg=--flag)",
    )


def add_warmup_and_pause(p: Group) -> None:
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default: 2)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds between runs (default: 0.5)")


def add_request_timeout(p: Group) -> None:
    p.add_argument("--request-timeout", type=float, default=30.0, help="per-step timeout in seconds (default: 30)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Load generator for stateful (sequence) models on KServe v2 servers: closed loop or "
        "real-time paced, over HTTP (JSON, binary) and gRPC (unary, stream).",
    )
    t = p.add_argument_group("target")
    t.add_argument("--spawn", action="store_true", help="start seqserve on free loopback ports, stop it at the end")
    add_server_arg(t)
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
    t.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="--spawn: start the server with `seqserve serve --workers N` (front-end worker processes "
        "feeding one engine); the report splits the server's CPU per step into the engine's (the server "
        "process) and the workers' (its children). Default: the server's own default",
    )
    t.add_argument(
        "--workers-sweep",
        type=int_list,
        metavar="N,N,...",
        help="--spawn: run the whole plan once per setting, each on a server started with --workers N, "
        "and print one sweep row per setting (steps/s against the first setting's, p50, p99, engine and "
        "workers CPU per step); e.g. 1,2,4,8,12",
    )
    t.add_argument("--model", default="accumulator", help="model name (default: accumulator)")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--transports",
        type=transport_list,
        default=["http-binary", "grpc-unary", "grpc-stream"],
        help=f"comma-separated, from {', '.join(TRANSPORTS)} (aliases: http, json, grpc, stream); "
        "default: http-binary,grpc-unary,grpc-stream",
    )
    w.add_argument("--mode", choices=MODES, default="closed", help="closed loop (default) or paced open loop")
    w.add_argument(
        "--concurrency",
        type=int_list,
        default=[1, 16],
        help="closed: comma-separated numbers of concurrent sequences, one run each (default: 1,16)",
    )
    w.add_argument(
        "--streams",
        type=int_list,
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
    add_warmup_and_pause(w)
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
    w.add_argument(
        "--grpc-channels",
        type=int,
        default=1,
        metavar="N",
        help="gRPC: channels per generator process, each its own connection, the sequences (unary) or "
        "streams (stream) spread over them (default: 1). A server with worker processes shares out "
        "connections, not requests: give enough connections for every worker",
    )
    w.add_argument("--string-ids", action="store_true", help="string sequence ids instead of uint64")
    w.add_argument(
        "--data",
        type=Path,
        metavar="FILE.json",
        help="per-sequence step data ({'data': [[{INPUT: [..]}, ...], ...]}, see bench/loadgen/workload.py); "
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
    add_request_timeout(w)
    w.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="spread each run's sequences over N generator processes (default: 1)",
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--model-stats",
        action="store_true",
        help="read the model's statistics (HTTP /v2/models/<model>/stats) at each run's measured window and "
        "report the server's own CPU per step excluding the model's execute (batch compute_infer)",
    )
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
