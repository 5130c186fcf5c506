"""The side-by-side bench's summary (``bench.vs_triton.side_by_side``): medians over rounds with their spread,
ratios seqserve / Triton per round, the targets of issue 14, checks, text and JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

NAMES = {
    "grpc-stream": "gRPC stream",
    "http-binary": "HTTP binary",
    "http-json": "HTTP JSON",
    "grpc-unary": "gRPC unary",
}
# issue 14's targets: seqserve's server CPU per step as a multiple of Triton's, and p99 latency
CPU_TARGETS = {"grpc-stream": 0.60, "http-binary": 0.60, "grpc-unary": 0.90}
P99_TARGET = 0.25
# the figures aggregated over rounds (key in a run's row)
FIGURES = ("server_cpu_us_per_step", "p50_ms", "p99_ms", "p99_non_start_ms", "start_p50_ms", "steps_per_s",
           "execute_us_per_step",
           "server_own_us_per_step", "client_cpu_util", "other_cpu_util", "idle_server_cpu_util")  # fmt: skip
RATIOS = ("server_cpu_us_per_step", "p50_ms", "p99_ms", "p99_non_start_ms", "steps_per_s")


def spread(values: list[Any]) -> dict[str, Any] | None:
    """Median, min and max (None when there is nothing to summarize)."""
    vals = [v for v in values if v is not None and v == v]  # drop None and NaN
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(rows: list[dict[str, Any]], transports: list[str], loads: list[int], sides: list[str]) -> dict[str, Any]:
    """Per (transport, load): each side's figures over the rounds, and the per-round ratios
    first side / second side (seqserve / Triton) of the figures in RATIOS."""
    cases: list[dict[str, Any]] = []
    for t in transports:
        for n in loads:
            mine = [r for r in rows if r["transport"] == t and r["concurrency"] == n]
            per_side: dict[str, dict[str, Any]] = {}
            for s in sides:
                rs = [r for r in mine if r["target"] == s]
                per_side[s] = {
                    "runs": len(rs),
                    "steps": sum(r["steps"] for r in rs),
                    "errors": sum(r["errors"] for r in rs),
                    "wrong": sum(r["wrong"] for r in rs),
                    "stuck": sum(r["stuck_workers"] for r in rs),
                    "verified": all(r["verified"] for r in rs),
                    **{f: spread([r.get(f) for r in rs]) for f in FIGURES},
                }
            ratios: dict[str, Any] = {}
            if len(sides) == 2:
                a, b = sides
                for f in RATIOS:
                    per_round = []
                    for ra in (r for r in mine if r["target"] == a):
                        rb = next((r for r in mine if r["target"] == b and r["round"] == ra["round"]), None)
                        if rb and ra.get(f) is not None and rb.get(f):
                            per_round.append(ra[f] / rb[f])
                    ratios[f] = {"per_round": per_round, **(spread(per_round) or {})}
            cases.append({"transport": t, "concurrency": n, "sides": per_side, "ratios": ratios})
    failed = [
        f"{s} {c['transport']} c={c['concurrency']}: {v['errors']} errors, {v['wrong']} wrong, {v['stuck']} stuck"
        + ("" if v["verified"] else ", replies NOT verified")
        for c in cases
        for s, v in c["sides"].items()
        if v["errors"] or v["wrong"] or v["stuck"] or not v["verified"] or not v["runs"]
    ]
    return {"cases": cases, "checks_ok": not failed, "check_failures": failed}


def _fmt(sp: dict[str, Any] | None, fmt: str, unit: str = "") -> str:
    if not sp:
        return "-"
    m, lo, hi = (fmt.format(sp[k]) for k in ("median", "min", "max"))
    return f"{m}{unit} ({lo}-{hi})"


def _verdict(ratio: dict[str, Any], target: float | None) -> str:
    if target is None:
        return ""
    if "median" not in ratio:
        return f"<= {target:.2f}x"
    return f"<= {target:.2f}x ({'met' if ratio['median'] <= target else 'missed'})"


def _table(summary: dict[str, Any], sides: list[str], labels: dict[str, str]) -> list[str]:
    a, b = sides[0], sides[1] if len(sides) > 1 else None
    head = f"| transport | {labels[a]} | {labels[b] if b else '-'} | ratio | target |"
    out = [head, "|---|---|---|---|---|"]
    multi = len({c["concurrency"] for c in summary["cases"]}) > 1
    groups = (("server_cpu_us_per_step", " us", "{:.0f}", ""), ("p99_ms", " ms", "{:.1f}", "p99, "),
              ("p99_non_start_ms", " ms", "{:.1f}", "p99 without START steps, "))  # fmt: skip
    for key, unit, fmt, what in groups:
        for c in summary["cases"]:
            name = what + NAMES.get(c["transport"], c["transport"]) + (f" c={c['concurrency']}" if multi else "")
            r = c["ratios"].get(key, {})
            ratio = f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" if "median" in r else "-"
            target = {"server_cpu_us_per_step": CPU_TARGETS.get(c["transport"]), "p99_ms": P99_TARGET}.get(key)
            sb = _fmt(c["sides"][b][key], fmt, unit) if b else "-"
            out.append(f"| {name} | {_fmt(c['sides'][a][key], fmt, unit)} | {sb} | {ratio} | {_verdict(r, target)} |")
    return out


def _details(summary: dict[str, Any], sides: list[str], labels: dict[str, str]) -> list[str]:
    cols = [("steps_per_s", "steps/s", "{:.0f}"), ("p50_ms", "p50 ms", "{:.2f}"), ("p99_ms", "p99 ms", "{:.2f}"),
            ("p99_non_start_ms", "p99 non-START ms", "{:.2f}"), ("start_p50_ms", "START p50 ms", "{:.2f}"),
            ("server_cpu_us_per_step", "srv us/step", "{:.0f}"), ("execute_us_per_step", "execute us/step", "{:.0f}"),
            ("client_cpu_util", "client cpu", "{:.2f}"), ("other_cpu_util", "other cpu", "{:.2f}"),
            ("idle_server_cpu_util", "idle server cpu", "{:.2f}")]  # fmt: skip
    out = ["| server | transport | " + " | ".join(h for _, h, _ in cols) + " | errors | wrong |"]
    out.append("|---|---|" + "---|" * len(cols) + "---|---|")
    for c in summary["cases"]:
        for s in sides:
            v = c["sides"][s]
            cells = " | ".join(_fmt(v[k], f) for k, _, f in cols)
            case = f"{c['transport']} c={c['concurrency']}"
            out.append(f"| {labels[s]} | {case} | {cells} | {v['errors']} | {v['wrong']} |")
    return out


def labels_of(infos: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {n: (f"Triton {i['version']}" if n == "Triton" and i.get("version") else n) for n, i in infos.items()}


def slots_line(infos: dict[str, dict[str, Any]]) -> str:
    """Which slots each side's model had, e.g. "seqserve accumulator 16 slots (2 instances x max_batch_size 8),
    Triton 2.51.0 accum_py 16 slots (...; how its instance count was set)"."""
    labels = labels_of(infos)
    parts = []
    for n, i in infos.items():
        part = f"{labels[n]} {i.get('model')} {i.get('slots') or '?'} slots"
        if i.get("instances") and i.get("max_batch_size"):
            part += f" ({i['instances']} instances x max_batch_size {i['max_batch_size']}"
            part += f"; {i['instances_how']})" if i.get("instances_how") else ")"
        parts.append(part)
    return "Models: " + ", ".join(parts) + "."


