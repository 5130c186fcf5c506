"""``python -m bench --spawn --workers-sweep 1,2,4``: the same plan on servers started with
``seqserve serve --workers N`` for each N, and one table that sets the settings side by side
(bench/docs/workers.md)."""

from __future__ import annotations

import argparse
from typing import Any

from bench.loadgen.report import text_table

# `seqserve serve` without worker processes stops at argparse with this in its log
REJECTED = "unrecognized arguments"


def check_workers_args(args: argparse.Namespace) -> None:
    """--workers and --workers-sweep start the server themselves, so they need --spawn."""
    if args.workers is not None and args.workers_sweep is not None:
        raise SystemExit("--workers and --workers-sweep are exclusive (a sweep sets --workers per run)")
    if (args.workers is not None or args.workers_sweep is not None) and not args.spawn:
        raise SystemExit("--workers and --workers-sweep start the server: give --spawn")
    if args.workers is not None and args.workers < 1:
        raise SystemExit("--workers must be >= 1")
    if args.workers_sweep is not None and (args.spawn_floor or args.ceiling):
        raise SystemExit("--workers-sweep runs seqserve only: drop --spawn-floor and --ceiling")
    if any(a.split("=", 1)[0] == "--workers" for a in args.server_arg):
        raise SystemExit("give --workers to the bench, not as --server-arg (the report labels runs by it)")


def settings(args: argparse.Namespace) -> list[int | None]:
    """The worker counts to start the server with, in order; [None]: the server's default, no flag."""
    if args.workers_sweep is not None:
        return list(dict.fromkeys(args.workers_sweep))
    return [args.workers]


def server_flags(workers: int | None) -> list[str]:
    """The flags for ``seqserve serve``. One worker is the server's default (today's single process,
    no ring hop), so it goes without the flag: a sweep's first row can be a seqserve that has no
    worker processes at all (a baseline build)."""
    return [] if workers is None or workers == 1 else ["--workers", str(workers)]


def label(workers: int | None, sweeping: bool) -> str:
    return f"seqserve w={workers}" if sweeping else "seqserve"


def rejected_message(error: str, workers: int | None) -> str | None:
    """A clear line when the spawned server did not accept ``--workers`` (a seqserve without worker
    processes); None when the failure is something else."""
    if not server_flags(workers) or "--workers" not in error or REJECTED not in error:
        return None
    return (
        f"bench: this seqserve does not accept `serve --workers {workers}` (worker processes, issue 27, "
        "are not in the installed version): run without --workers / --workers-sweep, or install one that has them"
    )


def sweep_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (transport, load), one row per worker setting in the order run, with the speed-up over
    the first setting's steps/s."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("workers") is not None:
            groups.setdefault((r["transport"], r["mode"], r["concurrency"]), []).append(r)
    out = []
    for (transport, mode, load), group in groups.items():
        base = group[0]["steps_per_s"] or None
        for r in group:
            out.append(
                {
                    "transport": transport,
                    "mode": mode,
                    "concurrency": load,
                    "workers": r["workers"],
                    "steps_per_s": r["steps_per_s"],
                    "x_first": (r["steps_per_s"] / base) if base else None,
                    "p50_ms": r["p50_ms"],
                    "p99_ms": r["p99_ms"],
                    "server_cpu_us_per_step": r["server_cpu_us_per_step"],
                    "engine_cpu_us_per_step": r["engine_cpu_us_per_step"],
                    "workers_cpu_us_per_step": r["workers_cpu_us_per_step"],
                    "server_cpu_util": r["server_cpu_util"],
                    "server_nprocs": r["server_nprocs"],
                    "errors": r["errors"],
                    "wrong": r["wrong"],
                }
            )
    return out


_COLUMNS = [
    ("transport", "transport", "{}"),
    ("seqs", "concurrency", "{}"),
    ("workers", "workers", "{}"),
    ("steps/s", "steps_per_s", "{:.0f}"),
    ("x first", "x_first", "{:.2f}x"),
    ("p50 ms", "p50_ms", "{:.2f}"),
    ("p99 ms", "p99_ms", "{:.2f}"),
    ("srv us/step", "server_cpu_us_per_step", "{:.0f}"),
    ("engine us/step", "engine_cpu_us_per_step", "{:.1f}"),
    ("workers us/step", "workers_cpu_us_per_step", "{:.0f}"),
    ("srv cpu%", "server_cpu_util", "{:.0%}"),
    ("procs", "server_nprocs", "{}"),
    ("errors", "errors", "{}"),
    ("wrong", "wrong", "{}"),
]


def format_sweep(rows: list[dict[str, Any]]) -> str:
    """The sweep's rows as a text table ('' when there are none)."""
    if not rows:
        return ""
    cells = [[h for h, _, _ in _COLUMNS]]
    for r in rows:
        cells.append([("-" if r.get(k) is None else f.format(r[k])) for _, k, f in _COLUMNS])
    return text_table(cells)
