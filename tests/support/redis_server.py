"""A throwaway redis-server on a random loopback port, for the state store's tests: `redis_server`
yields its URL; `RedisProcess` also kills it (SIGKILL), restarts it empty on the same port, or
freezes it (SIGSTOP: an outage that keeps the data)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.ports import free_port


def _require_redis() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server): the redis:// store is not tested")
    try:
        import redis  # noqa: F401
    except ImportError:
        pytest.skip("redis-py is not installed (pip install 'seqserve[redis]'): the redis:// store is not tested")
    return exe


class RedisProcess:
    """One redis-server without persistence: a restart comes back empty, as a crashed cache does."""

    def __init__(self, tmp: Path) -> None:
        self.exe = _require_redis()
        self.tmp = tmp
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again, empty) on its port and wait until it answers PING."""
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [self.exe, *args, "--dir", str(self.tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not self._pong():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.05)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                return c.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: everything it held is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart_empty(self) -> None:
        self.kill()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP: clients time out; the data stays (``thaw`` resumes it)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)  # a frozen one cannot act on SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def redis_process(tmp: Path) -> Iterator[RedisProcess]:
    """A started ``RedisProcess`` (skips when redis-server or redis-py is missing)."""
    r = RedisProcess(tmp)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@contextmanager
def redis_server(tmp: Path) -> Iterator[str]:
    """Start redis-server (no persistence) and yield its URL; skip when it is not installed."""
    with redis_process(tmp) as r:
        yield r.url
