"""The side-by-side bench (``python -m bench.vs_triton``, issue 14) and ``--model-stats``.

The mode runs here briefly against seqserve alone; against the real Triton only where the
development environment's anchor (../shared/anchors/triton) is installed, otherwise that test
skips and says why. Starting Triton must fail clearly and leave nothing running: a fake anchor
script checks that without Triton, and that the bench hands it a temporary repository whose model has
as many instances as seqserve's, removed at exit. The summaries (alternation, medians, ratios) and the
statistics arithmetic are checked on synthetic data."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.loadgen.model_stats import parse, per_step, window
from bench.vs_triton import sbs_report
from bench.vs_triton.anchor import anchor_problem, default_script
from bench.vs_triton.repo import RepoProblem, instance_count, read_config, repo_with_instances, with_instances
from bench.vs_triton.side_by_side import instances_option, plan
from seqserve._proto import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[2]
SHORT = ["--duration", "0.6", "--warmup", "0.2", "--pause", "0", "--seq-len", "5", "--concurrency", "2"]


def bench(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout
    )  # fmt: skip


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    tails = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{tails}"
    return proc


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_plan_alternates_who_goes_first() -> None:
    runs = plan(2, ["grpc-stream", "http-binary"], [16], ["seqserve", "Triton"])
    firsts = [runs[i][3] for i in range(0, len(runs), 2)]
    assert firsts == ["seqserve", "Triton", "seqserve", "Triton"]
    assert [r[:3] for r in runs[:2]] == [(1, "grpc-stream", 16)] * 2 and runs[-1][0] == 2


def _row(target: str, rnd: int, cpu: float, p99: float, **kw: Any) -> dict[str, Any]:
    return {"target": target, "round": rnd, "transport": "grpc-stream", "concurrency": 16, "steps": 100,
            "errors": 0, "wrong": 0, "stuck_workers": 0, "verified": True, "server_cpu_us_per_step": cpu,
            "p50_ms": 1.0, "p99_ms": p99, "p99_non_start_ms": p99, "steps_per_s": 1000.0, **kw}  # fmt: skip


def test_summary_medians_spread_and_ratios() -> None:
    rows = [_row("seqserve", 1, 100, 5), _row("Triton", 1, 200, 50), _row("seqserve", 2, 150, 6),
            _row("Triton", 2, 200, 40), _row("seqserve", 3, 120, 7), _row("Triton", 3, 100, 60)]  # fmt: skip
    s = sbs_report.summarize(rows, ["grpc-stream"], [16], ["seqserve", "Triton"])
    (case,) = s["cases"]
    cpu = case["sides"]["seqserve"]["server_cpu_us_per_step"]
    assert (cpu["median"], cpu["min"], cpu["max"], cpu["n"]) == (120, 100, 150, 3)
    ratio = case["ratios"]["server_cpu_us_per_step"]
    assert ratio["per_round"] == [0.5, 0.75, 1.2] and ratio["median"] == 0.75  # per round, not of the medians
    assert s["checks_ok"]
    lines = sbs_report._table(s, ["seqserve", "Triton"], {"seqserve": "seqserve", "Triton": "Triton 2.51.0"})
    assert "| gRPC stream | 120 us (100-150) | 200 us (100-200) | 0.75x (0.50-1.20) | <= 0.60x (missed) |" in lines
    assert any(line.startswith("| p99, gRPC stream |") and "(met)" in line for line in lines)
    rows[2]["wrong"] = 1
    bad = sbs_report.summarize(rows, ["grpc-stream"], [16], ["seqserve", "Triton"])
    assert not bad["checks_ok"] and "1 wrong" in bad["check_failures"][0]


def _stats(count: int, execs: int, infer_ns: int) -> dict[str, Any]:
    d = {"count": execs, "ns": infer_ns}
    batch = {"batch_size": 2, "compute_input": d, "compute_infer": d, "compute_output": d}
    return {"model_stats": [{"name": "m", "version": "1", "inference_count": count, "execution_count": execs,
            "inference_stats": {"queue": {"count": count, "ns": 7 * count}}, "batch_stats": [batch]}]}  # fmt: skip


def test_model_stats_window_and_overhead() -> None:
    before, after = parse(_stats(10, 5, 1000), "m"), parse(_stats(110, 55, 401000), "m")
    delta = window(before, after)
    assert delta["inference_count"] == 100 and delta["execution_count"] == 50 and delta["batch_rows"] == 100
    figs = per_step(delta, server_cpu_us_per_step=300.0)
    # 400 us of execute over 100 requests: 4 us per step; batches count once, not once per request
    assert figs["execute_us_per_step"] == pytest.approx(4.0)
    assert figs["server_own_us_per_step"] == pytest.approx(296.0)
    assert figs["mean_batch"] == 2 and figs["execute_us_per_batch"] == pytest.approx(8.0)
    assert per_step(window(before, before), 300.0) == {}


def test_model_stats_option(tmp_path: Path) -> None:
    out = tmp_path / "stats.json"
    proc = ok(bench("bench", "--spawn", "--transports", "grpc-stream", "--model-stats", "--quiet", "--json",
                    str(out), *SHORT))  # fmt: skip
    (r,) = json.loads(out.read_text())["runs"]
    assert r["model_stats"]["inference_count"] > 0 and r["execute_us_per_step"] > 0
    assert r["server_own_us_per_step"] == pytest.approx(r["server_cpu_us_per_step"] - r["execute_us_per_step"])
    assert "srv excl. execute us/step" in proc.stdout


def test_side_by_side_seqserve_alone(tmp_path: Path) -> None:
    out = tmp_path / "sbs.json"
    proc = ok(bench("bench", "--vs-triton", "--no-triton", "--rounds", "2", "--transports", "grpc-stream,http-binary",
                    "--json", str(out), "--quiet", *SHORT))  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["summary"]["checks_ok"] and len(doc["runs"]) == 4
    assert sorted((r["round"], r["transport"]) for r in doc["runs"]) == [
        (1, "grpc-stream"), (1, "http-binary"), (2, "grpc-stream"), (2, "http-binary")]  # fmt: skip
    assert all(r["verified"] and r["execute_us_per_step"] > 0 for r in doc["runs"])
    assert doc["meta"]["servers"]["seqserve"]["slots"] == 16
    assert "| gRPC stream | " in proc.stdout and "checks: 0 wrong answers, 0 errors" in proc.stdout
    assert not alive(doc["meta"]["servers"]["seqserve"]["pid"])


def test_side_by_side_paced(tmp_path: Path) -> None:
    """--mode paced: every sequence sends a step every --period-ms, whatever the server does."""
    out = tmp_path / "paced.json"
    proc = ok(bench("bench.vs_triton", "--no-triton", "--rounds", "1", "--transports", "grpc-stream",
                    "--mode", "paced", "--period-ms", "10", "--json", str(out), "--quiet", *SHORT))  # fmt: skip
    doc = json.loads(out.read_text())
    (r,) = doc["runs"]
    assert (r["mode"], r["period_ms"]) == ("paced", 10.0) and r["verified"]
    # 2 streams (SHORT's --concurrency) x 100 steps/s over the measured 0.6 s: the schedule, not the server
    assert 90 <= r["steps"] <= 150, r["steps"]
    assert (doc["meta"]["mode"], doc["meta"]["period_ms"]) == ("paced", 10.0)
    assert "paced (each sequence sends one step every 10 ms" in proc.stdout


def test_missing_anchor_fails_clearly(tmp_path: Path) -> None:
    proc = bench("bench.vs_triton", "--triton-script", str(tmp_path / "nope.sh"), *SHORT)
    assert proc.returncode == 2 and "no Triton anchor at" in proc.stderr


ANCHOR_CONFIG = """name: "accum_py"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""  # the anchor's accum_py config, as in ../shared/anchors/triton/models


