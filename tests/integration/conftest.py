"""Fixtures that run the real `seqserve serve` as a subprocess on free ports.

`server` is one server on the bundled demo repository for the whole session; `launch` starts
extra servers (a custom repository, other flags) for one test. Every server is stopped with
SIGTERM at teardown and must exit 0.
"""

from __future__ import annotations

import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.target import free_ports
from tests.helpers import write_model
from tests.integration._util import FLAVOURS, Client

ROOT = Path(__file__).resolve().parents[2]
DEMO_REPO = ROOT / "src" / "seqserve" / "examples" / "models"
STARTUP_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 20.0


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


def _ready(url: str) -> bool:
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
) -> ServerProcess:
    """Start `seqserve serve` on free ports and wait until /v2/health/ready answers 200
    (or until `probe(server)` is true: for servers that want a client certificate or a header)."""
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
            *args,
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        srv = ServerProcess(proc, http_port, grpc_port, log_path, repo, tuple(args), metrics_port)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and srv.alive():
            if probe(srv) if probe else _ready(srv.base_url.replace("http:", "https:") if tls else srv.base_url):
                return srv
            time.sleep(0.05)
        if srv.alive():
            srv.proc.kill()
            srv.proc.wait(5)
            raise AssertionError(f"server not ready within {STARTUP_TIMEOUT_S} s\n{srv.log()}")
        if attempt == 2 or "address already in use" not in srv.log().lower():
            raise AssertionError(f"server exited with {srv.proc.returncode} during startup\n{srv.log()}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The demo repository (accumulator, accumulator_corrid, add_sub), shared by the session."""
    srv = start_server(DEMO_REPO, log_dir=tmp_path_factory.mktemp("logs"))
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc}\n{srv.log()}"


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """`launch(repo, *flags)` starts a server for this test only; stopped (exit 0 checked) after it."""
    started: list[ServerProcess] = []

    def _launch(
        repo: Path | None = None,
        *args: str,
        exit_timeout_s: float = 3.0,
        tls: bool = False,
        probe: Callable[[ServerProcess], bool] | None = None,
    ) -> ServerProcess:
        srv = start_server(
            repo or DEMO_REPO, *args, log_dir=tmp_path, exit_timeout_s=exit_timeout_s, tls=tls, probe=probe
        )
        started.append(srv)
        return srv

    yield _launch
    for srv in started:
        srv.terminate()
    failures = []
    for srv in started:
        try:
            rc = srv.wait()
        except AssertionError as e:
            failures.append(str(e))
            continue
        if rc != 0:
            failures.append(f"server {srv.args} exited with {rc}\n{srv.log()}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------ custom repos

IDENTITY_DTYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]

IDENTITY_MODEL = """
class Model:
    def execute(self, batch):
        return {"OUT_" + name[3:]: value.copy() for name, value in batch.inputs.items()}
"""


def _config_type(dtype: str) -> str:
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def identity_config(name: str = "identity") -> str:
    """Stateless, max_batch_size 0: IN_<T> [-1] -> OUT_<T> for every datatype T."""
    ins = ",\n".join(f'  {{ name: "IN_{t}" data_type: {_config_type(t)} dims: [ -1 ] }}' for t in IDENTITY_DTYPES)
    outs = ",\n".join(f'  {{ name: "OUT_{t}" data_type: {_config_type(t)} dims: [ -1 ] }}' for t in IDENTITY_DTYPES)
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f"input [\n{ins}\n]\noutput [\n{outs}\n]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


@pytest.fixture
def custom_repo(tmp_path: Path) -> Path:
    """A tmp repository: a copy of the demo models plus `identity` (every datatype)."""
    repo = tmp_path / "models"
    shutil.copytree(DEMO_REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    write_model(repo, "identity", identity_config(), IDENTITY_MODEL)
    return repo


@pytest.fixture
def custom_server(custom_repo: Path, launch: Callable[..., ServerProcess]) -> ServerProcess:
    """A function-scoped server on `custom_repo`."""
    return launch(custom_repo)


@pytest.fixture(scope="module")
def identity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server on a tmp repository holding only `identity`, shared by one module."""
    repo = tmp_path_factory.mktemp("identity-repo")
    write_model(repo, "identity", identity_config(), IDENTITY_MODEL)
    srv = start_server(repo, log_dir=repo)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc}\n{srv.log()}"


@pytest.fixture(params=FLAVOURS)
async def client(request: pytest.FixtureRequest, server: ServerProcess) -> AsyncIterator[Client]:
    """Each of tritonclient.http, .http.aio, .grpc and .grpc.aio on the session server."""
    cl = Client(request.param, server)
    yield cl
    await cl.close()
