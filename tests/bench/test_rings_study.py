"""The rings study (bench/studies/rings.py) runs with tiny settings, so that CI catches a broken
study; its figures come from the full run in bench/results/rings.txt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rings_study_runs(tmp_path: Path) -> None:
    out = tmp_path / "rings.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.rings", "--records", "20000", "--paced-records", "400",
         "--trips", "200", "--reps", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert all(row["ok"] and row["records_per_s"] > 0 for row in doc["throughput"] + doc["paced"])
    assert doc["round_trip"]["median_us"] > 0
    assert "round trip through Python" in proc.stdout
    assert all(doc["python"][f"copy_{way}_ns"] > 0 for way in ("in_view", "in_write", "out_view", "out_read"))


def test_rings_study_python_only(tmp_path: Path) -> None:
    out = tmp_path / "copies.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.rings", "--python-only", "--records", "20000", "--reps", "1",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["python"]["copy_in_write_ns"] > 0
    assert "an FP32 [1, 1] tensor into a block" in proc.stdout
