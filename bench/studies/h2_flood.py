"""A flood of HTTP/2 frames against the builtin gRPC server, and what it does to other clients
(issue 24, item 6: WINDOW_UPDATE frames on closed streams were not budgeted; four connections
sending them held the event loop and other clients' median step rose from 1.3 ms to 8-16 ms).

    python -m bench.studies.h2_flood                  # about half a minute
    python -m bench.studies.h2_flood --frame ping     # another frame kind

A ``seqserve serve`` on the demo repository; one client steps accumulator sequences over gRPC
(tritonclient, unary calls, one at a time) for ``--duration`` seconds quietly, then as long
again while ``--connections`` connections (one flooding process) each make one call and then
send the frame without end, opening a new connection whenever the server sends one away. It
prints the step latency of both phases, the frames the flood got written, and its connections.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "src" / "seqserve" / "examples" / "models"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">HBBBL", n >> 8, n & 0xFF, kind, flags, sid) + payload


# one unary ServerLive call on stream 1 (HPACK literals without indexing, no Huffman), which
# leaves stream 1 closed
def _literal(name: bytes, value: bytes) -> bytes:
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


CALL = frame(
    1,
    0x4,
    1,
    b"\x83\x86"  # :method POST, :scheme http
    + _literal(b":path", b"/inference.GRPCInferenceService/ServerLive")
    + _literal(b"content-type", b"application/grpc"),
) + frame(0, 0x1, 1, b"\0\0\0\0\0")
FLOODS = {
    "window-update-closed": frame(8, 0, 1, struct.pack(">L", 1)),  # on stream 1, closed
    "window-update-connection": frame(8, 0, 0, struct.pack(">L", 1)),
    "ping": frame(6, 0, 0, b"\0" * 8),
    "rst-closed": frame(3, 0, 1, struct.pack(">L", 8)),
    "priority": frame(2, 0, 1, b"\0\0\0\0\x10"),
    "settings": frame(4, 0, 0),
}


def flood(port: int, kind: str, connections: int, stop_at: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Keep ``connections`` sockets sending ``kind`` frames until ``stop_at``; reconnect each
    one the server closes. Puts (bytes written, connections opened)."""
    os.nice(19)  # the flood gets the CPU the others leave: what is measured is the server's loop
    batch = FLOODS[kind] * 4096
    socks: list[socket.socket | None] = [None] * connections
    written = opened = 0
    while time.monotonic() < stop_at:
        for i in range(connections):
            s = socks[i]
            if s is None:
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                    s.sendall(PREFACE + frame(4, 0, 0) + CALL)
                    s.setblocking(False)
                except OSError:
                    continue
                socks[i] = s
                opened += 1
            try:
                try:
                    while s.recv(65536):  # what the server sends (its answers, a GOAWAY)
                        pass
                    raise ConnectionResetError  # EOF: sent away
                except BlockingIOError:
                    pass
                written += s.send(batch)
            except BlockingIOError:
                time.sleep(0.0005)  # its buffer is full: the server reads no faster
            except OSError:
                s.close()
                socks[i] = None
    for s in socks:
        if s is not None:
            s.close()
    out.put((written, opened))


def step_latencies(url: str, seconds: float) -> list[float]:
    """Accumulator sequences of 100 steps, one step at a time: each step's latency (ms)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    data = np.ones((1, 1), dtype=np.float32)
    times: list[float] = []
    seq = 1
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for step in range(100):
            x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            x.set_data_from_numpy(data)
            t = time.perf_counter()
            reply = client.infer("accumulator", [x], sequence_id=seq, sequence_start=step == 0, sequence_end=step == 99)
            times.append((time.perf_counter() - t) * 1e3)
            assert float(reply.as_numpy("OUTPUT").reshape(-1)[0]) == step + 1
        seq += 1
    client.close()
    return times


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(name: str, times: list[float]) -> str:
    qs = np.percentile(times, [50, 90, 99])
    median = statistics.median(times)
    return f"{name:<8} {len(times):>6} steps  median {median:6.2f} ms  p90 {qs[1]:6.2f}  p99 {qs[2]:7.2f}"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of each phase")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--frame", choices=sorted(FLOODS), default="window-update-closed")
    args = ap.parse_args()
    http_port, grpc_port, metrics_port = free_ports(3)
    log = tempfile.NamedTemporaryFile(prefix="h2_flood-", suffix=".log", delete=False)  # noqa: SIM115
    ports = ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    cmd = [sys.executable, "-m", "seqserve", "serve", "--host", "127.0.0.1", *ports, "--model-repository", str(DEMO)]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"server did not start; its log: {log.name}")
            time.sleep(0.1)
        url = f"127.0.0.1:{grpc_port}"
        step_latencies(url, 1.0)  # warm-up
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        quiet = step_latencies(url, args.duration)
        quiet_cpu = (cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        stop_at = time.monotonic() + args.duration + 1.0
        flooder = multiprocessing.Process(target=flood, args=(grpc_port, args.frame, args.connections, stop_at, out))
        flooder.start()
        time.sleep(1.0)  # the flood under way
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        flooded = step_latencies(url, args.duration)
        flooded_cpu = (cpu_seconds(server.pid) - cpu0) / (time.monotonic() - t0)
        written, opened = out.get(timeout=args.duration + 30)
        flooder.join()
        frame_size = len(FLOODS[args.frame])
        print(f"{args.frame} flood on {args.connections} connections, {args.duration:g} s per phase")
        print(summary("quiet", quiet) + f"  server CPU {quiet_cpu:4.0%}")
        print(summary("flooded", flooded) + f"  server CPU {flooded_cpu:4.0%}")
        print(f"flood: {written // frame_size} frames written ({written // frame_size / args.duration:,.0f}/s), "
              f"{opened} connections opened (a new one each time the server closed one)")  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
