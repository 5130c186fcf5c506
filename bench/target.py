"""The server under test: an existing one by URL, or a seqserve started (and stopped) here."""

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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


@dataclass
class Target:
    http_url: str | None
    grpc_url: str | None
    model: str
    server_pid: int | None = None
    spawned: SpawnedServer | None = None


@dataclass
class SpawnedServer:
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
        cmd = [
            self.python, "-m", "seqserve", "serve", "--host", self.host,
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--log-level", "warning", *self.extra_args,
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

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path else ""
            raise RuntimeError(f"seqserve exited with {self.proc.returncode}:\n{tail}")

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def wait_ready(target: Target, timeout_s: float = 60.0) -> None:
    """Until the model answers ready on HTTP (or on gRPC when there is no HTTP URL)."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if target.spawned is not None:
            target.spawned.check_alive()
        try:
            if target.http_url:
                url = f"http://{target.http_url}/v2/models/{target.model}/ready"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            else:
                import tritonclient.grpc as grpcclient

                with grpcclient.InferenceServerClient(target.grpc_url) as c:
                    if c.is_model_ready(target.model):
                        return
        except (urllib.error.URLError, ConnectionError, OSError, Exception) as e:  # not up yet
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"model {target.model!r} not ready after {timeout_s:.0f}s (last: {last!r})")
