"""The in-process studies under bench/studies run with tiny settings, so that CI catches a broken
study (their figures come from the full runs documented in bench/docs)."""

from __future__ import annotations

import sys
from pathlib import Path


def test_isolation_bench_runs(tmp_path: Path) -> None:
    """The bench with tiny settings, so that CI catches a broken bench."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "iso.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.isolation", "--batches", "200", "--reps", "1", "--steps", "50",
         "--roundtrips", "200", "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [r["case"] for r in doc["execute"]] == ["small, B=1", "small, B=8", "1 MiB state, B=1"]
    assert all(r["process_median_us"] > 0 for r in doc["execute"])
    assert "added p50" in proc.stdout


def test_h2_flood_study_runs() -> None:
    """bench.studies.h2_flood with one-second phases: a server, a flood, the steps beside it."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.h2_flood", "--duration", "1", "--connections", "1"],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "quiet" in proc.stdout and "flooded" in proc.stdout and "frames written" in proc.stdout


def test_gpu_bench_runs_on_the_cpu_path(tmp_path: Path) -> None:
    """bench.studies.gpu's CPU half (the GPU half runs in tools/gpu_check.sh on a GPU machine)."""
    import json
    import subprocess

    from tests.support.checks import import_torch

    import_torch()
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.gpu", "--cpu-only", "--seconds", "0.3", "--counts", "1,2",
         "--out", str(tmp_path)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_bench.json").read_text())
    assert [(r["model"], r["sequences"]) for r in doc["lstm"]] == [("lstm_cpu", 1), ("lstm_cpu", 2)]
    assert all(r["steps_per_s"] > 0 for r in doc["lstm"])


def test_stream_flood_study_runs() -> None:
    """The stream flood study with a tiny flood, against a real server. The floods are cut at 20 s:
    the backlogged STARTs' replies trickle in one idle timeout (5 s) after another, and the
    refusals, all the test reads, come at once."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.stream_flood", "--starts", "2000", "--seconds", "20",
         "--never-read-seconds", "2", "--warm-up", "20"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    reads, never = (json.loads(line) for line in proc.stdout.splitlines())
    assert reads["client"] == "reads" and reads["refusals"] > 0 and reads["http_start"]["status"] == 503
    assert never["client"] == "never reads" and never["replies"] == 0
