"""Triton's own `qa/L0_sequence_batcher/sequence_batcher_test.py`, unmodified, against
`seqserve serve`: BACKENDS=onnx ENSEMBLES=1, so every case runs on the onnx sequence models and
on their `simple_`, `sequence_` and `fan_` ensembles (tests/support/ensemble_models.py), over
HTTP, gRPC and the gRPC stream, with Triton's expectations (results, errors, statistics,
batching when the scheduler is held by TRITONSERVER_DELAY_SCHEDULER).

Triton's five files are cached byte for byte in tests/data/triton_qa/L0_sequence_batcher (see
tests/data/triton_qa/README.md for the commit and licence). Each case runs as test.sh runs it: a
fresh server on the case's repository, the variables test.sh exports for it, the unittest's exit
status and test_results.txt checked (tests/support/triton_l0.py has the table).

Triton's client code hard-codes ports 8000 and 8001. Each case therefore runs in its own private
network namespace (`unshare -rn`: a user and a network namespace, no root needed), with only a
loopback device: the server binds the fixed ports there, where they cannot collide with a server
the user runs, nor with another test. Where the kernel refuses such namespaces the test skips and
says why, except under CI=true, where it fails.

Cost (two loaded cores): all 24 cases take about 4 minutes, mostly server starts and the
cases' own waits. Every run (CI included) runs 22 of them in 2.5 to 3 minutes; the two slowest
(`SLOW_CASES`, 90 s together) run with SEQSERVE_TRITON_L0=all.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="the QA models are built with onnx")
pytest.importorskip("onnxruntime", reason="the QA models run on onnxruntime")
pytest.importorskip("tritonclient.grpc", reason="Triton's test is a tritonclient program")

from tests.support.paths import ROOT
from tests.support.tools import in_ci
from tests.support.triton_l0 import CASES, REPOSITORIES, RUNNER_TIMEOUT_S, Case, install_qa_files

#: Run under SEQSERVE_TRITON_L0=all only: most of their 90 s is waiting out 5 s idle timeouts
#: (test_ensembles.py checks a shortened sequence timeout through an ensemble in every run)
SLOW_CASES = {"test_backlog_fill_no_end", "test_backlog_sequence_timeout"}
NAMESPACE = ["unshare", "--user", "--map-root-user", "--net"]

pytestmark = pytest.mark.timeout(int(RUNNER_TIMEOUT_S) + 60)


def _namespace_refused() -> str | None:
    """Why a private network namespace with a loopback is not available here, or None."""
    if shutil.which("unshare") is None:
        return "unshare is not on PATH (util-linux)"
    probe = subprocess.run(
        [*NAMESPACE, sys.executable, "-c", "from tests.support.triton_l0 import loopback_up; loopback_up()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        return f"`unshare -rn` with a loopback is refused here (kernel policy?): {probe.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="module")
def l0_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    """The three repositories and Triton's files, built once for every case."""
    refused = _namespace_refused()
    if refused:
        if in_ci():
            pytest.fail(f"CI=true but {refused}: Triton's L0 cases need a private network namespace")
        pytest.skip(refused)
    root = tmp_path_factory.mktemp("triton-l0")
    repos = {repo.name: repo.build(root / "models") for repo in REPOSITORIES}
    return repos, install_qa_files(root)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_triton_l0_case(case: Case, l0_tree: tuple[dict[str, Path], Path]) -> None:
    if case.test in SLOW_CASES and os.environ.get("SEQSERVE_TRITON_L0") != "all":
        pytest.skip("a slow case: SEQSERVE_TRITON_L0=all runs it")
    repos, test_dir = l0_tree
    log_dir = test_dir.parent.parent / "logs" / case.id
    log_dir.mkdir(parents=True)
    python_path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **case.env(), "PYTHONPATH": python_path}
    runner = [sys.executable, "-m", "tests.support.triton_l0", case.test]
    runner += ["--repo", str(repos[case.repository.name]), "--test-dir", str(test_dir)]
    runner += ["--log-dir", str(log_dir)]
    with subprocess.Popen(
        [*NAMESPACE, *runner],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a timeout ends the runner and its server together
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=RUNNER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
    if proc.returncode != 0:
        logs = "\n".join(
            f"--- {path.name} (tail)\n{path.read_text(errors='replace')[-6000:]}" for path in sorted(log_dir.iterdir())
        )
        pytest.fail(
            f"Triton's SequenceBatcherTest.{case.test} on {case.repository.name} exited {proc.returncode}\n"
            f"{output}\n{logs}"
        )
