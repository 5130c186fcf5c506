"""Triton's `qa/L0_sequence_batcher` run unmodified against `seqserve serve`: the cases and the
environment test.sh gives each, the three model repositories, and the runner of one case.

The runner (`python -m tests.support.triton_l0 ...`) runs inside a private network namespace
(`unshare -rn`), where Triton's client code may use the fixed ports it hard-codes (8000, 8001):
they belong to that namespace alone. It brings `lo` up (no iproute2 needed), starts a fresh server with the case's
environment (test.sh starts one per case), runs the case and checks the result file test.sh
checks; its exit status is the case's.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support import onnx_models as fx
from tests.support.ensemble_models import sequence_ensembles
from tests.support.paths import TESTS

#: Triton's five files, stored as .txt (tests/data/triton_qa/README.md)
QA_FILES = TESTS / "data" / "triton_qa" / "L0_sequence_batcher"

#: The ports sequence_util.py hard-codes (and the metrics port Triton defaults to)
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1  # linux/sockios.h, linux/if.h
READY_TIMEOUT_S = 90.0
CASE_TIMEOUT_S = 240.0
#: the whole runner: a server start, the case, the server's exit
RUNNER_TIMEOUT_S = READY_TIMEOUT_S + CASE_TIMEOUT_S + 60

#: What test.sh exports for every case of this run: the onnx models and their ensembles
COMMON_ENV = {
    "BACKENDS": "onnx",
    "ENSEMBLES": "1",
    "IMPLICIT_STATE": "0",
    "INITIAL_STATE_FILE": "0",
    "BATCHER_TYPE": "FIXED",
}


@dataclass(frozen=True)
class Repository:
    """A model repository of the run and the variables test.sh sets for its model trial."""

    name: str
    max_batch: int
    no_batching: int
    model_instances: int

    def build(self, root: Path) -> Path:
        """The onnx sequence models (int32 and bool controls), the three int32 ensembles and the
        nop model, as Triton's QA generators write them."""
        repo = root / self.name
        repo.mkdir(parents=True, exist_ok=True)
        sequence_ensembles(repo, "int32", self.max_batch)
        fx.sequence_model(repo, "bool", self.max_batch)
        return repo


FIXED = Repository("fixed", max_batch=8, no_batching=0, model_instances=1)
NO_BATCHING = Repository("nobatch", max_batch=0, no_batching=1, model_instances=4)
ONE_INSTANCE = Repository("one_instance", max_batch=4, no_batching=0, model_instances=1)  # models1
REPOSITORIES = (FIXED, NO_BATCHING, ONE_INSTANCE)


@dataclass(frozen=True)
class Case:
    """One `SequenceBatcherTest.<test>` run on a fresh server over one repository."""

    test: str
    repository: Repository
    delay: int = 0  # TRITONSERVER_DELAY_SCHEDULER (0: unset)
    backlog_delay: int = 0  # TRITONSERVER_BACKLOG_DELAY_SCHEDULER

    @property
    def id(self) -> str:
        return f"{self.repository.name}-{self.test}"

    def env(self) -> dict[str, str]:
        """The variables test.sh exports for this case (the server and the client both see them)."""
        env = dict(COMMON_ENV)
        env["NO_BATCHING"] = str(self.repository.no_batching)
        env["MODEL_INSTANCES"] = str(self.repository.model_instances)
        if self.delay:
            env["TRITONSERVER_DELAY_SCHEDULER"] = str(self.delay)
            env["TRITONSERVER_BACKLOG_DELAY_SCHEDULER"] = str(self.backlog_delay)
        return env


