"""The real Triton Inference Server, started from the development environment's anchor
(``../shared/anchors/triton/start_triton.sh HTTP_PORT GRPC_PORT [MODEL_REPO]``, outside this
repository) and stopped again, whatever happens.

The script starts ``tritonserver`` in its own session (``setsid``), prints its PID, and exits once
the server answers ready (0) or after 30 s (1, leaving the server running). So the PID is taken from
the script's first line as soon as it appears: from then on :meth:`SpawnedTriton.stop` can end the
server, also when the script fails, times out or the bench is interrupted. Triton is not our child
(the script's), so it is stopped by signal and polled through /proc; its Python backend stubs are
its children and are stopped with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench.loadgen.cpu import process_tree
from bench.loadgen.target import free_port

ROOT = Path(__file__).resolve().parents[2]
ANCHOR = Path("shared", "anchors", "triton", "start_triton.sh")
SCRIPT_ENV = "SEQSERVE_TRITON_ANCHOR"  # overrides the default script path


class TritonUnavailable(RuntimeError):
    """The anchor is missing or Triton did not start; the message says why."""


def default_script() -> Path:
    """``$SEQSERVE_TRITON_ANCHOR``, else ``../shared/anchors/triton/start_triton.sh`` from the checkout
    root, else the same under the nearest folder above it that has one (a git worktree of the checkout
    lives deeper: /work/wt/NAME next to /work/main)."""
    if os.environ.get(SCRIPT_ENV):
        return Path(os.environ[SCRIPT_ENV])
    for folder in ROOT.parents:
        if (folder / ANCHOR).is_file():
            return folder / ANCHOR
    return ROOT.parent / ANCHOR


def anchor_problem(script: Path) -> str | None:
    """Why the anchor at ``script`` cannot be used here (None: it can). The script would install its
    virtualenv (nvidia-pytriton from PyPI) when it is missing; the bench does not let it, so that a
    run never downloads a wheel behind the user's back."""
    if not script.is_file():
        return f"no Triton anchor at {script} (give --triton-script PATH or set {SCRIPT_ENV})"
    venv = Path(os.environ.get("ANCHOR_VENV") or Path.home() / ".cache" / "anchors" / "ptenv")
    if not (venv / "bin" / "python").exists():
        return (
            f"the Triton anchor's virtualenv {venv} is not installed: run {script} once by hand "
            "(it installs nvidia-pytriton from PyPI), or set ANCHOR_VENV"
        )
    return None


def _starttime(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in ticks): tells a process from a later one that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    if fields[0] == b"Z":  # exited, not yet reaped: gone for our purposes
        return None
    return fields[19].decode()


def _free_grpc_port(host: str) -> int:
    """A free port whose successor is free too: the script puts the metrics port at GRPC_PORT + 1."""
    for _ in range(50):
        port = free_port(host)
        if port < 65535:
            try:
                with socket.socket() as s:
                    s.bind((host, port + 1))
                return port
            except OSError:
                continue
    raise TritonUnavailable("found no two adjacent free ports for Triton's gRPC and metrics endpoints")


@dataclass
class SpawnedTriton:
    script: Path
    model_repo: Path | None = None
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    ready_timeout_s: float = 90.0
    pid: int | None = None
    log_path: Path | None = None
    _members: dict[int, str | None] | None = None  # pid -> start time, of the server's tree when last seen

    def start(self) -> None:
        problem = anchor_problem(self.script)
        if problem:
            raise TritonUnavailable(problem)
        self.http_port = self.http_port or free_port(self.host)
        self.grpc_port = self.grpc_port or _free_grpc_port(self.host)
        fd, name = tempfile.mkstemp(prefix="triton-anchor-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        cmd = ["bash", str(self.script), str(self.http_port), str(self.grpc_port)]
        if self.model_repo is not None:
            cmd.append(str(self.model_repo))
        # the script's stderr goes to a file: a pipe would stay open in whatever the script left
        # running with it, and reading it to the end would wait for that
        with tempfile.TemporaryFile("w+") as err_file:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err_file, stdin=subprocess.DEVNULL, text=True,
                env=dict(os.environ, ANCHOR_LOG=name),
            )  # fmt: skip
            try:
                self._await_script(proc, err_file)
            except BaseException:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                self.stop()
                raise
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()

    def _await_script(self, proc: subprocess.Popen[str], err_file: IO[str]) -> None:
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()  # the server's PID, printed before the readiness wait
        if first.isdigit():
            self.pid = int(first)
            self._remember()
        try:
            rc = proc.wait(self.ready_timeout_s)
        except subprocess.TimeoutExpired:
            raise TritonUnavailable(self._why(f"{self.script} did not finish in {self.ready_timeout_s:.0f}s")) from None
        err_file.seek(0)
        err = err_file.read().strip()[-2000:]
        if rc != 0 or self.pid is None:
            raise TritonUnavailable(self._why(f"{self.script} exited with {rc}: {err or first or 'no output'}"))
        if not self.alive():
            raise TritonUnavailable(self._why(f"tritonserver (pid {self.pid}) exited right after starting"))
        self._remember()  # now with the Python backend stubs

    def _why(self, what: str) -> str:
        tail = ""
        if self.log_path is not None and self.log_path.exists():
            tail = self.log_path.read_text(errors="replace")[-2000:].strip()
        return f"Triton did not start: {what}" + (f"\nits log ({self.log_path}):\n{tail}" if tail else "")

    def _remember(self) -> None:
        if self.pid is None:
            return
        try:
            tree = process_tree(self.pid)
        except ProcessLookupError:
            return
        self._members = {p: _starttime(p) for p in tree}

    def alive(self) -> bool:
        return self.pid is not None and _starttime(self.pid) is not None

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(self._why(f"tritonserver (pid {self.pid}) is gone").replace("did not start", "stopped"))

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL to the server's session after ``timeout_s``; then whatever of its
        process tree (as last seen: the stubs) is still there. Idempotent."""
        if self.pid is None:
            return
        self._remember()
        members = dict(self._members or {self.pid: _starttime(self.pid)})
        start = members.get(self.pid)

        def same(pid: int) -> bool:  # still the process we started, not a reuse of its pid
            st = _starttime(pid)
            return st is not None and st == members.get(pid)

        if start is not None and same(self.pid):
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while same(self.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if same(self.pid):
                try:  # setsid made it the leader of its own process group
                    os.killpg(self.pid, signal.SIGKILL)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.kill(self.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(same(p) for p in members) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in members:
            if same(p):
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        self.pid = None
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"
