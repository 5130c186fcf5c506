"""Smoke tests of every bench entry point: a couple of seconds each with tiny settings, so CI
catches a broken bench. They spawn seqserve (or a floor server) on free loopback ports and check
that replies were verified with 0 wrong answers and 0 errors, and that JSON and a PNG were
written. What the bench needs here (tritonclient, matplotlib, granian) is in the `test` extra: a
missing one is an error, not a skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import granian  # noqa: F401
import matplotlib  # noqa: F401
import pytest
import tritonclient.grpc
import tritonclient.http  # noqa: F401

from tests.support.paths import DEMO_REPO

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--duration", "1", "--warmup", "0.3", "--pause", "0", "--quiet"]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return proc


def load_runs(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    runs = doc["runs"]
    assert runs
    for r in runs:
        assert r["steps"] > 0, r
        assert r["errors"] == 0 and r["wrong"] == 0 and r["stuck_workers"] == 0, r
    return runs


def test_closed_loop_all_transports(tmp_path: Path) -> None:
    out, png = tmp_path / "closed.json", tmp_path / "closed.png"
    run(
        "bench", "--spawn", "--concurrency", "1", "--transports", "http-binary,http-json,grpc-unary,grpc-stream",
        "--seq-len", "20", "--seq-len-jitter", "0.5", "--json", str(out), "--plot", str(png), *SHORT,
    )  # fmt: skip
    runs = load_runs(out)
    assert {r["transport"] for r in runs} == {"http-binary", "http-json", "grpc-unary", "grpc-stream"}
    assert all(r["verified"] and r["p99_9_ms"] > 0 for r in runs)
    for r in runs:  # the latency CDF the plot can be redrawn from
        cdf = r["cdf_ms"]
        assert len(cdf) == 105 and cdf == sorted(cdf) and cdf[50] == pytest.approx(r["p50_ms"], rel=0.05)
    assert png.stat().st_size > 1000
    again = tmp_path / "again.png"
    run("bench.loadgen.report", str(out), "--plot", str(again))
    assert again.stat().st_size > 1000


def test_replot_needs_the_cdf(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    doc = json.loads((ROOT / "bench" / "results" / "transports.json").read_text())
    for r in doc["runs"]:
        r.pop("cdf_ms", None)
    old.write_text(json.dumps(doc))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.loadgen.report", str(old), "--plot", str(tmp_path / "x.png")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "have no latency CDF" in proc.stderr


def test_paced_string_ids(tmp_path: Path) -> None:
    out = tmp_path / "paced.json"
    run(
        "bench", "--spawn", "--mode", "paced", "--period-ms", "10", "--streams", "1", "--transports", "grpc-stream",
        "--seq-len", "20", "--string-ids", "--json", str(out), *SHORT,
    )  # fmt: skip
    (r,) = load_runs(out)
    assert r["mode"] == "paced" and r["verified"] and r["streams"] == 1
    assert 0 <= r["streams_ok"] <= 1 and r["deadline_misses"] >= 0


def test_processes_floor_and_ceiling(tmp_path: Path) -> None:
    out = tmp_path / "multi.json"
    proc = run(
        "bench", "--spawn", "--processes", "2", "--concurrency", "2", "--transports", "grpc-stream",
        "--spawn-floor", "grpc-builtin", "--ceiling", "--json", str(out), *SHORT,
    )  # fmt: skip
    runs = load_runs(out)
    targets = {r["target"] for r in runs}
    assert targets == {"seqserve", "floor:grpc-builtin", "ceiling:grpc-builtin"}
    main = next(r for r in runs if r["target"] == "seqserve")
    assert main["verified"] and main["processes"] == 2 and main["concurrency"] == 2
    doc = json.loads(out.read_text())
    assert doc["floor_comparison"] and doc["floor_comparison"][0]["server_cpu_x_floor"] is not None
    assert "x floor" in proc.stdout


def test_data_file(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [[{"INPUT": [1.5]}, {"INPUT": [2.0]}, {"INPUT": [-4.0]}], [{"INPUT": 3}]]}))
    out = tmp_path / "data_out.json"
    run(
        "bench",
        "--spawn",
        "--concurrency",
        "2",
        "--transports",
        "grpc-unary",
        "--data",
        str(data),
        "--json",
        str(out),
        *SHORT,
    )
    (r,) = load_runs(out)
    assert r["verified"]


@pytest.mark.parametrize("floor", ["http-builtin", "http-hypercorn", "http-granian", "http-httptools"])
def test_http_floors(tmp_path: Path, floor: str) -> None:
    out = tmp_path / "floor.json"
    run(
        "bench",
        "--spawn-floor",
        floor,
        "--concurrency",
        "1",
        "--transports",
        "http-binary,http-json",
        "--json",
        str(out),
        *SHORT,
    )
    runs = load_runs(out)
    assert {r["target"] for r in runs} == {f"floor:{floor}"}


def test_grpc_unary_floors(tmp_path: Path) -> None:
    """The floors of bench/docs/front-ends.md's "gRPC unary: the floors of each way to serve it" answer
    the bench's gRPC unary runs (readiness, metadata, echoes) without an error."""
    out = tmp_path / "floors.json"
    run(
        "bench", "--spawn-floor", "grpc-sync,grpc-sync-handoff,grpc-h2", "--concurrency", "2",
        "--transports", "grpc-unary", "--no-verify", "--json", str(out), *SHORT,
    )  # fmt: skip
    runs = load_runs(out)
    assert {r["target"] for r in runs} == {"floor:grpc-sync", "floor:grpc-sync-handoff", "floor:grpc-h2"}
    assert all(r["steps"] > 0 and r["errors"] == 0 for r in runs)


