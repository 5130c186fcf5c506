"""bench.studies.busy_workers (the engine's CPU per step under busy workers) with tiny settings,
against the bench's model and against one that answers wrong sums, which seqload must count."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import golang
from tests.support.paths import ROOT
from tests.support.tools import unavailable

BENCH_MODEL = ROOT / "bench" / "models" / "accumulator_oldest_1024"
NOT_A_SUM = """
from seqserve.engine import ExecuteBatch


class Model:
    def execute(self, batch: ExecuteBatch):
        value = batch.inputs["INPUT"]  # answers the step's input, not the running sum
        return {"OUTPUT": value, "SUM_OUT": value}
"""


@pytest.fixture(scope="module")
def seqload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return golang.build(golang.SEQLOAD_SOURCE, tmp_path_factory.mktemp("seqload"))
    except golang.ToolchainMissing as e:
        unavailable(str(e))
        raise


def run_study(seqload: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.studies.busy_workers", "--seqload", str(seqload), "--workers", "2",
         "--sequences", "4", "--reps", "1", "--seconds", "1.5", "--warmup", "0.5", "--json", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def test_study_measures_the_engine_and_the_workers(seqload: Path, tmp_path: Path) -> None:
    out = tmp_path / "busy.json"
    proc = run_study(seqload, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["medians"]
    assert (row["workers"], row["sequences"], row["wrong"], row["errors"]) == (2, 4, 0, 0)
    assert row["steps_per_s"] > 0 and row["mean_batch"] >= 1
    assert row["engine_us_per_step"] > 0 and row["workers_us_per_step"] > 0
    assert row["engine_us_per_step_by_thread"]["seqserve-drain"] > 0  # ring batches run on the drain thread
    assert "engine us/step" in proc.stdout


def test_wrong_sums_are_counted_and_fail_the_study(seqload: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model = repo / BENCH_MODEL.name
    shutil.copytree(BENCH_MODEL, model)
    for script in (model / "1").glob("*.py"):
        script.write_text(NOT_A_SUM)
    out = tmp_path / "busy.json"
    proc = run_study(seqload, out, "--model-repository", str(repo))
    assert proc.returncode == 1, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["medians"]
    assert row["wrong"] > 0