def format_text(summary: dict[str, Any], args: argparse.Namespace, infos: dict[str, Any], loop: str) -> str:
    sides = list(infos)
    labels = labels_of(infos)
    short = [labels[n] for n, i in infos.items() if (i.get("slots") or 0) < max(args.concurrency)]
    lines = [
        f"side by side: {args.rounds} alternating rounds; per run {args.warmup:g}s warm-up + {args.duration:g}s "
        f"measured; {','.join(map(str, args.concurrency))} concurrent sequences of {args.seq_len} steps, "
        f"{_load_words(args)}, one gRPC stream per sequence; client tritonclient aio on {loop}; every reply "
        f"checked against the running sum. {slots_line(infos)}",
        "Server CPU per step = CPU of the server's whole process tree (Triton: with its Python backend stubs) over "
        "the measured window / measured steps. Figures: median of the rounds (min-max); ratio = "
        f"{labels[sides[0]]} / {labels[sides[-1]]} per round, its median (min-max).",
        "",
        *_table(summary, sides, labels),
        "",
        (f"Fewer slots than sequences: {', '.join(short)}. " if short else "Every side has a slot per sequence. ")
        + "A Direct model with fewer slots than sequences keeps the others in its backlog: their START steps wait "
        "for a sequence to end, which sets the p99; 'p99 without START steps' is the steady steps' tail.",
        "",
        "Per server and transport, medians of the rounds (min-max); cpu columns in cores; 'other cpu' is the "
        "rest of the machine (the idle server included), 'idle server cpu' the server not under test; "
        "execute = the model's batch compute_infer per request, from its statistics over the window:",
        "",
        *_details(summary, sides, labels),
        "",
    ]
    if summary["checks_ok"]:
        total = sum(v["runs"] for c in summary["cases"] for v in c["sides"].values())
        lines.append(f"checks: 0 wrong answers, 0 errors, every reply verified, in all {total} runs: OK")
    else:
        lines.append("checks FAILED:")
        lines += [f"    {f}" for f in summary["check_failures"]]
    load = os.getloadavg()
    lines.append(f"machine: {os.cpu_count()} CPUs, load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    return "\n".join(lines)


def _load_words(args: argparse.Namespace) -> str:
    mode = getattr(args, "mode", "closed")
    if mode == "paced":
        return f"paced (each sequence sends one step every {args.period_ms:g} ms, whatever the server does)"
    return "closed loop"


def write_json(
    path: Path,
    args: argparse.Namespace,
    argv: list[str] | None,
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    infos: dict[str, Any],
    loop: str,
) -> None:
    import sys

    import tritonclient

    meta = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else argv,
        "servers": infos,
        "rounds": args.rounds,
        "transports": args.transports,
        "concurrency": args.concurrency,
        "seq_len": args.seq_len,
        "mode": getattr(args, "mode", "closed"),
        "period_ms": args.period_ms if getattr(args, "mode", "closed") == "paced" else None,
        "warmup_s": args.warmup,
        "duration_s": args.duration,
        "grpc_streams": 0,
        "client_loop": loop,
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tritonclient": getattr(tritonclient, "__version__", None),
        "targets": {"server_cpu_ratio": CPU_TARGETS, "p99_ratio": P99_TARGET},
    }
    doc = {"meta": meta, "summary": summary, "runs": [{k: v for k, v in r.items() if k != "cdf_ms"} for r in rows]}
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
