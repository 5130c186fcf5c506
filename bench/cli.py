"""``python -m bench``: closed-loop sequence load against a KServe v2 server (see bench/README.md)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import sys
from pathlib import Path
from typing import Any

from bench import report
from bench.cpu import ProcessTreeCpu, find_listener_pid
from bench.loadgen import RunConfig, SequenceIds, run_closed_loop
from bench.target import SpawnedServer, Target, url_port, wait_ready
from bench.transports import TRANSPORTS, TransportSpec, resolve_transport


def _int_list(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("concurrency values must be >= 1")
    return out


def _transport_list(value: str) -> list[str]:
    try:
        return [resolve_transport(v) for v in value.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Closed-loop load generator for stateful (sequence) models on KServe v2 servers.",
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
    t.add_argument("--model", default="accumulator", help="model name (default: accumulator)")
    t.add_argument("--input-name", default="INPUT")
    t.add_argument("--output-name", default="OUTPUT")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--transports",
        type=_transport_list,
        default=["http-binary", "grpc-unary", "grpc-stream"],
        help=f"comma-separated, from {', '.join(TRANSPORTS)} (aliases: http, json, grpc, stream); "
        "default: http-binary,grpc-unary,grpc-stream",
    )
    w.add_argument(
        "--concurrency",
        type=_int_list,
        default=[1, 16],
        help="comma-separated numbers of concurrent sequences, one run each (default: 1,16)",
    )
    w.add_argument("--seq-len", type=int, default=100, help="steps per sequence (default: 100)")
    w.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default: 10)")
    w.add_argument("--steps", type=int, help="measure this many steps per run instead of --duration")
    w.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each run (default: 2)")
    w.add_argument("--pause", type=float, default=0.5, help="seconds between runs (default: 0.5)")
    w.add_argument(
        "--streams",
        type=int,
        default=1,
        help="grpc-stream: number of bidi streams the sequences are spread over, 0 = one per sequence "
        "(default: 1). Triton answers a stream's requests in order, so with more sequences than the "
        "model has slots one shared stream stalls there (until the sequence idle timeout): use 0",
    )
    w.add_argument("--string-ids", action="store_true", help="string sequence ids instead of uint64")
    w.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="do not check replies against the running sum (for models other than an accumulator)",
    )
    w.add_argument("--request-timeout", type=float, default=30.0, help="per-step timeout in seconds (default: 30)")
    o = p.add_argument_group("output")
    o.add_argument("--json", type=Path, metavar="PATH", help="write machine-readable results here")
    o.add_argument(
        "--loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="client event loop (default: uvloop when installed)",
    )
    o.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


class Progress:
    """One line per run: updated in place on a terminal, printed once when done otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.prefix = ""

    def update(self, text: str) -> None:
        if self.enabled and self.tty:
            sys.stderr.write(f"\r\x1b[K{self.prefix} {text}")
            sys.stderr.flush()

    def done(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(("\r\x1b[K" if self.tty else "") + f"{self.prefix} {text}\n")
            sys.stderr.flush()


def _resolve_target(args: argparse.Namespace) -> Target:
    if args.spawn:
        if args.http_url or args.grpc_url:
            raise SystemExit("--spawn and --http-url/--grpc-url are exclusive")
        srv = SpawnedServer(extra_args=list(args.server_arg))
        srv.start()
        assert srv.proc is not None
        return Target(srv.http_url, srv.grpc_url, args.model, srv.proc.pid, srv)
    if not (args.http_url or args.grpc_url):
        raise SystemExit("give --http-url and/or --grpc-url, or --spawn")
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
    return Target(args.http_url, args.grpc_url, args.model, pid)


async def _run_all(args: argparse.Namespace, target: Target) -> list[dict[str, Any]]:
    server_cpu = ProcessTreeCpu(target.server_pid) if target.server_pid else None
    ids = SequenceIds(string_ids=args.string_ids)
    plan = [(tr, c) for tr in args.transports for c in args.concurrency]
    prog = Progress(not args.quiet)
    rows: list[dict[str, Any]] = []
    for i, (tr, conc) in enumerate(plan, 1):
        prog.prefix = f"[{i}/{len(plan)}] {tr} c={conc}:"
        spec = TransportSpec(
            http_url=target.http_url,
            grpc_url=target.grpc_url,
            model=target.model,
            input_name=args.input_name,
            output_name=args.output_name,
            concurrency=conc,
            request_timeout_s=args.request_timeout,
            streams=args.streams,
        )
        cfg = RunConfig(
            transport=tr,
            concurrency=conc,
            seq_len=args.seq_len,
            warmup_s=args.warmup,
            duration_s=None if args.steps else args.duration,
            steps=args.steps,
            verify=args.verify,
            string_ids=args.string_ids,
            request_timeout_s=args.request_timeout,
        )
        transport = TRANSPORTS[tr](spec)
        await transport.open()
        try:
            result = await run_closed_loop(transport, cfg, ids, server_cpu, prog.update)
        finally:
            await transport.close()
        row = report.summarize(result)
        rows.append(row)
        prog.prefix = f"[{i}/{len(plan)}]"
        prog.done(report.progress_line(row))
        if target.spawned is not None:
            target.spawned.check_alive()
        if i < len(plan) and args.pause > 0:
            await asyncio.sleep(args.pause)
    return rows


def _run_loop(coro: Any, which: str) -> Any:
    if which in ("auto", "uvloop"):
        try:
            import uvloop

            return uvloop.run(coro), "uvloop"
        except ImportError:
            if which == "uvloop":
                raise
    return asyncio.run(coro), "asyncio"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seq_len < 1:
        raise SystemExit("--seq-len must be >= 1")
    needs_http = any(t.startswith("http") for t in args.transports)
    needs_grpc = any(t.startswith("grpc") for t in args.transports)
    if not args.spawn and ((needs_http and not args.http_url) or (needs_grpc and not args.grpc_url)):
        raise SystemExit("the chosen transports need --http-url and/or --grpc-url (or use --spawn)")
    target = _resolve_target(args)
    try:
        if target.spawned is not None:
            print(f"bench: spawned seqserve pid {target.server_pid} (http {target.http_url}, grpc {target.grpc_url}, "
                  f"log {target.spawned.log_path})", file=sys.stderr)  # fmt: skip
        try:
            wait_ready(target)
        except (RuntimeError, TimeoutError) as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        rows, loop_name = _run_loop(_run_all(args, target), args.loop)
    finally:
        if target.spawned is not None:
            target.spawned.stop()
    print(report.format_table(rows))
    print()
    srv_note = "whole server process tree" if target.server_pid else "not measured: give --server-pid"
    print(f"seq-len {args.seq_len}, warm-up {args.warmup:g}s excluded; CPU per measured step (srv: {srv_note}).")
    print(report.ceiling_note(rows))
    issues = report.problems(rows)
    for line in issues:
        print(line)
    if args.json:
        import tritonclient

        meta = {
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:] if argv is None else argv,
            "model": target.model,
            "http_url": target.http_url,
            "grpc_url": target.grpc_url,
            "server_pid": target.server_pid,
            "spawned": target.spawned is not None,
            "seq_len": args.seq_len,
            "warmup_s": args.warmup,
            "streams": args.streams,
            "client_loop": loop_name,
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "tritonclient": getattr(tritonclient, "__version__", None),
        }
        report.write_json(args.json, meta, rows)
    return 1 if issues else 0
