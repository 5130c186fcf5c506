"""The server under test: an existing one by URL, a seqserve started (and stopped) here, or a
floor server (``bench/floors``) started here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """n distinct free loopback TCP ports (port-0 sockets held open together, then closed)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def url_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@dataclass
class Target:
    http_url: str | None
    grpc_url: str | None
    model: str
    server_pid: int | None = None
    spawned: SpawnedServer | SpawnedFloor | None = None
    label: str = "server"


class _Spawned:
    """A child process whose output goes to ``log_path``."""

    proc: subprocess.Popen[bytes] | None
    log_path: Path | None

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            raise RuntimeError(f"{self.proc.args!r} exited with {self.proc.returncode}:\n{tail}")

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()  # keep the log
        if rc in (0, -signal.SIGTERM) and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)  # a clean exit: nothing to look at
        return rc


@dataclass
class SpawnedServer(_Spawned):
    """``python -m seqserve serve`` on free loopback ports, its output in a log file."""

    python: str = sys.executable
    host: str = "127.0.0.1"
    extra_args: list[str] = field(default_factory=list)
    http_port: int = 0
    grpc_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self) -> None:
        self.http_port = self.http_port or free_port(self.host)
        self.grpc_port = self.grpc_port or free_port(self.host)
        # the metrics endpoint stays on (as installed) but on a free port: its default (8002) collides
        # with any other server on the machine, a second bench among them
        given = {a.split("=", 1)[0] for a in self.extra_args}
        metrics = [] if "--metrics-port" in given else ["--metrics-port", str(free_port(self.host))]
        cmd = [
            self.python, "-m", "seqserve", "serve", "--host", self.host,
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            *metrics, "--log-level", "warning", *self.extra_args,
        ]  # fmt: skip
        fd, name = tempfile.mkstemp(prefix="seqserve-bench-", suffix=".log")
        self.log_path = Path(name)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"


def _ready(target: Target, model: str | None) -> bool:
    if target.http_url:
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            with urllib.request.urlopen(f"http://{target.http_url}{path}", timeout=2) as resp:
                return bool(resp.status == 200)
        except urllib.error.HTTPError:
            return False  # answered, but not ready (or no such model)
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(target.grpc_url) as c:
        return bool(c.is_model_ready(model) if model else c.is_server_ready())


def wait_ready(target: Target, timeout_s: float = 60.0, model_timeout_s: float = 10.0) -> None:
    """Until the server answers ready, then until the model does (on HTTP; on gRPC without an HTTP URL)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    model_deadline: float | None = None
    while True:
        if target.spawned is not None:
            target.spawned.check_alive()
        try:
            if model_deadline is None:
                if _ready(target, None):
                    model_deadline = time.monotonic() + model_timeout_s
                    continue
            elif _ready(target, target.model):
                return
            elif time.monotonic() > model_deadline:
                raise RuntimeError(f"the server is up, but model {target.model!r} is not ready (or does not exist)")
        except (OSError, ConnectionError) as e:  # not listening yet
            last = e
        except RuntimeError:
            raise
        except Exception as e:  # e.g. gRPC UNAVAILABLE while starting
            last = e
        if time.monotonic() > deadline:
            raise TimeoutError(f"server not ready after {timeout_s:.0f}s (last: {last!r})")
        time.sleep(0.2)


@dataclass
class SpawnedFloor(_Spawned):
    """``python bench/floors/<script> PORT`` on a free loopback port, its output in a log file."""

    name: str  # a key of bench.floors.FLOORS
    python: str = sys.executable
    host: str = "127.0.0.1"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self) -> None:
        from bench.floors import script_path

        self.port = self.port or free_port(self.host)
        cmd = [self.python, str(script_path(self.name)), str(self.port), "--host", self.host]
        fd, name = tempfile.mkstemp(prefix=f"bench-floor-{self.name}-", suffix=".log")
        self.log_path = Path(name)
        with os.fdopen(fd, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"

    def target(self, model: str) -> Target:
        assert self.proc is not None
        grpc = self.name.startswith("grpc")
        return Target(
            None if grpc else self.url, self.url if grpc else None, model, self.proc.pid, self, f"floor:{self.name}"
        )


def fetch_metadata(target: Target) -> dict[str, Any]:
    """The model's KServe v2 metadata (inputs and outputs with datatype and shape), shapes as ints."""
    if target.http_url:
        import tritonclient.http as httpclient

        with httpclient.InferenceServerClient(target.http_url) as c:
            meta = dict(c.get_model_metadata(target.model))
    else:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(target.grpc_url) as c:
            meta = dict(c.get_model_metadata(target.model, as_json=True))
    for key in ("inputs", "outputs"):
        meta[key] = [dict(t, shape=[int(d) for d in t.get("shape", [])]) for t in meta.get(key) or []]
    return meta