def anchor_repo(root: Path) -> Path:
    repo = root / "models"
    (repo / "accum_py" / "1" / "__pycache__").mkdir(parents=True)
    (repo / "accum_py" / "config.pbtxt").write_text(ANCHOR_CONFIG)
    (repo / "accum_py" / "1" / "model.py").write_text("# the model\n")
    (repo / "accum_py" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"stale")
    return repo


def test_instance_count_and_option() -> None:
    assert instance_count(mc.ModelConfig()) == 1  # Triton makes one instance when none is configured
    two_groups = mc.ModelConfig(instance_group=[mc.ModelInstanceGroup(count=2), mc.ModelInstanceGroup(count=3)])
    assert instance_count(two_groups) == 5
    assert instances_option("match") == "match" and instances_option("3") == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            instances_option(bad)
    with pytest.raises(ValueError):
        with_instances(mc.ModelConfig(), 0)


def test_repo_copy_sets_the_instances_and_is_removed(tmp_path: Path) -> None:
    src = anchor_repo(tmp_path)
    before = read_config(src / "accum_py" / "config.pbtxt")
    with repo_with_instances(src, "accum_py", 2) as repo:
        assert repo != src and repo.is_dir()
        cfg = read_config(repo / "accum_py" / "config.pbtxt")
        assert [(g.count, g.kind) for g in cfg.instance_group] == [(2, mc.ModelInstanceGroup.KIND_CPU)]
        # every other field as in the anchor's config
        cfg.ClearField("instance_group")
        before.ClearField("instance_group")
        assert cfg == before and cfg.sequence_batching.HasField("direct") and cfg.max_batch_size == 8
        assert [c.name for c in cfg.sequence_batching.control_input] == ["START", "READY", "CORRID"]
        assert (repo / "accum_py" / "1" / "model.py").read_text() == "# the model\n"
        assert not (repo / "accum_py" / "1" / "__pycache__").exists()
        top = repo.parent
    assert not top.exists(), "the temporary repository was left behind"
    assert (src / "accum_py" / "config.pbtxt").read_text() == ANCHOR_CONFIG  # the anchor is never touched
    with pytest.raises(KeyboardInterrupt), repo_with_instances(src, "accum_py", 3) as repo:
        top = repo.parent
        raise KeyboardInterrupt
    assert not top.exists()
    with pytest.raises(RepoProblem, match="cannot read the model config"), repo_with_instances(src, "nope", 2):
        pass
    (src / "accum_py" / "config.pbtxt").write_text("max_batch_size: eight\n")
    with pytest.raises(RepoProblem, match="not a valid model config"), repo_with_instances(src, "accum_py", 2):
        pass