def test_plot_needs_matplotlib_message(tmp_path: Path) -> None:
    # matplotlib is installed here: the bench runs with its import made to fail.
    no_mpl = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['bench', '--spawn', '--plot', {str(tmp_path / 'x.png')!r}]; "
        "runpy.run_module('bench', run_name='__main__')"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", no_mpl], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "matplotlib" in proc.stderr


def test_engine_bench(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    run(
        "bench.studies.engine", "--mbs", "8", "--depth", "1", "--sequences", "8", "--steps", "20", "--reps", "1",
        "--no-breakdown", "--json", str(out),
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert {r["path"] for r in doc["results"]} == {"(a) Server.infer", "(b) _core.Scheduler", "(c) floor"}


def test_engine_scale(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    run(
        "bench.studies.engine_scale", "--sections", "split,live,reap", "--split-steps", "200", "--reps", "1",
        "--counts", "300", "--reap-counts", "300", "--seconds", "0.4", "--alternations", "1", "--idle-window", "0.3",
        "--handoffs", "10", "--expiring", "50", "--json", str(out),
    )  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["split"]["steps_per_s"] > 0
    assert {r["layout"] for r in doc["live"]} == {"direct", "oldest"}
    assert all(r["base"]["steps_per_s"] > 0 and r["with_idle"]["steps_per_s"] > 0 for r in doc["live"])
    some = next(r for r in doc["reap"] if r["kind"] == "some")
    assert some["expired"] == 50


def test_shared_stream_completion_order(tmp_path: Path) -> None:
    # 32 sequences on one stream against the demo accumulator's 16 slots: in request order the
    # stream would stall behind a backlogged START; completion-order replies keep it moving.
    out = tmp_path / "order.json"
    run(
        "bench", "--spawn", "--transports", "grpc-stream", "--concurrency", "32", "--seq-len", "5",
        "--grpc-reply-order", "completion", "--json", str(out), *SHORT,
    )  # fmt: skip
    runs = load_runs(out)
    assert json.loads(out.read_text())["meta"]["grpc_reply_order"] == "completion"
    assert [r["transport"] for r in runs] == ["grpc-stream"]


def test_operate_bench() -> None:
    out = run("bench.studies.operate", "--reps", "2", "--live", "2000").stdout
    # one version of each demo model
    demos = sum(1 for d in DEMO_REPO.iterdir() if (d / "config.pbtxt").exists())
    assert f"scrape: {demos} model versions" in out, out
    assert "listing: 2000 live sequences" in out
    assert "2000 ended sessions remembered" in out
