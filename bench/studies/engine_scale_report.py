"""The engine_scale study's text: one table per section (split, live, reap)."""

from __future__ import annotations

from typing import Any


def fmt_split(s: dict[str, Any]) -> str:
    rows = s["rows"]
    lines = [
        f"per-step cost split: Server.submit in process, Direct, {s['mbs']} slots, {s['sequences']} sequences in "
        f"a closed loop, {s['steps']} steps x {s['reps']} reps (medians), {rows:.2f} real rows per batch",
        f"  {'stage':<28}{'per batch us':>13}{'per step us':>13}  source",
    ]

    def row(stage: str, batch: float | None, step: float, src: str) -> None:
        b = "-" if batch is None else f"{batch:.2f}"
        lines.append(f"  {stage:<28}{b:>13}{step:>13.2f}  {src}")

    row("enqueue (Server.submit)", None, s["enqueue_us"], "own timestamps around submit()")
    row("queue wait", None, s["queue_us"], "stats queue: arrival -> batch formed (waits for the batch before)")
    row("batch assembly", s["assembly_batch_us"], s["assembly_batch_us"] / rows, "stats compute_input")
    row(
        "execute call (w/o model)",
        s["execute_call_batch_us"],
        s["execute_call_batch_us"] / rows,
        "stats compute_infer - model body",
    )
    row("  model body", s["model_body_batch_us"], s["model_body_batch_us"] / rows, "own timestamps in execute()")
    row("scatter", s["scatter_batch_us"], s["scatter_batch_us"] / rows, "stats compute_output")
    row(
        "completion, 1st of batch",
        s["completion_first_us"],
        s["completion_first_us"] / rows,
        "own: first caller of the batch resumes - model exit - scatter",
    )
    row(
        "completion, mean",
        None,
        s["completion_us"],
        "own: each caller resumes - model exit - scatter (callers resume one after another)",
    )
    lines.append(
        f"  latency submit->reply p50 {s['latency_p50_us']:.1f} us, p99 {s['latency_p99_us']:.1f} us; "
        f"{s['steps_per_s']:,.0f} steps/s; CPU {s['cpu_us_per_step']:.2f} us/step (all threads), "
        f"wall {s['wall_us_per_step']:.2f} us/step"
    )
    return "\n".join(lines)


def fmt_live(rows: list[dict[str, Any]]) -> str:
    hdr = (
        f"  {'layout':<7}{'N':>8}{'slots':>8}{'backlog':>8}{'open us/seq':>12}{'B/idle seq':>11}{'- state':>9}"
        f"{'py B/req':>9}"
        f"{'capacity MB':>12}{'base st/s':>11}{'idle st/s':>11}{'ratio':>7}{'base p99':>9}{'idle p99':>9}"
        f"{'rows':>6}{'reaper ms/s':>12}{'hand-off us':>12}"
    )
    lines = [
        "live sequences: N idle + active closed-loop ones; B/idle seq = RSS delta (model load + opening) / N; "
        "'- state' = that minus the state bytes; reaper ms/s = core non-executor thread CPU per second of an "
        "idle window; hand-off = END of a slot's sequence -> the backlog's first runs its START (p50); py B/req = "
        "Python-side bytes of a backlogged START request (tracemalloc; included in B/idle seq); st/s = median of "
        "0.2 s sub-windows; rows = real rows per batch, base/idle",
        hdr,
    ]
    for r in rows:
        ho = r.get("handoff_us") or {}
        py = f"{r['py_bytes_per_backlogged']:,.0f}" if r.get("py_bytes_per_backlogged") else "-"
        lines.append(
            f"  {r['layout']:<7}{r['n']:>8,}{r['slots']:>8,}{r['backlog']:>8,}{r['open_s'] / r['n'] * 1e6:>12.1f}"
            f"{r['bytes_per_idle']:>11,.0f}{r['bytes_per_idle'] - r['state_bytes']:>9,.0f}"
            f"{py:>9}"
            f"{r['capacity_bytes'] / 2**20:>12.1f}{r['base']['steps_per_s']:>11,.0f}"
            f"{r['with_idle']['steps_per_s']:>11,.0f}{r['with_idle']['steps_per_s'] / r['base']['steps_per_s']:>7.2f}"
            f"{r['base']['p99_us']:>9,.0f}{r['with_idle']['p99_us']:>9,.0f}"
            f"{r['base']['rows_per_batch']:>3.0f}/{r['with_idle']['rows_per_batch']:<2.0f}"
            f"{r['idle_cpu']['reaper_ms'] / r['idle_cpu']['window_s']:>12.2f}"
            f"{ho.get('p50', float('nan')):>12,.0f}"
        )
    return "\n".join(lines)


KIND_LABEL = {"none": "none expiring", "some": "some expiring", "backlog": "backlog past idle t/o"}


def fmt_reap(rows: list[dict[str, Any]]) -> str:
    lines = [
        "idle reaping: core non-executor thread (reaper) and process CPU over the window; 'some expiring': the "
        "expiring sequences time out inside the window, the N do not; 'backlog past idle t/o': Direct, 64 slots "
        "kept busy, N backlogged sequences older than the 2 s idle timeout (not reaped, re-checked); process "
        "CPU there includes the 64 keep-alive steps every 0.25 s",
        f"  {'layout':<7}{'kind':<22}{'N':>8}{'expired':>8}{'window s':>9}{'reaper ms':>10}{'reaper ms/s':>12}"
        f"{'us/expiry':>10}{'process ms/s':>13}",
    ]
    for r in rows:
        c = r["cpu"]
        exp = r.get("expired", 0)
        per = f"{c['reaper_ms'] * 1e3 / exp:.1f}" if exp else "-"
        lines.append(
            f"  {r['layout']:<7}{KIND_LABEL[r['kind']]:<22}{r['n']:>8,}{exp:>8,}{c['window_s']:>9.2f}"
            f"{c['reaper_ms']:>10.2f}{c['reaper_ms'] / c['window_s']:>12.2f}{per:>10}"
            f"{c['process_ms'] / c['window_s']:>13.2f}"
        )
    return "\n".join(lines)
