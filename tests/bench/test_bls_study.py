"""bench.studies.bls with tiny settings, so that CI catches a broken study (its figures come from
the full run in bench/results/bls.txt)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bls_study_runs(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "bls.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.studies.bls", "--steps", "6", "--warmup", "2", "--sequences", "1,2",
         "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [(r["model"], r["sequences"]) for r in doc["rows"]] == [
        (model, n) for n in (1, 2) for model in ("accumulator", "bls_triton", "bls_async", "bls_batch")
    ]
    assert all(r["median_us"] > 0 for r in doc["rows"])
    assert "added us" in proc.stdout