def _fake_anchor(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A start script that records the repository it was given (and that repository's accum_py config),
    then launches a server which never gets ready (as the real one exits 1 after 30 s)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    anchor_repo(tmp_path)
    script = tmp_path / "start.sh"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$3" > {tmp_path}/repo_arg\n'
        f'if [ -n "$3" ]; then cp "$3/accum_py/config.pbtxt" {tmp_path}/seen.pbtxt; fi\n'
        f'echo "model failed to load" > "$ANCHOR_LOG"\n'
        f"setsid sleep 300 & echo $!; echo $! > {tmp_path}/pid\n"
        'echo "triton did not become ready" >&2; exit 1\n'
    )
    return script, {"ANCHOR_VENV": str(venv.parent)}


def _assert_stopped(pidfile: Path) -> None:
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the server the script started was left running")


def test_triton_that_does_not_start_is_stopped(tmp_path: Path) -> None:
    """The bench says why Triton did not start, exits 2, and ends the process the script left running.
    By default it hands the script a temporary copy of the repository in which accum_py has as many
    instances as seqserve's accumulator (2), and removes it."""
    script, env = _fake_anchor(tmp_path)
    proc = bench("bench.vs_triton", "--triton-script", str(script), *SHORT, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Triton did not start" in proc.stderr and "triton did not become ready" in proc.stderr
    assert "model failed to load" in proc.stderr  # the log's tail
    assert "instance_group count set to 2 (configured: 1) to match seqserve's model" in proc.stderr
    _assert_stopped(tmp_path / "pid")
    repo = Path((tmp_path / "repo_arg").read_text().strip())
    assert repo.name == "models" and repo.parent != tmp_path
    assert not repo.parent.exists(), "the temporary repository was left behind"
    seen = read_config(tmp_path / "seen.pbtxt")
    assert [(g.count, g.kind) for g in seen.instance_group] == [(2, mc.ModelInstanceGroup.KIND_CPU)]


def test_triton_instances_1_keeps_the_anchor_config(tmp_path: Path) -> None:
    script, env = _fake_anchor(tmp_path)
    proc = bench("bench.vs_triton", "--triton-script", str(script), "--triton-instances", "1", *SHORT, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "1 instance(s) as configured in" in proc.stderr
    assert (tmp_path / "repo_arg").read_text().strip() == ""  # the script's own repository
    _assert_stopped(tmp_path / "pid")


@pytest.mark.skipif(anchor_problem(default_script()) is not None, reason=f"{anchor_problem(default_script())}")
def test_side_by_side_with_triton(tmp_path: Path) -> None:
    out = tmp_path / "sbs.json"
    proc = ok(bench("bench.vs_triton", "--rounds", "1", "--transports", "grpc-stream", "--json", str(out),
                    "--quiet", *SHORT))  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["summary"]["checks_ok"]
    assert {r["target"] for r in doc["runs"]} == {"seqserve", "Triton"}
    (case,) = doc["summary"]["cases"]
    assert case["ratios"]["server_cpu_us_per_step"]["median"] > 0
    servers = doc["meta"]["servers"]
    assert servers["Triton"]["version"].startswith("2.")
    # as many slots as seqserve's accumulator (2 instances x 8), on a temporary copy removed at exit
    assert servers["Triton"]["instances"] == servers["seqserve"]["instances"] == 2
    assert servers["Triton"]["slots"] == servers["seqserve"]["slots"] == 16
    assert not Path(servers["Triton"]["repository"]).exists()
    assert "seqserve accumulator 16 slots" in proc.stdout and "accum_py 16 slots" in proc.stdout
    assert "| gRPC stream | " in proc.stdout
    for side in ("seqserve", "Triton"):
        assert not alive(doc["meta"]["servers"][side]["pid"]), f"{side} left running"


def test_slots_line() -> None:
    infos = {
        "seqserve": {"model": "accumulator", "slots": 16, "instances": 2, "max_batch_size": 8},
        "Triton": {"version": "2.51.0", "model": "accum_py", "slots": 16, "instances": 2, "max_batch_size": 8,
                   "instances_how": "instance_group count set to 2"},
    }  # fmt: skip
    assert sbs_report.slots_line(infos) == (
        "Models: seqserve accumulator 16 slots (2 instances x max_batch_size 8), Triton 2.51.0 accum_py 16 slots "
        "(2 instances x max_batch_size 8; instance_group count set to 2)."
    )
