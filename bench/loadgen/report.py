"""Turning :class:`~bench.loadgen.runner.RunResult` objects into numbers, tables, JSON and a plot."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from bench.loadgen.model_stats import per_step
from bench.loadgen.runner import RunResult

NEAR = 0.8  # "near the generator's ceiling": at least this fraction of what it did against a floor


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


# The latency CDF kept in the JSON (so that --plot can be drawn again from it): these quantiles,
# every percent and a finer tail.
CDF_QUANTILES = [i / 100 for i in range(100)] + [0.995, 0.999, 0.9995, 0.9999, 1.0]


def summarize(r: RunResult) -> dict[str, Any]:
    """The per-run metrics (latencies in ms, CPU in microseconds per measured step)."""
    n = r.steps
    lat_ms = r.latencies_ns / 1e6
    start_ms = r.start_latencies_ns / 1e6
    threads = r.server_threads_cpu_s
    pct = np.percentile(lat_ms, [50, 90, 99, 99.9]) if n else [float("nan")] * 4
    row: dict[str, Any] = {
        "target": r.label,
        "mode": r.mode,
        "transport": r.transport,
        "concurrency": r.concurrency,
        "period_ms": r.period_s * 1e3 if r.period_s else None,
        "processes": r.processes,
        "seq_len": r.seq_len,
        "window_s": round(r.window_s, 3),
        "steps": n,
        "steps_per_s": n / r.window_s if r.window_s > 0 else 0.0,
        "p50_ms": float(pct[0]),
        "p90_ms": float(pct[1]),
        "p99_ms": float(pct[2]),
        "p99_9_ms": float(pct[3]),
        "max_ms": float(lat_ms.max()) if n else float("nan"),
        "mean_ms": float(lat_ms.mean()) if n else float("nan"),
        # the latency CDF: latency (ms) at each of CDF_QUANTILES
        "cdf_ms": [round(float(v), 4) for v in np.quantile(lat_ms, CDF_QUANTILES)] if n else [],
        "start_steps": int(start_ms.size),
        "start_p50_ms": _pct(start_ms, 50),
        "start_max_ms": float(start_ms.max()) if start_ms.size else float("nan"),
        "p99_non_start_ms": float(np.percentile(r.rest_latencies_ns, 99) / 1e6) if r.rest_latencies_ns.size else None,
        "steps_total": r.steps_total,
        "sequences_done": r.sequences_done,
        "errors": r.errors,
        "timeouts": r.timeouts,
        "wrong": r.wrong,
        "verified": r.verified,
        "stuck_workers": r.stuck_workers,
        "error_samples": r.error_samples,
        "server_cpu_s": r.server_cpu_s,
        "server_nprocs": r.server_nprocs,
        "server_threads_us_per_step": {k: round(v / n * 1e6, 1) for k, v in threads.items()} if threads and n else None,
        "server_cpu_us_per_step": (r.server_cpu_s / n * 1e6) if (r.server_cpu_s is not None and n) else None,
        "server_cpu_util": (r.server_cpu_s / r.window_s) if (r.server_cpu_s is not None and r.window_s) else None,
        # per process kind: the server's own process (the engine) and its children (the workers)
        "engine_cpu_us_per_step": (r.engine_cpu_s / n * 1e6) if (r.engine_cpu_s is not None and n) else None,
        "workers_cpu_us_per_step": (r.workers_cpu_s / n * 1e6) if (r.workers_cpu_s is not None and n) else None,
        "client_cpu_s": r.client_cpu_s,
        "client_cpu_us_per_step": (r.client_cpu_s / n * 1e6) if n else None,
        "client_cpu_util": r.client_cpu_s / r.window_s if r.window_s else None,
    }
    if r.mode == "paced":
        misses = int(r.lane_misses.sum())
        row.update(
            deadline_misses=misses,
            miss_pct=100.0 * misses / n if n else None,
            streams=int(r.lane_steps.size),
            streams_ok=int(((r.lane_misses == 0) & (r.lane_steps > 0)).sum()),
            send_lag_p99_ms=_pct(r.send_lag_ns / 1e6, 99),
            target_steps_per_s=r.concurrency / r.period_s if r.period_s else None,
        )
    other = None
    if r.system_cpu_s is not None and r.window_s:
        # everything else on the machine (other processes; if the server was not measured, it is in here)
        other = max(0.0, (r.system_cpu_s - (r.server_cpu_s or 0.0) - r.client_cpu_s) / r.window_s)
    row["system_cpu_s"] = r.system_cpu_s
    row["other_cpu_util"] = other
    if r.model_stats is not None:
        row["model_stats"] = r.model_stats
        row.update(per_step(r.model_stats, row["server_cpu_us_per_step"]))
    row.update(r.extra)
    return row


def _load(row: dict[str, Any]) -> str:
    return f"{'s' if row['mode'] == 'paced' else 'c'}={row['concurrency']}"


def progress_line(row: dict[str, Any]) -> str:
    srv = row["server_cpu_us_per_step"]
    paced = ""
    if row["mode"] == "paced":
        paced = f"  {row['streams_ok']}/{row['streams']} streams on time ({row['deadline_misses']} misses)"
    return (
        f"{row['target'] + ' ' if row['target'] else ''}{row['transport']:<12} {_load(row):<5} {row['steps']:>7} steps "
        f"{row['steps_per_s']:>8.0f}/s  p50 {row['p50_ms']:.2f} p99 {row['p99_ms']:.2f} "
        f"p99.9 {row['p99_9_ms']:.2f} ms  "
        f"srv {'-' if srv is None else f'{srv:.0f}'} us/step  cli {row['client_cpu_us_per_step'] or 0:.0f} us/step  "
        f"{row['errors']} err {row['wrong']} wrong{paced}"
    )


_COLUMNS = [
    # header, key, format
    ("transport", "transport", "{}"),
    ("load", "load", "{}"),
    ("steps", "steps", "{}"),
    ("steps/s", "steps_per_s", "{:.0f}"),
    ("p50 ms", "p50_ms", "{:.2f}"),
    ("p90 ms", "p90_ms", "{:.2f}"),
    ("p99 ms", "p99_ms", "{:.2f}"),
    ("p99.9 ms", "p99_9_ms", "{:.2f}"),
    ("max ms", "max_ms", "{:.1f}"),
    ("START p50", "start_p50_ms", "{:.2f}"),
    ("p99 non-START", "p99_non_start_ms", "{:.2f}"),
    ("srv us/step", "server_cpu_us_per_step", "{:.0f}"),
    ("srv cpu%", "server_cpu_util", "{:.0%}"),
    ("cli us/step", "client_cpu_us_per_step", "{:.0f}"),
    ("cli cpu%", "client_cpu_util", "{:.0%}"),
    ("other cpu%", "other_cpu_util", "{:.0%}"),
    ("errors", "errors", "{}"),
    ("wrong", "wrong", "{}"),
]
_PER_KIND = [
    ("engine us/step", "engine_cpu_us_per_step", "{:.1f}"),
    ("workers us/step", "workers_cpu_us_per_step", "{:.0f}"),
]
_PACED = [
    ("miss%", "miss_pct", "{:.2f}"),
    ("streams on time", "on_time", "{}"),
    ("lag p99 ms", "send_lag_p99_ms", "{:.2f}"),
]


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        padded = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        lines.append("  ".join(padded))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = list(_COLUMNS)
    if any((r.get("server_nprocs") or 1) > 1 for r in rows):  # worker processes: the CPU per process kind
        at = cols.index(("srv cpu%", "server_cpu_util", "{:.0%}"))
        cols[at:at] = _PER_KIND
    if any(r["mode"] == "paced" for r in rows):
        cols += _PACED
    if len({r["target"] for r in rows}) > 1:
        cols.insert(0, ("target", "target", "{}"))
    cells = [[h for h, _, _ in cols]]
    for row in rows:
        row = dict(row, load=_load(row))
        if row["mode"] == "paced":
            row["on_time"] = f"{row['streams_ok']}/{row['streams']}"
        cells.append([("-" if row.get(k) is None else f.format(row[k])) for _, k, f in cols])
    return text_table(cells)


def format_overhead(rows: list[dict[str, Any]]) -> str:
    """The server's own cost per step, the model's execute taken out (runs with --model-stats)."""
    rows = [r for r in rows if "execute_us_per_step" in r]
    if not rows:
        return ""
    cols = [
        ("transport", "transport", "{}"),
        ("load", "load", "{}"),
        ("srv us/step", "server_cpu_us_per_step", "{:.0f}"),
        ("execute us/step", "execute_us_per_step", "{:.1f}"),
        ("srv excl. execute us/step", "server_own_us_per_step", "{:.0f}"),
        ("mean batch", "mean_batch", "{:.2f}"),
        ("execute us/batch", "execute_us_per_batch", "{:.1f}"),
        ("input us/step", "compute_input_us_per_step", "{:.1f}"),
        ("output us/step", "compute_output_us_per_step", "{:.1f}"),
        ("other cpu%", "other_cpu_util", "{:.0%}"),
    ]
    cells = [[h for h, _, _ in cols]]
    for row in rows:
        row = dict(row, load=_load(row))
        cells.append([("-" if row.get(k) is None else f.format(row[k])) for _, k, f in cols])
    return text_table(cells)


def overhead_medians(rows: list[dict[str, Any]]) -> str:
    """When a (transport, load) was run more than once (e.g. ``--concurrency 1,16,64,1,16,64``): the
    median (min-max) of the server's CPU, the model's execute and the rest, per step."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        if "execute_us_per_step" in r:
            groups.setdefault((r["target"], r["transport"], r["concurrency"]), []).append(r)
    if not groups or max(len(g) for g in groups.values()) < 2:
        return ""

    def spread(g: list[dict[str, Any]], key: str) -> str:
        vals = sorted(v for r in g if (v := r.get(key)) is not None)
        if not vals:
            return "-"
        mid = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1] + vals[len(vals) // 2]) / 2
        return f"{mid:.0f} ({vals[0]:.0f}-{vals[-1]:.0f})"

    cells = [["transport", "load", "runs", "srv us/step", "execute us/step", "srv excl. execute us/step"]]
    for (_, transport, load), g in groups.items():
        cells.append([transport, f"c={load}", str(len(g))] + [spread(g, k) for k in
                     ("server_cpu_us_per_step", "execute_us_per_step", "server_own_us_per_step")])  # fmt: skip
    return text_table(cells)


def ceiling_note(rows: list[dict[str, Any]]) -> str:
    """How close the generator itself came to being the bottleneck."""
    if not rows:
        return ""
    ncpu = os.cpu_count() or 1

    worst = max(rows, key=_per_proc)
    nproc = worst.get("processes") or 1
    lines = [
        f"generator: {nproc} process{'es' if nproc > 1 else ''}, one event loop each; busiest run "
        f"{worst['transport']} {_load(worst)} used {_per_proc(worst):.0%} of a core per process "
        f"({worst['client_cpu_us_per_step'] or 0:.0f} us/step client CPU).",
        f"machine: {ncpu} CPUs shared by client and server. A run is generator-bound when cli cpu% nears "
        "100% per generator process, machine-bound when srv cpu% + cli cpu% nears " + f"{ncpu * 100}%.",
    ]
    for r in rows:
        tag = f"{r['target'] + ' ' if r['target'] else ''}{r['transport']} {_load(r)}"
        if (r.get("other_cpu_util") or 0) > 0.1:
            lines.append(
                f"  ! {tag}: other processes used {r['other_cpu_util']:.0%} of a CPU during the window - "
                "numbers are noisy"
            )
        if _per_proc(r) > 0.9:
            lines.append(f"  ! {tag}: client CPU {_per_proc(r):.0%} per process, likely generator-bound")
    return "\n".join(lines)


def _per_proc(r: dict[str, Any]) -> float:
    return (r["client_cpu_util"] or 0) / max(1, r.get("processes") or 1)


def compare_floors(rows: list[dict[str, Any]]) -> tuple[str, list[str], list[dict[str, Any]]]:
    """Server rows against the floor rows of the same transport, mode and load (server CPU per step
    as a multiple of the floor's) and against the generator's ceiling for their transport (a closed
    loop run flat out against the floor: ``ceiling:<floor>`` rows). Returns (table, warnings, rows)."""
    floors = {(r["transport"], r["mode"], r["concurrency"]): r for r in rows if r["target"].startswith("floor:")}
    ceilings = {r["transport"]: r for r in rows if r["target"].startswith("ceiling:")}
    comps: list[dict[str, Any]] = []
    warns: list[str] = []
    for r in rows:
        if r["target"].startswith(("floor:", "ceiling:")):
            continue
        f = floors.get((r["transport"], r["mode"], r["concurrency"]))
        ce = ceilings.get(r["transport"])
        if f is None and ce is None:
            continue
        srv = r["server_cpu_us_per_step"]
        fsrv = f["server_cpu_us_per_step"] if f else None
        rate = r["steps_per_s"] if r["mode"] == "closed" else (r.get("target_steps_per_s") or r["steps_per_s"])
        c: dict[str, Any] = {
            "target": r["target"],
            "transport": r["transport"],
            "mode": r["mode"],
            "concurrency": r["concurrency"],
            "floor": f["target"] if f else None,
            "server_cpu_us_per_step": srv,
            "floor_cpu_us_per_step": fsrv,
            "server_cpu_x_floor": (srv / fsrv) if (srv is not None and fsrv) else None,
            "steps_per_s": r["steps_per_s"],
            "ceiling": ce["target"] if ce else None,
            "ceiling_steps_per_s": ce["steps_per_s"] if ce else None,
            "of_ceiling_steps": rate / ce["steps_per_s"] if ce and ce["steps_per_s"] else None,
            "client_cpu_per_process": _per_proc(r),
            "ceiling_client_cpu_per_process": _per_proc(ce) if ce else None,
            "of_ceiling_cpu": _per_proc(r) / _per_proc(ce) if ce and _per_proc(ce) else None,
        }
        comps.append(c)
        tag = f"{r['target']} {r['transport']} {_load(r)}"
        if (c["of_ceiling_steps"] or 0) >= NEAR:
            what = "throughput" if r["mode"] == "closed" else "paced rate"
            warns.append(
                f"  ! {tag}: {what} is {c['of_ceiling_steps']:.0%} of the generator's ceiling "
                f"({ce['steps_per_s']:.0f} steps/s against {ce['target']}): the generator may limit this run"  # type: ignore[index]
            )
        if (c["of_ceiling_cpu"] or 0) >= NEAR and _per_proc(ce) >= 0.5:  # type: ignore[arg-type]
            warns.append(
                f"  ! {tag}: client CPU {_per_proc(r):.0%} per process is {c['of_ceiling_cpu']:.0%} of the "
                f"generator's CPU at its ceiling ({_per_proc(ce):.0%}): near its limit, add --processes"  # type: ignore[arg-type]
            )
        if r["mode"] == "paced" and f is not None and f.get("deadline_misses"):
            warns.append(
                f"  ! {tag}: even against {f['target']} {f['deadline_misses']} steps missed their deadline: "
                "the generator cannot keep this many streams on time"
            )
    if not comps:
        return "", warns, comps
    cells = [
        [
            "target", "transport", "load", "srv us/step", "floor us/step", "x floor",
            "steps/s", "ceiling steps/s", "% ceiling", "cli cpu%/proc", "ceiling cli cpu%",
        ]
    ]  # fmt: skip

    def f_(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    for c in comps:
        cells.append(
            [
                c["target"], c["transport"], _load(c), f_(c["server_cpu_us_per_step"], "{:.0f}"),
                f_(c["floor_cpu_us_per_step"], "{:.0f}"), f_(c["server_cpu_x_floor"], "{:.2f}x"),
                f_(c["steps_per_s"], "{:.0f}"), f_(c["ceiling_steps_per_s"], "{:.0f}"),
                f_(c["of_ceiling_steps"], "{:.0%}"), f_(c["client_cpu_per_process"], "{:.0%}"),
                f_(c["ceiling_client_cpu_per_process"], "{:.0%}"),
            ]
        )  # fmt: skip
    return text_table(cells), warns, comps


def problems(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        if r["errors"] or r["wrong"] or r["stuck_workers"]:
            out.append(
                f"{r['target'] + ' ' if r['target'] else ''}{r['transport']} {_load(r)}: {r['errors']} errors "
                f"({r['timeouts']} timeouts), {r['wrong']} wrong answers, {r['stuck_workers']} stuck"
            )
            out.extend(f"    {s}" for s in r["error_samples"])
    return out


def write_json(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], **extra: Any) -> None:
    doc = {"meta": meta, "runs": rows, **extra}
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Tick values for a log axis from lo to hi: 1-2-5 steps, fewer over many decades, more
    within a narrow range, so that labels neither crowd nor vanish."""
    if not (lo > 0 and hi > lo):
        return []
    decades = math.log10(hi / lo)
    if decades > 4:
        mantissas: tuple[float, ...] = (1,)
    elif decades > 2:
        mantissas = (1, 3)
    else:
        mantissas = (1, 2, 5)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [m * 10.0**e for e in range(first, last + 1) for m in mantissas]
    ticks = [t for t in ticks if lo <= t <= hi]
    if len(ticks) < 3:  # less than about half a decade: every integer mantissa
        ticks = [m * 10.0**e for e in range(first, last + 1) for m in range(1, 10)]
        ticks = [t for t in ticks if lo <= t <= hi]
        while len(ticks) > 8:
            ticks = ticks[::2]
    return ticks


def _plain_log_axis(axis: Any, ticks: list[float], labels: list[str] | None = None) -> None:
    """Labels as plain numbers ("0.5", "2", "100") at the given ticks only: matplotlib's own log
    labels (10^x, plus minor-tick labels on short ranges) overlap and are hard to read."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter, NullFormatter

    if not ticks:
        return
    axis.set_major_locator(FixedLocator(ticks))
    if labels is not None:
        axis.set_major_formatter(FixedFormatter(labels))
    else:
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot(path: Path, runs: list[tuple[dict[str, Any], RunResult]]) -> None:
    """Latency (p50/p99/p99.9) against load per target and transport (floors: p50 only, thin), and
    each run's latency CDF (floors dashed). Ceiling runs (a calibration) are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(row, res) for row, res in runs if not row["target"].startswith("ceiling:")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6.5))
    colors = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    transports = sorted({row["transport"] for row, _ in runs})
    color = {t: colors[i % len(colors)] for i, t in enumerate(transports)}
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row, _ in runs:
        series.setdefault((row["target"], row["transport"]), []).append(row)
    for (target, transport), rs in series.items():
        rs = sorted(rs, key=lambda r: r["concurrency"])
        x = [r["concurrency"] for r in rs]
        c = color[transport]
        name = f"{target + ' ' if target else ''}{transport}"
        if target.startswith("floor:"):
            ax1.plot(x, [r["p50_ms"] for r in rs], marker="x", lw=0.8, color=c, alpha=0.6, label=f"{name} p50")
            continue
        ax1.plot(x, [r["p50_ms"] for r in rs], marker="o", color=c, label=f"{name} p50")
        ax1.plot(x, [r["p99_ms"] for r in rs], marker="s", ls="--", color=c, label=f"{name} p99")
        ax1.plot(x, [r["p99_9_ms"] for r in rs], marker="^", ls=":", color=c, label=f"{name} p99.9")
    modes = {row["mode"] for row, _ in runs}
    ax1.set_xlabel("paced streams" if modes == {"paced"} else "concurrent sequences")
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    ax1.set_xscale("log", base=2)
    loads_x = sorted({row["concurrency"] for row, _ in runs})
    _plain_log_axis(ax1.xaxis, [float(n) for n in loads_x], [str(n) for n in loads_x])
    _plain_log_axis(ax1.yaxis, _log_ticks(*ax1.get_ylim()))
    ax1.set_title("latency vs load")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=2, frameon=False)
    loads = sorted({row["concurrency"] for row, _ in runs})
    shade = {n: 0.45 + 0.55 * i / max(1, len(loads) - 1) for i, n in enumerate(loads)}
    for row, res in runs:
        lat = np.sort(res.latencies_ns) / 1e6
        if lat.size:
            y = np.arange(1, lat.size + 1) / lat.size
        elif len(row.get("cdf_ms") or []) == len(CDF_QUANTILES):  # redrawn from a JSON file
            lat, y = np.asarray(row["cdf_ms"]), np.asarray(CDF_QUANTILES)
        else:
            continue
        if lat.size > 5000:  # thin out, keeping the tail
            head = np.linspace(0, lat.size - 1, 4000).astype(int)
            idx = np.unique(np.concatenate([head, np.arange(lat.size - 1000, lat.size)]))
            lat, y = lat[idx], y[idx]
        floor = row["target"].startswith("floor:")
        ax2.plot(
            lat,
            y,
            color=color[row["transport"]],
            alpha=shade[row["concurrency"]],
            ls="--" if floor else "-",
            lw=0.9 if floor else 1.4,
            label=f"{row['target'] + ' ' if row['target'] else ''}{row['transport']} {_load(row)}",
        )
    ax2.set_xscale("log")
    _plain_log_axis(ax2.xaxis, _log_ticks(*ax2.get_xlim()))
    ax2.set_xlabel("latency (ms)")
    ax2.set_ylabel("fraction of steps")
    ax2.set_title("latency CDF (darker: more load; dashed: floor)")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def replot(json_path: Path, png: Path) -> None:
    """Draw --plot's figure again from a --json file (needs the runs' ``cdf_ms``)."""
    doc = json.loads(json_path.read_text())
    rows = doc["runs"]
    missing = [r for r in rows if not r["target"].startswith("ceiling:") and not r.get("cdf_ms")]
    if missing:
        raise SystemExit(
            f"{json_path}: {len(missing)} run(s) have no latency CDF (cdf_ms; files written before it was "
            "recorded): the plot cannot be drawn from this file, re-run the benchmark with --plot"
        )
    empty = [RunResult(transport=r["transport"], concurrency=r["concurrency"], seq_len=r["seq_len"]) for r in rows]
    plot(png, list(zip(rows, empty, strict=True)))


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m bench.loadgen.report", description="Redraw a benchmark plot from its JSON."
    )
    ap.add_argument("json", type=Path, help="a file written by python -m bench --json")
    ap.add_argument("--plot", type=Path, required=True, metavar="PATH.png")
    args = ap.parse_args(argv)
    replot(args.json, args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
