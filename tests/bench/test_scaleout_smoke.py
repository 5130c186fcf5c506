"""Smoke test of bench/scaleout/run.py: one replica behind HAProxy with the Redis store for a
second, and the rolling-restart report's shape, so that CI catches a broken bench. Needs
redis-server and haproxy (skips without them, fails under CI=true like test_scaleout.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scaleout.cluster import missing_tools

ROOT = Path(__file__).resolve().parents[2]


def test_scaleout_bench_runs(tmp_path: Path) -> None:
    if missing := missing_tools():
        why = f"{' and '.join(missing)} not on PATH"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    out_file = tmp_path / "scaleout.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scaleout", "--replicas", "1", "--sessions", "4", "--steps", "10",
         "--duration", "1", "--warmup", "0.3", "--no-restart", "--out", str(out_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = out_file.read_text()
    rows = {
        m.group(1): m.groups()[1:]
        for m in re.finditer(r"^(1 replica, \w+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+(\d+)$", report, re.M)
    }
    assert set(rows) == {"1 replica, direct", "1 replica, HAProxy"}, report
    for steps_per_s, failed in rows.values():
        assert int(steps_per_s) > 0 and int(failed) == 0, report
