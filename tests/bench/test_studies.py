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


def test_stream_flood_study_runs() -> None:
    """The stream flood study with a tiny flood, against a real server."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.stream_flood", "--starts", "2000", "--seconds", "120",
         "--never-read-seconds", "3", "--warm-up", "300"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    reads, never = (json.loads(line) for line in proc.stdout.splitlines())
    assert reads["client"] == "reads" and reads["refusals"] > 0 and reads["http_start"]["status"] == 503
    assert never["client"] == "never reads" and never["replies"] == 0
