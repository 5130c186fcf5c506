"""A scaled-out seqserve on loopback: redis-server, HAProxy configured from the shipped
deploy/haproxy/haproxy.cfg, and N `seqserve serve` replicas sharing the Redis state store.

Shared by tests/bench/test_scaleout.py and bench/scaleout/run.py. Every process is
started on free loopback ports and stopped by `Cluster.close()` (a context manager), so nothing
outlives the test or the bench run.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.loadgen.target import free_ports

ROOT = Path(__file__).resolve().parents[2]
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
DEMO_REPO = ROOT / "src" / "seqserve" / "examples" / "models"
STARTUP_TIMEOUT_S = 60.0  # generous: the machine this runs on may be loaded
EXIT_TIMEOUT_S = 30.0


class ClusterError(RuntimeError):
    """A process of the cluster did not start, become ready or exit as expected."""


def missing_tools() -> list[str]:
    """The system programs the cluster needs that are not on PATH."""
    return [tool for tool in ("redis-server", "haproxy") if shutil.which(tool) is None]


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(5)


def demo_repo_with_instances(dst: Path, instances: int) -> Path:
    """A copy of the demo repository at `dst` whose `accumulator` has `instances` instances
    (max_batch_size 8 sequence slots each; the bundled one has 2, 16 slots).

    Why: a replica must have free slots for the sessions a draining peer hands it. With 24
    sessions on three replicas, consistent hashing puts uneven shares on each, and while one
    replica is down one of the other two can get more than 16; a restore that finds no free slot
    is refused (503 / UNAVAILABLE) rather than waiting for one (docs/deployment.md, capacity)."""
    shutil.copytree(DEMO_REPO, dst, ignore=shutil.ignore_patterns("__pycache__"))
    config = dst / "accumulator" / "config.pbtxt"
    text, n = re.subn(r"instance_group \[ \{ count: \d+", f"instance_group [ {{ count: {instances}", config.read_text())
    if n != 1:
        raise ClusterError(f"{config}: no instance_group count to change")
    config.write_text(text)
    return dst


# ------------------------------------------------------------------------------- replicas


@dataclass
class Replica:
    """One `seqserve serve` process; keeps its ports across restarts (the balancer's config
    names them)."""

    name: str
    http_port: int
    grpc_port: int
    metrics_port: int
    log_dir: Path
    args: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.log"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "seqserve", "serve",
            "--host", "127.0.0.1",
            "--http-port", str(self.http_port),
            "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
            *self.args,
        ]  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.http_port}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def start(self, wait: bool = True) -> None:
        """Start it (again, on the same ports); with `wait`, until /v2/health/ready is 200.
        A port still held by the previous process (TIME_WAIT, a slow exit) is retried."""
        self.spawn()
        if wait:
            self.wait_ready()

    def spawn(self) -> None:
        self.starts += 1
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        retries = 0
        while time.monotonic() < deadline:
            if self.ready():
                return
            if not self.alive():
                if "address already in use" in _tail(self.log_path).lower() and retries < 20:
                    retries += 1
                    time.sleep(0.25)
                    self.spawn()
                    continue
                raise ClusterError(f"replica {self.name} exited during startup\n{_tail(self.log_path)}")
            time.sleep(0.05)
        raise ClusterError(f"replica {self.name} not ready within {timeout} s\n{_tail(self.log_path)}")

    def terminate(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = EXIT_TIMEOUT_S) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise ClusterError(f"replica {self.name} did not exit within {timeout} s of SIGTERM") from None

    def kill(self) -> None:
        if self.proc is not None:
            _stop(self.proc, timeout=EXIT_TIMEOUT_S)


# ---------------------------------------------------------------------------------- redis


@dataclass
class Redis:
    port: int
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = self.workdir / "redis.log"
        # No persistence: the store lives as long as the test; nothing is written to disk.
        cmd = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(log),
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ClusterError(f"redis-server exited with {self.proc.returncode}\n{_tail(log)}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise ClusterError(f"redis-server did not answer PING\n{_tail(log)}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


# -------------------------------------------------------------------------------- haproxy


def render_haproxy_config(
    text: str, *, http_port: int, grpc_port: int, replicas: Sequence[Replica], admin_socket: Path
) -> str:
    """deploy/haproxy/haproxy.cfg with loopback addresses: the frontends bind http_port and
    grpc_port, the n-th `server` line of each backend points at replicas[n] (its HTTP or gRPC
    port; the gRPC servers' health-check `port` at its HTTP port), server lines beyond
    len(replicas) are dropped, and the runtime API socket is `admin_socket`. Everything else
    (timeouts, checks, retries, hashing) is the shipped file's."""
    out: list[str] = []
    section = ""
    index = 0
    servers: dict[str, int] = {}
    for line in text.splitlines():
        words = line.split()
        if line[:1].strip() and words:  # a section header starts at column 0
            section = " ".join(words[:2])
            index = 0
        elif words[:2] == ["stats", "socket"]:
            line = f"    stats socket {admin_socket} mode 600 level admin"
        elif words[:1] == ["bind"]:
            port = {"frontend seqserve_http": http_port, "frontend seqserve_grpc": grpc_port}[section]
            line = f"    bind 127.0.0.1:{port} " + " ".join(words[2:])
        elif words[:1] == ["server"]:
            if index >= len(replicas):
                continue
            r = replicas[index]
            index += 1
            servers[section] = index
            grpc = section == "backend seqserve_grpc"
            params = " ".join(words[3:])
            params = re.sub(r"\bport \d+", f"port {r.http_port}", params)
            line = f"    server {r.name} 127.0.0.1:{r.grpc_port if grpc else r.http_port} {params}"
        out.append(line.rstrip())
    short = {
        name for name in ("backend seqserve_http", "backend seqserve_grpc") if servers.get(name, 0) < len(replicas)
    }
    if short:
        raise ClusterError(f"{', '.join(sorted(short))}: fewer server lines than the {len(replicas)} replicas")
    return "\n".join(out) + "\n"


@dataclass
class HAProxy:
    http_port: int
    grpc_port: int
    workdir: Path
    replicas: Sequence[Replica]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def admin_socket(self) -> Path:
        return self.workdir / "haproxy-admin.sock"

    @property
    def http_url(self) -> str:  # tritonclient form
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(
            render_haproxy_config(
                HAPROXY_CFG.read_text(),
                http_port=self.http_port,
                grpc_port=self.grpc_port,
                replicas=self.replicas,
                admin_socket=self.admin_socket,
            )
        )
        check = subprocess.run(["haproxy", "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
        if check.returncode != 0:
            raise ClusterError(f"haproxy -c failed:\n{check.stdout}{check.stderr}")
        log = open(self.workdir / "haproxy.log", "wb")  # noqa: SIM115 (kept open by the child)
        with log:
            # -db: foreground, logs to stdout (the config's `log stdout`)
            self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
        self.wait_servers_up(len(self.replicas))

    def command(self, cmd: str) -> str:
        """One runtime-API command over the admin socket."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(self.admin_socket))
            s.sendall(cmd.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def stats(self) -> list[dict[str, str]]:
        """`show stat` as dicts (pxname, svname, status, wretr, wredis, ...)."""
        lines = [ln for ln in self.command("show stat").splitlines() if ln.strip()]
        header = lines[0].lstrip("# ").split(",")
        return [dict(zip(header, ln.split(","), strict=False)) for ln in lines[1:]]

    def server_status(self, backend: str = "seqserve_http") -> dict[str, str]:
        return {row["svname"]: row["status"] for row in self.stats() if row["pxname"] == backend}

    def counters(self) -> dict[str, int]:
        """Backend totals over both backends: retries, redispatches, 5xx answers, requests."""
        total = {"retries": 0, "redispatches": 0, "hrsp_5xx": 0, "requests": 0}
        for row in self.stats():
            if row["svname"] == "BACKEND":
                total["retries"] += int(row["wretr"] or 0)
                total["redispatches"] += int(row["wredis"] or 0)
                total["hrsp_5xx"] += int(row["hrsp_5xx"] or 0)
                total["requests"] += int(row["req_tot"] or 0)
        return total

    def wait_server_down(self, name: str, timeout: float = 30.0) -> None:
        """Until `name` is DOWN (or in maintenance) in both backends."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                states = [self.server_status(b).get(name, "") for b in ("seqserve_http", "seqserve_grpc")]
                if all(not st.startswith("UP") for st in states):
                    return
            time.sleep(0.05)
        raise ClusterError(f"haproxy: {name} not DOWN within {timeout} s: {self.server_status()}")

    def wait_servers_up(self, n: int, timeout: float = 30.0, names: Sequence[str] = ()) -> None:
        """Until `names` (or n servers) of both backends are UP in HAProxy's own view."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ClusterError(f"haproxy exited with {self.proc.returncode}\n{_tail(self.workdir / 'haproxy.log')}")
            with contextlib.suppress(OSError):
                ok = True
                for backend in ("seqserve_http", "seqserve_grpc"):
                    status = self.server_status(backend)
                    up = {name for name, st in status.items() if st.startswith("UP")}
                    ok = ok and (set(names) <= up if names else len(up) >= n)
                if ok:
                    return
            time.sleep(0.05)
        raise ClusterError(f"haproxy: servers not UP within {timeout} s: {self.server_status()}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


# -------------------------------------------------------------------------------- cluster


@dataclass
class Cluster:
    """redis-server + n replicas (sharing the store unless state_store is None) + HAProxy."""

    workdir: Path
    n_replicas: int = 3
    repo: Path = DEMO_REPO
    state_store: bool = True
    exit_timeout_s: float = 10.0
    extra_args: tuple[str, ...] = ()
    redis: Redis | None = None
    replicas: list[Replica] = field(default_factory=list)
    haproxy: HAProxy | None = None

    def start(self) -> Cluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(3 * self.n_replicas + 3)
        if self.state_store:
            self.redis = Redis(ports.pop(), self.workdir)
            self.redis.start()
        for i in range(self.n_replicas):
            args = ["--model-repository", str(self.repo), "--exit-timeout-secs", str(self.exit_timeout_s)]
            if self.redis is not None:
                args += ["--state-store", self.redis.url, "--replica-id", f"replica-{i}"]
            self.replicas.append(
                Replica(f"replica-{i}", ports.pop(), ports.pop(), ports.pop(), self.workdir, (*args, *self.extra_args))
            )
        for r in self.replicas:  # start them together: startup is mostly waiting on imports
            r.spawn()
        for r in self.replicas:
            r.wait_ready()
        self.haproxy = HAProxy(ports.pop(), ports.pop(), self.workdir, self.replicas)
        self.haproxy.start()
        return self

    def restart(self, i: int) -> tuple[int, float, float]:
        """SIGTERM replica i, wait for it to exit and for HAProxy to have it DOWN (so that its
        sessions do move), start it again and wait until HAProxy has it UP (so that they move
        back). Returns (exit status, seconds to exit, seconds from exit to UP in HAProxy)."""
        r = self.replicas[i]
        assert self.haproxy is not None
        t0 = time.monotonic()
        r.terminate()
        rc = r.wait_exit()
        t1 = time.monotonic()
        self.haproxy.wait_server_down(r.name)
        r.start()
        self.haproxy.wait_servers_up(0, names=[r.name])
        return rc, t1 - t0, time.monotonic() - t1

    def logs(self) -> str:
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            parts.append(f"--- {path.name}\n{_tail(path, 3000)}")
        return "\n".join(parts)

    def close(self) -> None:
        """Stop everything this cluster started: HAProxy, the replicas, redis-server."""
        if self.haproxy is not None:
            self.haproxy.stop()
        for r in self.replicas:
            r.terminate()
        for r in self.replicas:
            with contextlib.suppress(ClusterError):
                r.kill()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