NO_DELAY_TESTS = (
    "test_simple_sequence",
    "test_length1_sequence",
    "test_batch_size",
    "test_no_correlation_id",
    "test_no_sequence_start",
    "test_no_sequence_start2",
    "test_no_sequence_end",
)
#: test.sh's DELAY_TESTS with its (TRITONSERVER_DELAY_SCHEDULER, ..._BACKLOG_DELAY_SCHEDULER)
DELAY_TESTS = {
    "test_half_batch": (8, 0),
    "test_skip_batch": (12, 0),
    "test_full_batch": (12, 0),
    "test_backlog": (12, 0),
    "test_backlog_fill": (10, 2),
    "test_backlog_fill_no_end": (10, 3),
    "test_backlog_same_correlation_id": (12, 2),
    "test_backlog_same_correlation_id_no_end": (16, 0),
    "test_backlog_sequence_timeout": (4, 0),
    "test_ragged_batch": (12, 0),
}
CASES = (
    *(Case(test, repo) for repo in (FIXED, NO_BATCHING) for test in NO_DELAY_TESTS),
    *(Case(test, ONE_INSTANCE, delay, backlog) for test, (delay, backlog) in DELAY_TESTS.items()),
)


def install_qa_files(root: Path) -> Path:
    """Triton's files under `root/qa` as Triton lays them out; returns the test's folder (the
    test adds `../common` to its path and writes test_results.txt where it runs)."""
    test_dir, common = root / "qa" / "L0_sequence_batcher", root / "qa" / "common"
    common.mkdir(parents=True, exist_ok=True)
    test_dir.mkdir(exist_ok=True)
    shutil.copyfile(QA_FILES / "sequence_batcher_test.py.txt", test_dir / "sequence_batcher_test.py")
    for stored in (QA_FILES / "common").glob("*.py.txt"):
        shutil.copyfile(stored, common / stored.name.removesuffix(".txt"))
    return test_dir


def loopback_up() -> None:
    """`ip link set lo up` without iproute2: a new network namespace's loopback starts down."""
    ifreq = struct.Struct("16sH14x")  # struct ifreq: the name, then ifr_flags
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _, flags = ifreq.unpack(fcntl.ioctl(sock, SIOCGIFFLAGS, ifreq.pack(b"lo", 0)))
        fcntl.ioctl(sock, SIOCSIFFLAGS, ifreq.pack(b"lo", flags | IFF_UP))


def _ready(proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}/v2/health/ready", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    return False


def _results_ok(test_dir: Path) -> bool:
    """test.sh's check_test_results: one test ran, with no error and no failure."""
    try:
        results = json.loads((test_dir / "test_results.txt").read_text())
    except (OSError, ValueError):
        return False
    return bool(results == {"total": 1, "errors": 0, "failures": 0})


def run_case(test: str, repo: Path, test_dir: Path, log_dir: Path) -> int:
    """Inside the namespace: `lo` up, a fresh server, the case; its exit status."""
    loopback_up()
    (test_dir / "test_results.txt").unlink(missing_ok=True)
    server_cmd = [sys.executable, "-m", "seqserve", "serve", "--model-repository", str(repo)]
    server_cmd += ["--http-port", str(HTTP_PORT), "--grpc-port", str(GRPC_PORT)]
    server_cmd += ["--metrics-port", str(METRICS_PORT), "--strict-sequence-ids"]
    with open(log_dir / f"server.{test}.log", "wb") as server_log:
        server = subprocess.Popen(server_cmd, stdout=server_log, stderr=subprocess.STDOUT)
    try:
        if not _ready(server):
            status = f"exited {server.returncode}" if server.poll() is not None else "is not ready"
            print(f"the server {status} after {READY_TIMEOUT_S:.0f} s at most (its log: server.{test}.log)", flush=True)
            return 3
        with open(log_dir / f"{test}.log", "wb") as client_log:
            client = subprocess.run(
                [sys.executable, "sequence_batcher_test.py", f"SequenceBatcherTest.{test}"],
                cwd=test_dir,
                stdout=client_log,
                stderr=subprocess.STDOUT,
                timeout=CASE_TIMEOUT_S,
            )
        if client.returncode != 0:
            return client.returncode
        return 0 if _results_ok(test_dir) else 4
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("test")
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--test-dir", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    args = parser.parse_args()
    sys.exit(run_case(args.test, args.repo, args.test_dir, args.log_dir))


if __name__ == "__main__":
    main()
