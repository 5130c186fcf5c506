"""Real `seqserve serve` processes on free ports: start one and wait for it, or run one that
must end by itself (a usage error, a failed startup)."""

from __future__ import annotations

import itertools
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.ports import free_ports

STARTUP_TIMEOUT_S = 30.0
#: SEQSERVE_TEST_WORKERS=N runs every server these helpers start with ``--workers N`` (the
#: integration suite under worker processes); unset or 1: one process, as by default
TEST_WORKERS = int(os.environ.get("SEQSERVE_TEST_WORKERS", "1") or 1)


#: servers that bind their own ports, which worker processes cannot share: a server started with
#: one of these runs as one process even under SEQSERVE_TEST_WORKERS
_OWN_PORT_SERVERS = (("--grpc-server", "grpcio"), ("--http-server", "granian"))


def worker_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """``args`` plus ``--workers N`` under SEQSERVE_TEST_WORKERS, unless they set it already or
    select a server that binds its own port (grpc.aio, granian)."""
    out = list(args)
    if TEST_WORKERS <= 1 or any(a.split("=", 1)[0] == "--workers" for a in out):
        return out
    pairs = set(itertools.pairwise(out)) | {tuple(a.split("=", 1)) for a in out if "=" in a}
    if any(p in pairs for p in _OWN_PORT_SERVERS):
        return out
    return [*out, "--workers", str(TEST_WORKERS)]


def under_workers() -> bool:
    """Whether the servers of this run have front-end worker processes (SEQSERVE_TEST_WORKERS)."""
    return TEST_WORKERS > 1


EXIT_TIMEOUT_S = 20.0
RUN_TIMEOUT_S = 60.0


@dataclass
class ServerProcess:
    """A running `seqserve serve` subprocess."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path
    repo: Path
    args: tuple[str, ...] = field(default_factory=tuple)
    metrics_port: int = 0  # the Prometheus endpoint (http://127.0.0.1:<port>/metrics)

    @property
    def http_url(self) -> str:  # tritonclient form: no scheme
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = EXIT_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"server did not exit within {timeout} s of SIGTERM\n{self.log()}") from None

    def stop(self) -> int:
        self.terminate()
        return self.wait()


def ready(url: str) -> bool:
    """Whether the server at `url` (http: or https:) answers /v2/health/ready with 200."""
    ctx = None
    if url.startswith("https:"):  # the probe only asks whether it answers; tests check the certificate
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url + "/v2/health/ready", timeout=1, context=ctx) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def start_server(
    repo: Path,
    *args: str,
    log_dir: Path,
    exit_timeout_s: float = 3.0,
    tls: bool = False,
    probe: Callable[[ServerProcess], bool] | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start `seqserve serve` on free ports and wait until /v2/health/ready answers 200
    (or until `probe(server)` is true: for servers that want a client certificate or a header).
    `env` adds environment variables for the server."""
    for attempt in range(3):
        http_port, grpc_port, metrics_port = free_ports(3)
        log_path = log_dir / f"seqserve-{http_port}.log"
        cmd = [
            sys.executable,
            "-m",
            "seqserve",
            "serve",
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--metrics-port",
            str(metrics_port),
            "--model-repository",
            str(repo),
            "--exit-timeout-secs",
            str(exit_timeout_s),
            *worker_args(args),
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        srv = ServerProcess(proc, http_port, grpc_port, log_path, repo, tuple(args), metrics_port)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and srv.alive():
            if probe(srv) if probe else ready(srv.base_url.replace("http:", "https:") if tls else srv.base_url):
                return srv
            time.sleep(0.05)
        if srv.alive():
            srv.proc.kill()
            srv.proc.wait(5)
            raise AssertionError(f"server not ready within {STARTUP_TIMEOUT_S} s\n{srv.log()}")
        if attempt == 2 or "address already in use" not in srv.log().lower():
            raise AssertionError(f"server exited with {srv.proc.returncode} during startup\n{srv.log()}")
    raise AssertionError("unreachable")


@contextmanager
def serving(
    repo: Path,
    *args: str,
    log_dir: Path,
    probe: Callable[[ServerProcess], bool] | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """`start_server` for a `with` block (a module- or session-scoped fixture): the server is
    stopped with SIGTERM when the block ends and must exit 0."""
    srv = start_server(repo, *args, log_dir=log_dir, probe=probe, env=env)
    try:
        yield srv
    finally:
        rc = srv.stop()
    assert rc == 0, f"server exited with {rc}\n{srv.log()}"


PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")


def with_free_ports(args: tuple[str, ...] | list[str]) -> list[str]:
    """`args` plus a free port for each of --http-port, --grpc-port and --metrics-port it does
    not set, so that a server started with them never binds a default (fixed) port."""
    given = {a.split("=", 1)[0] for a in args}
    missing = [flag for flag in PORT_FLAGS if flag not in given]
    out = list(args)
    for flag, port in zip(missing, free_ports(len(missing)), strict=True):
        out += [flag, str(port)]
    return out


def run_serve(*args: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`seqserve serve *args` that must end by itself (a usage error, a failed startup): its exit
    status and output. Ports the arguments do not set are free ones (`with_free_ports`)."""
    return subprocess.run(
        [sys.executable, "-m", "seqserve", "serve", *worker_args(with_free_ports(args))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def live(srv: ServerProcess) -> bool:
    """A `start_server` probe: /v2/health/live answers 200 (for a server that is not ready)."""
    try:
        with urllib.request.urlopen(srv.base_url + "/v2/health/live", timeout=1) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False
