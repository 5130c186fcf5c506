"""The engine study's data: what a run submits (:class:`Workload`), what one repetition records
(:class:`Rep`), and the medians over repetitions (:class:`Summary`, with the core's per-batch
statistics as deltas between two snapshots)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.studies.engine_models import log
from seqserve.api.statistics import statistics_json
from seqserve.engine import Server


@dataclass
class Workload:
    mbs: int
    depth: int
    nseq: int
    steps: int
    seed: int
    arrs: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        base = rng.standard_normal((self.n, 1), dtype=np.float32)
        self.arrs = [base[i : i + 1] for i in range(self.n)]  # [1, 1] C-contiguous views

    @property
    def n(self) -> int:
        return self.nseq * self.steps

    # handle h = s * steps + k + 1 (never 0: 0 marks a padding row)


@dataclass
class Rep:
    t_sub: np.ndarray
    t_done: np.ndarray
    wall_ns: int
    batches: list[list[int]] | None = None  # handles per batch (b)
    stats: dict[str, Any] | None = None
    cpu_ns: int = 0  # process CPU time (all threads) of the repetition


@dataclass
class Summary:
    path: str
    mbs: int
    depth: int
    step_p50: float
    step_p99: float
    steps_per_s: float
    steps_per_s_reps: list[float]
    lat_p50: float
    lat_p99: float
    cpu_per_step: float
    avg_batch: float
    windows: int
    stats: dict[str, Any] | None = None


def summarize(path: str, wl: Workload, reps: list[Rep], args: argparse.Namespace) -> Summary:
    per_step: list[np.ndarray] = []
    lats: list[np.ndarray] = []
    rates: list[float] = []
    k = args.window or max(1, wl.mbs)
    sizes: list[float] = []
    # Latency only for steps submitted while their sequence held a slot: step k >= depth was
    # submitted after step k - depth completed. Earlier steps include the backlog wait.
    in_slot = (np.arange(wl.n) % wl.steps) >= wl.depth
    for r in reps:
        order = np.argsort(r.t_done, kind="stable")
        td = r.t_done[order]
        lo, hi = int(wl.n * args.warmup_frac), int(wl.n * (1.0 - args.tail_frac))
        td = td[lo:hi]
        idx = np.arange(0, len(td) - k, k)
        per_step.append((td[idx + k] - td[idx]) / k)
        sel = order[lo:hi]
        sel = sel[in_slot[sel]]
        lats.append(r.t_done[sel] - r.t_sub[sel])
        rates.append((len(td) - 1) / (td[-1] - td[0]) * 1e9)
        if r.stats is not None and r.stats["executions"]:
            sizes.append(r.stats["inference_count"] / r.stats["executions"])
    ps = np.concatenate(per_step)
    lat = np.concatenate(lats)
    stats = merge_stats([r.stats for r in reps if r.stats is not None])
    return Summary(
        path=path,
        mbs=wl.mbs,
        depth=wl.depth,
        step_p50=float(np.median(ps)),
        step_p99=float(np.percentile(ps, 99)),
        steps_per_s=float(np.median(rates)),
        steps_per_s_reps=[round(x, 1) for x in rates],
        lat_p50=float(np.median(lat)),
        lat_p99=float(np.percentile(lat, 99)),
        cpu_per_step=float(np.median([r.cpu_ns / wl.n for r in reps])),
        avg_batch=float(np.mean(sizes)) if sizes else float("nan"),
        windows=len(ps),
        stats=stats,
    )


# ------------------------------------------------------------------------------- core stats


def core_stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per-batch averages from two ``core_stats`` snapshots."""

    def tot(s: dict[str, Any], key: str) -> tuple[int, int]:
        c = sum(b[key]["count"] for b in s["batch_stats"])
        ns = sum(b[key]["ns"] for b in s["batch_stats"])
        return c, ns

    out: dict[str, Any] = {
        "executions": after["execution_count"] - before["execution_count"],
        "inference_count": after["inference_count"] - before["inference_count"],
        "queue_count": after["queue"]["count"] - before["queue"]["count"],
        "queue_ns": after["queue"]["ns"] - before["queue"]["ns"],
    }
    for key in ("compute_input", "compute_infer", "compute_output"):
        c1, n1 = tot(after, key)
        c0, n0 = tot(before, key)
        out[key + "_count"], out[key + "_ns"] = c1 - c0, n1 - n0
    return out


def api_stats(server: Server, model: str) -> dict[str, Any]:
    """Server.statistics() in the raw core shape used by core_stats_delta."""
    s = statistics_json(server.statistics(model))["model_stats"][0]
    return {
        "execution_count": s["execution_count"],
        "inference_count": s["inference_count"],
        "queue": s["inference_stats"]["queue"],
        "batch_stats": s["batch_stats"],
    }


def merge_stats(items: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not items:
        return None
    tot = {k: sum(d[k] for d in items) for k in items[0]}
    ex = max(1, tot["executions"])
    return {
        "executions": tot["executions"],
        "avg_batch_real_rows": tot["inference_count"] / ex,
        "compute_input_us": tot["compute_input_ns"] / max(1, tot["compute_input_count"]) / 1e3,
        "compute_infer_us": tot["compute_infer_ns"] / max(1, tot["compute_infer_count"]) / 1e3,
        "compute_output_us": tot["compute_output_ns"] / max(1, tot["compute_output_count"]) / 1e3,
        "queue_us_per_request": tot["queue_ns"] / max(1, tot["queue_count"]) / 1e3,
    }


def progress(tag: str, wl: Workload, rep: int, reps: int, r: Rep) -> None:
    what = "warm-up" if rep == 0 else f"rep {rep}/{reps}"
    log(
        f"  ({tag}) mbs={wl.mbs} depth={wl.depth} {what}: {wl.n} steps in {r.wall_ns / 1e9:.3f} s "
        f"({wl.n / r.wall_ns * 1e9:,.0f} steps/s)"
    )
