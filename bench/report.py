"""Turning :class:`~bench.loadgen.RunResult` objects into numbers, a table and JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen import RunResult


def summarize(r: RunResult) -> dict[str, Any]:
    """The per-run metrics (latencies in ms, CPU in microseconds per measured step)."""
    n = r.steps
    lat_ms = r.latencies_ns / 1e6
    start_ms = r.start_latencies_ns / 1e6
    threads = r.server_threads_cpu_s
    pct = np.percentile(lat_ms, [50, 90, 99]) if n else [float("nan")] * 3
    row: dict[str, Any] = {
        "transport": r.transport,
        "concurrency": r.concurrency,
        "seq_len": r.seq_len,
        "window_s": round(r.window_s, 3),
        "steps": n,
        "steps_per_s": n / r.window_s if r.window_s > 0 else 0.0,
        "p50_ms": float(pct[0]),
        "p90_ms": float(pct[1]),
        "p99_ms": float(pct[2]),
        "max_ms": float(lat_ms.max()) if n else float("nan"),
        "mean_ms": float(lat_ms.mean()) if n else float("nan"),
        "start_steps": int(start_ms.size),
        "start_p50_ms": float(np.percentile(start_ms, 50)) if start_ms.size else float("nan"),
        "start_max_ms": float(start_ms.max()) if start_ms.size else float("nan"),
        "steps_total": r.steps_total,
        "sequences_done": r.sequences_done,
        "errors": r.errors,
        "timeouts": r.timeouts,
        "wrong": r.wrong,
        "stuck_workers": r.stuck_workers,
        "error_samples": r.error_samples,
        "server_cpu_s": r.server_cpu_s,
        "server_nprocs": r.server_nprocs,
        "server_threads_us_per_step": (
            {k: round(v / n * 1e6, 1) for k, v in r.server_threads_cpu_s.items()}
            if r.server_threads_cpu_s and n
            else None
        ),
        "server_cpu_us_per_step": (r.server_cpu_s / n * 1e6) if (r.server_cpu_s is not None and n) else None,
        "server_cpu_util": (r.server_cpu_s / r.window_s) if (r.server_cpu_s is not None and r.window_s) else None,
        "client_cpu_s": r.client_cpu_s,
        "client_cpu_us_per_step": (r.client_cpu_s / n * 1e6) if n else None,
        "client_cpu_util": r.client_cpu_s / r.window_s if r.window_s else None,
    }
    other = None
    if r.system_cpu_s is not None and r.window_s:
        # everything else on the machine (other processes; if the server was not measured, it is in here)
        other = max(0.0, (r.system_cpu_s - (r.server_cpu_s or 0.0) - r.client_cpu_s) / r.window_s)
    row["system_cpu_s"] = r.system_cpu_s
    row["other_cpu_util"] = other
    return row


def progress_line(row: dict[str, Any]) -> str:
    srv = row["server_cpu_us_per_step"]
    return (
        f"{row['transport']:<12} c={row['concurrency']:<3} {row['steps']:>7} steps "
        f"{row['steps_per_s']:>8.0f}/s  p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} ms  "
        f"srv {'-' if srv is None else f'{srv:.0f}'} us/step  cli {row['client_cpu_us_per_step'] or 0:.0f} us/step  "
        f"{row['errors']} err {row['wrong']} wrong"
    )


_COLUMNS = [
    # header, key, format
    ("transport", "transport", "{}"),
    ("conc", "concurrency", "{}"),
    ("steps", "steps", "{}"),
    ("steps/s", "steps_per_s", "{:.0f}"),
    ("p50 ms", "p50_ms", "{:.2f}"),
    ("p90 ms", "p90_ms", "{:.2f}"),
    ("p99 ms", "p99_ms", "{:.2f}"),
    ("max ms", "max_ms", "{:.1f}"),
    ("START p50", "start_p50_ms", "{:.2f}"),
    ("srv us/step", "server_cpu_us_per_step", "{:.0f}"),
    ("srv cpu%", "server_cpu_util", "{:.0%}"),
    ("cli us/step", "client_cpu_us_per_step", "{:.0f}"),
    ("cli cpu%", "client_cpu_util", "{:.0%}"),
    ("other cpu%", "other_cpu_util", "{:.0%}"),
    ("errors", "errors", "{}"),
    ("wrong", "wrong", "{}"),
]


def format_table(rows: list[dict[str, Any]]) -> str:
    cells = [[h for h, _, _ in _COLUMNS]]
    for row in rows:
        cells.append([("-" if row.get(k) is None else f.format(row[k])) for _, k, f in _COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS))]
    lines = []
    for j, r in enumerate(cells):
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        lines.append("  ".join(padded))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def ceiling_note(rows: list[dict[str, Any]]) -> str:
    """How close the generator itself came to being the bottleneck."""
    if not rows:
        return ""
    ncpu = os.cpu_count() or 1
    worst = max(rows, key=lambda r: r["client_cpu_util"] or 0)
    lines = [
        f"generator: one process, one event loop; busiest run {worst['transport']} c={worst['concurrency']} "
        f"used {worst['client_cpu_util']:.0%} of a core ({worst['client_cpu_us_per_step']:.0f} us/step client CPU).",
        f"machine: {ncpu} CPUs shared by client and server. A run is generator-bound when cli cpu% nears 100% "
        "(one loop thread), machine-bound when srv cpu% + cli cpu% nears " + f"{ncpu * 100}%.",
    ]
    for r in rows:
        if (r.get("other_cpu_util") or 0) > 0.1:
            lines.append(
                f"  ! {r['transport']} c={r['concurrency']}: other processes used {r['other_cpu_util']:.0%} of a CPU "
                "during the window - numbers are noisy"
            )
        if (r["client_cpu_util"] or 0) > 0.9:
            util = r["client_cpu_util"]
            lines.append(f"  ! {r['transport']} c={r['concurrency']}: client CPU {util:.0%}, likely generator-bound")
    return "\n".join(lines)


def problems(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["errors"] or r["wrong"] or r["stuck_workers"]:
            out.append(
                f"{r['transport']} c={r['concurrency']}: {r['errors']} errors ({r['timeouts']} timeouts), "
                f"{r['wrong']} wrong answers, {r['stuck_workers']} stuck"
            )
            out.extend(f"    {s}" for s in r["error_samples"])
    return out


def write_json(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"meta": meta, "runs": rows}, indent=2, default=float) + "\n")
