"""The model's own statistics (KServe v2 / Triton ``GET /v2/models/<m>/stats``) over a measured window.

Read at the window's edges (``--model-stats``), they split the server's CPU per step into the
model's ``execute`` and everything else. ``execute`` is the batch statistics' ``compute_infer``:
one entry per executed batch, so the time of a batch counts once however many requests it
carried (Triton's per-request ``inference_stats.compute_infer`` would count it once per request).
That time is wall-clock time of the model call, not CPU time: on a loaded machine a preempted
model call reads longer than the CPU it used, which makes the overhead figure (server CPU minus
execute) read low, never high; a model running a thread pool (CPU > wall) makes it read high. The
bench's LSTM models run one intra-op thread, so there the two agree when the machine is idle.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

# the per-batch phases of the batch statistics, and the per-request queue time
PHASES = ("compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class StatsSnapshot:
    inference_count: int  # requests (rows) executed
    execution_count: int  # model calls (batches)
    queue_ns: int  # summed over requests
    batch_ns: dict[str, int]  # phase -> ns summed over executed batches (batch_stats)
    batch_rows: int  # rows executed, padding included (sum of batch_size * count)


def parse(doc: dict[str, Any], model: str) -> StatsSnapshot:
    """One version's statistics from a stats reply (the first entry for ``model``)."""
    entries = [m for m in doc.get("model_stats") or [] if m.get("name") == model] or doc.get("model_stats") or []
    if not entries:
        raise ValueError(f"no statistics for model {model!r} in the reply")
    m = entries[0]
    batch_ns = dict.fromkeys(PHASES, 0)
    rows = 0
    for b in m.get("batch_stats") or []:
        for phase in PHASES:
            batch_ns[phase] += int((b.get(phase) or {}).get("ns", 0))
        rows += int(b.get("batch_size", 0)) * int((b.get("compute_infer") or {}).get("count", 0))
    return StatsSnapshot(
        inference_count=int(m.get("inference_count", 0)),
        execution_count=int(m.get("execution_count", 0)),
        queue_ns=int(((m.get("inference_stats") or {}).get("queue") or {}).get("ns", 0)),
        batch_ns=batch_ns,
        batch_rows=rows,
    )


class StatsReader:
    """Reads one model's statistics over HTTP (seqserve and Triton serve the same document)."""

    def __init__(self, http_url: str, model: str, timeout_s: float = 5.0) -> None:
        self.url = f"http://{http_url}/v2/models/{urllib.parse.quote(model, safe='')}/stats"
        self.model = model
        self.timeout_s = timeout_s

    def read(self) -> StatsSnapshot:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
            return parse(json.loads(resp.read()), self.model)


def window(before: StatsSnapshot, after: StatsSnapshot) -> dict[str, Any]:
    """What the model did between two snapshots (counts and ns), for the JSON."""
    return {
        "inference_count": after.inference_count - before.inference_count,
        "execution_count": after.execution_count - before.execution_count,
        "batch_rows": after.batch_rows - before.batch_rows,
        "queue_ns": after.queue_ns - before.queue_ns,
        **{f"{p}_ns": after.batch_ns[p] - before.batch_ns[p] for p in PHASES},
    }


def per_step(delta: dict[str, Any] | None, server_cpu_us_per_step: float | None) -> dict[str, Any]:
    """Per-step figures from a window's statistics: execute (compute_infer) per request the model
    served in the window, and the server's own cost per step = its CPU per measured step minus that.
    Empty when the window served nothing or the statistics were not read."""
    if not delta or delta["inference_count"] <= 0:
        return {}
    n = delta["inference_count"]
    execs = delta["execution_count"]
    exec_us = delta["compute_infer_ns"] / n / 1e3
    out: dict[str, Any] = {
        "model_inferences": n,
        "model_executions": execs,
        "mean_batch": n / execs if execs else None,
        "execute_us_per_step": exec_us,
        "compute_input_us_per_step": delta["compute_input_ns"] / n / 1e3,
        "compute_output_us_per_step": delta["compute_output_ns"] / n / 1e3,
        "execute_us_per_batch": delta["compute_infer_ns"] / execs / 1e3 if execs else None,
        "queue_us_per_step": delta["queue_ns"] / n / 1e3,
        "server_own_us_per_step": None if server_cpu_us_per_step is None else server_cpu_us_per_step - exec_us,
    }
    return out
