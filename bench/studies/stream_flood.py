"""``python -m bench.studies.stream_flood``: one gRPC stream floods a real ``seqserve serve`` with
STARTs of new sequences (issue 24), and what it costs the server.

Two clients: one that reads its replies (all but the STARTs that get a slot or a backlog place
are refused at once) and one that never reads (the stream stops reading at
``--grpc-max-stream-backlog`` unanswered requests; grpcio's client buffers the rest). For each:
the server's resident memory before and after, the refusals, and how long an HTTP START sent
during the flood took to be answered (503: the model's backlog is full).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from seqserve._proto import grpc_service_pb2 as pb

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A ``seqserve serve`` process on free ports (the bundled demo models)."""

    def __init__(self, *flags: str) -> None:
        self.http, self.grpc = free_port(), free_port()
        cmd = [sys.executable, "-m", "seqserve", "serve", "--host", "127.0.0.1", "--http-port", str(self.http)]
        cmd += ["--grpc-port", str(self.grpc), "--allow-metrics", "false", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not self._ready():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def http_start(self) -> tuple[int, float]:
        """One HTTP START of a new sequence: its status and how long it took."""
        doc = {
            "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
            "parameters": {"sequence_id": int.from_bytes(os.urandom(7), "big") + 1, "sequence_start": True},
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http}/v2/models/accumulator/infer", data=json.dumps(doc).encode(), method="POST"
        )
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        return status, time.monotonic() - t0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def starts(n: int) -> list[bytes]:
    base = int.from_bytes(os.urandom(4), "big") << 24
    out = []
    for i in range(n):
        r = pb.ModelInferRequest(model_name="accumulator", id=str(i))
        r.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
        r.raw_input_contents.append(struct.pack("<f", 1.0))
        r.parameters["sequence_id"].int64_param = base + i
        r.parameters["sequence_start"].bool_param = True
        out.append(r.SerializeToString())
    return out


def flood(srv: Server, n: int, *, read: bool, seconds: float) -> dict[str, Any]:
    """``n`` STARTs on one stream; returns what happened (counts, memory, the HTTP START)."""
    messages = starts(n)
    counts = {"sent": 0, "replies": 0, "refusals": 0}
    before = srv.rss()

    def requests() -> Iterator[bytes]:
        for m in messages:
            counts["sent"] += 1
            yield m

    channel = grpc.insecure_channel(f"127.0.0.1:{srv.grpc}")
    call = channel.stream_stream(STREAM)(requests())

    def reader() -> None:
        try:
            for raw in call:
                counts["replies"] += 1
                if pb.ModelStreamInferResponse.FromString(raw).error_message:
                    counts["refusals"] += 1
        except grpc.RpcError:
            pass

    if read:
        threading.Thread(target=reader, daemon=True).start()
    t0 = time.monotonic()
    http: tuple[int, float] | None = None
    peak = before
    last, still = -1, 0.0  # replies at the last check, and since when they have not moved
    while time.monotonic() - t0 < seconds:
        peak = max(peak, srv.rss())
        if http is None and (counts["refusals"] > min(1000, n // 10) or (not read and time.monotonic() - t0 > 5)):
            http = srv.http_start()
        if read and counts["replies"] == last and time.monotonic() - still > 5:
            break  # every reply that will come has come
        if counts["replies"] != last:
            last, still = counts["replies"], time.monotonic()
        time.sleep(0.1)
    elapsed = time.monotonic() - t0 - (5 if read else 0)  # less the quiet wait
    after = srv.rss()
    call.cancel()
    channel.close()
    return {
        "client": "reads" if read else "never reads",
        "starts": n,
        "sent": counts["sent"],
        "replies": counts["replies"],
        "refusals": counts["refusals"],
        "seconds": round(elapsed, 1),
        "rss_before_mib": round(before / 2**20, 1),
        "rss_growth_mib": round((after - before) / 2**20, 1),
        "rss_peak_growth_mib": round((peak - before) / 2**20, 1),
        "http_start": None if http is None else {"status": http[0], "seconds": round(http[1], 3)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=300_000)
    ap.add_argument("--seconds", type=float, default=600.0, help="the longest one flood runs")
    ap.add_argument("--never-read-seconds", type=float, default=30.0)
    ap.add_argument("--warm-up", type=int, default=3000, help="STARTs of the flood before the measured one")
    args = ap.parse_args()
    rows = []
    for read in (True, False):
        srv = Server()
        try:
            flood(srv, args.warm_up, read=True, seconds=60)  # warm-up: what the stream path allocates once
            time.sleep(6)  # its backlogged sequences expire (the demo's 5 s idle timeout)
            rows.append(flood(srv, args.starts, read=read, seconds=args.seconds if read else args.never_read_seconds))
        finally:
            srv.stop()
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
