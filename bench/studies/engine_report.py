"""The engine study's text report: the paths' table, the core's overhead against its target, the
per-batch statistics, the breakdown of (b), and the environment the numbers came from."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.studies.engine_workload import Summary

TARGET_NS = 2000.0


def fmt_row(s: Summary) -> str:
    return (
        f"{s.path:<22}{s.mbs:>4}{s.depth:>6}{s.step_p50:>12,.0f}{s.step_p99:>12,.0f}"
        f"{s.steps_per_s:>12,.0f}{s.lat_p50 / 1e3:>11,.1f}{s.lat_p99 / 1e3:>11,.1f}"
        f"{s.cpu_per_step:>10,.0f}{s.avg_batch:>7.2f}"
    )


def report(
    results: list[Summary],
    overhead: list[dict[str, Any]],
    bds: list[dict[str, Any]],
    env: dict[str, Any],
    args: argparse.Namespace,
) -> str:
    window = f"{args.window} steps" if args.window else "max_batch_size steps"
    load = env.get("loadavg_start"), env.get("loadavg_end")
    lines = [
        f"seqserve engine bench: {args.sequences} sequences x {args.steps} steps, Direct, no-op model, "
        f"1 instance; {args.reps} reps (+1 warm-up); ns/step over windows of {window}; excluded first "
        f"{args.warmup_frac:.0%}/last {args.tail_frac:.0%} of completions; seed {args.seed}",
        f"python {env['python']}, numpy {env['numpy']}, loop {env['loop']}, {env['cpus']} CPUs, "
        f"{env['cpu']}; (b) runner reads: {args.core_reads}",
        "depth = steps in flight per sequence (1: closed loop); lat = submit -> completion, steps "
        "that already hold a slot; cpu ns = process CPU time (all threads) per step, insensitive to "
        "other load; batch = real rows per batch",
        f"1-min load average at start {load[0]}, at end {load[1]} (anything else running on "
        f"{env['cpus']} CPUs shows up in these numbers)",
        "",
    ]
    hdr = (
        f"{'path':<22}{'mbs':>4}{'depth':>6}{'ns/step p50':>12}{'ns/step p99':>12}{'steps/s':>12}"
        f"{'lat p50 us':>11}{'lat p99 us':>11}{'cpu ns':>10}{'batch':>7}"
    )
    lines += [hdr, "-" * len(hdr)]
    for mbs, depth in sorted({(s.mbs, s.depth) for s in results}):
        lines += [fmt_row(s) for s in results if (s.mbs, s.depth) == (mbs, depth)]
        lines.append("")
    if overhead:
        lines.append(
            "core overhead per step, excluding the Python call = (b) - (c), medians "
            f"(target < {TARGET_NS / 1e3:.0f} us):"
        )
        for o in overhead:
            verdict = "MET" if o["met"] else "NOT MET"
            lines.append(
                f"  mbs {o['mbs']} depth {o['depth']}: {o['core_overhead_ns']:>8,.0f} ns/step "
                f"(p99 {o['core_overhead_p99_ns']:,.0f}; CPU time {o['core_overhead_cpu_ns']:,.0f}) -> {verdict}"
            )
            if "explained" in o:
                e = o["explained"]
                lines.append(
                    f"      ~ submit {e['submit_ns']:,.0f} + executor dispatch {e['dispatch_ns']:,.0f} "
                    f"+ batch reads {e['reads_ns']:,.0f} + cross-thread wake-ups/GIL hand-off "
                    f"{e['handoff_ns']:,.0f} (per step, {e['rows']:.2f} rows/batch)"
                )
        lines.append("")
    lines.append(
        "stats() per-batch split (averages, us; queue is per request and includes the backlog "
        "wait; compute_infer includes the executor's wait for the GIL):"
    )
    lines.append(
        f"  {'path':<22}{'mbs':>4}{'depth':>6}{'batches':>9}{'rows':>6}{'input':>9}"
        f"{'infer':>9}{'output':>9}{'queue':>11}"
    )
    for s in results:
        st = s.stats
        if st:
            lines.append(
                f"  {s.path:<22}{s.mbs:>4}{s.depth:>6}{st['executions']:>9}{st['avg_batch_real_rows']:>6.2f}"
                f"{st['compute_input_us']:>9.2f}{st['compute_infer_us']:>9.2f}"
                f"{st['compute_output_us']:>9.2f}{st['queue_us_per_request']:>11,.1f}"
            )
    if bds:
        lines += [
            "",
            "breakdown of (b), ns, best of reps: submit() alone (executor stopped) vs the same loop "
            "calling a Python no-op;",
            "then the executor draining that queued work (full batches, main thread asleep, GIL "
            "uncontended), per batch, by what the runner reads; py runner = the runner body called "
            "from Python; cpu = executor on-CPU share of the drain; ping-pong = one round trip "
            "between two Python threads (2 wake-ups + 2 GIL hand-offs)",
            f"  {'mbs':>4}{'py call':>9}{'submit':>9}{'none':>9}{'handles':>9}{'inputs':>9}{'full':>9}"
            f"{'py runner':>11}{'cpu':>6}{'ping-pong':>11}",
        ]
        for b in bds:
            lines.append(
                f"  {b['mbs']:>4}{b['py_call_loop_ns']:>9,.0f}{b['submit_ns']:>9,.0f}"
                f"{b['batch_ns_none']:>9,.0f}{b['batch_ns_handles']:>9,.0f}{b['batch_ns_inputs']:>9,.0f}"
                f"{b['batch_ns_full']:>9,.0f}{b['py_runner_ns_none']:>11,.0f}"
                f"{b['executor_cpu_share_none']:>6.0%}{b['thread_ping_pong_ns']:>11,.0f}"
            )
    return "\n".join(lines)


def explain(o: dict[str, Any], sb: Summary, bd: dict[str, Any], reads: str) -> None:
    """Splits (b) - (c) per step into the parts the breakdown measured alone (approximate)."""
    rows = sb.stats["avg_batch_real_rows"] if sb.stats else float(max(1, sb.mbs))
    submit = bd["submit_ns"] - bd["py_call_loop_ns"]
    dispatch = (bd["batch_ns_none"] - bd["py_runner_ns_none"]) / rows
    reads_ns = (bd[f"batch_ns_{reads}"] - bd["batch_ns_none"]) / rows
    o["explained"] = {
        "rows": rows,
        "submit_ns": submit,
        "dispatch_ns": dispatch,
        "reads_ns": reads_ns,
        "handoff_ns": o["core_overhead_ns"] - submit - dispatch - reads_ns,
    }


def environment(loop_name: str) -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "loop": loop_name,
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "switch_interval_s": sys.getswitchinterval(),
    }
