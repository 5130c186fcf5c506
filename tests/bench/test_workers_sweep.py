"""The worker-process sweep (bench/docs/workers.md): tools/workers_sweep.sh at a tiny scale with
one worker (the server's default, so it runs on any seqserve), the CPU split by process kind, and
the bench's checks of --workers. No timing is asserted: these are not performance claims."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.loadgen.cli import main as bench_main
from bench.loadgen.cpu import ProcessTreeCpu, split_delta
from bench.loadgen.sweep import format_sweep, rejected_message, server_flags, sweep_rows
from tests.support.paths import ROOT


def test_the_sweep_script_at_tiny_scale(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        WORKERS="1",
        LOADS="2",
        PROCESSES="2",
        CHANNELS="2",
        DURATION="0.5",
        WARMUP="0.2",
    )
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "workers_sweep.sh"), str(tmp_path / "out")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = tmp_path / "out"
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{(out / 'sweep.txt').read_text()}"
    doc = json.loads((out / "workers_sweep.json").read_text())
    rows = doc["workers_sweep"]
    assert {r["transport"] for r in rows} == {"grpc-stream", "grpc-unary", "http-binary"}
    for r in rows:
        assert r["workers"] == 1 and r["concurrency"] == 2, r
        assert r["errors"] == 0 and r["wrong"] == 0 and r["steps_per_s"] > 0, r
        assert r["x_first"] == pytest.approx(1.0)
        assert r["engine_cpu_us_per_step"] is not None and r["workers_cpu_us_per_step"] is not None, r
    assert all(run["verified"] and run["workers"] == 1 for run in doc["runs"])
    assert doc["meta"]["workers"] == [1] and doc["meta"]["grpc_channels"] == 2
    assert "the worker sweep" in (out / "summary.txt").read_text()


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"
ROOT_PROCESS = f"""
import subprocess, sys
for _ in sys.stdin:
    subprocess.run([sys.executable, "-c", {BURN!r}], check=True)
    print("done", flush=True)
"""


def test_the_children_cpu_is_the_workers() -> None:
    """A child that burns 0.3 s of CPU and is reaped during the window counts as the workers'
    time, not the engine's (the root's own)."""
    root = subprocess.Popen(
        [sys.executable, "-c", ROOT_PROCESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert root.stdin is not None and root.stdout is not None
    try:
        tree = ProcessTreeCpu(root.pid)
        before = tree.sample()
        root.stdin.write("go\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == "done"
        after = tree.sample()
    finally:
        root.stdin.close()
        root.wait(timeout=30)
    engine, workers = split_delta(before, after)
    assert engine is not None and workers is not None
    assert workers >= 0.25, (engine, workers)  # one clock tick of slack
    assert engine < workers
    assert split_delta(None, after) == (None, None)


def test_one_worker_goes_without_the_flag() -> None:
    assert server_flags(None) == [] and server_flags(1) == []
    assert server_flags(4) == ["--workers", "4"]


def test_a_server_without_workers_gets_a_clear_line() -> None:
    log = "seqserve: error: unrecognized arguments: --workers 2"
    line = rejected_message(log, 2)
    assert line is not None and "does not accept `serve --workers 2`" in line
    assert rejected_message("model not found", 2) is None
    assert rejected_message(log, 1) is None  # one worker is never passed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "2"], "give --spawn"),
        (["--spawn", "--workers", "2", "--workers-sweep", "1,2"], "exclusive"),
        (["--spawn", "--workers", "0"], "must be >= 1"),
        (["--spawn", "--workers-sweep", "1,2", "--ceiling"], "seqserve only"),
        (["--spawn", "--server-arg=--workers=2"], "not as --server-arg"),
    ],
)
def test_workers_options_are_checked(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        bench_main(argv)


def test_sweep_rows_compare_with_the_first_setting() -> None:
    def row(workers: int, steps: float) -> dict[str, object]:
        return {
            "transport": "grpc-stream", "mode": "closed", "concurrency": 256, "workers": workers,
            "steps_per_s": steps, "p50_ms": 1.0, "p99_ms": 2.0, "server_cpu_us_per_step": 90.0,
            "engine_cpu_us_per_step": 8.0, "workers_cpu_us_per_step": 82.0, "server_cpu_util": 1.0,
            "server_nprocs": workers + 1, "errors": 0, "wrong": 0,
        }  # fmt: skip

    rows = sweep_rows([row(1, 1000.0), row(2, 1900.0), {"transport": "x", "workers": None}])
    assert [r["x_first"] for r in rows] == [1.0, 1.9]
    table = format_sweep(rows)
    assert "1.90x" in table and "engine us/step" in table
