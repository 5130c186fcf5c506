"""A client of seqserve behind HAProxy (deploy/haproxy/haproxy.cfg), with unmodified tritonclient:
one session of the demo `accumulator` (it returns the running sum of INPUT), over HTTP, gRPC
unary calls or a gRPC stream. See docs/deployment.md.

    python deploy/client_example.py --url localhost:8000 --protocol http
    python deploy/client_example.py --url localhost:8001 --protocol grpc
    python deploy/client_example.py --url localhost:8001 --protocol stream

What the balancer needs from a client: the session id on every request, as the
`Inference-Session-Id` header (HTTP) or `inference-session-id` metadata (gRPC), so that every
step of a session reaches the replica that holds its state. What a client does on a drain:
- HTTP: nothing; HAProxy retries a 503 on another replica, which restores the sequence.
- gRPC calls: retry UNAVAILABLE; gRPC's retry policy on the channel does it (below).
- gRPC streams: a stream lives on one replica. When that replica drains, the stream's steps
  are refused without running (in-stream error replies, which carry only a message), and when
  it exits it resets the stream (CANCELLED). Reopen the stream (through HAProxy, which picks a ready
  replica) and send the step again: the sequence continues from the state store.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import time
import uuid
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

# gRPC's own retries, for UNAVAILABLE only: what a replica answers for a step it did not run
# (it is draining, or the sequence has moved to the store and HAProxy has not caught up yet).
RETRY_UNAVAILABLE = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "inference.GRPCInferenceService"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


# In-stream error replies have no status code, only a message: these say that the replica did
# not run the step because it belongs elsewhere (the replica is draining, or the sequence is
# moving to another replica), so the step can be sent again on a new stream.
NOT_RUN_HERE = re.compile(r"^Server is stopping|is leaving this replica|; retry( later)?$")


def not_run_here(error: InferenceServerException) -> bool:
    # The stream itself ended: UNAVAILABLE, or CANCELLED when its replica exited (it resets the
    # streams still open on it, after answering every step it took).
    status = str(error.status())
    return "UNAVAILABLE" in status or "CANCELLED" in status or bool(NOT_RUN_HERE.search(error.message() or ""))


def http_session(url: str, session: str, values: list[float]) -> list[float]:
    client = httpclient.InferenceServerClient(url)
    sums = []
    for i, x in enumerate(values):
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[x]], np.float32))
        headers = {"Inference-Session-Id": session}  # routes the request, and names the sequence
        if i == len(values) - 1:
            headers["Inference-Session-End"] = "true"
        result = client.infer("accumulator", [inp], headers=headers)
        sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
    client.close()
    return sums


def grpc_session(url: str, session: str, values: list[float]) -> list[float]:
    client = grpcclient.InferenceServerClient(
        url, channel_args=[("grpc.enable_retries", 1), ("grpc.service_config", RETRY_UNAVAILABLE)]
    )
    sums = []
    for i, x in enumerate(values):
        inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[x]], np.float32))
        headers = {"inference-session-id": session}  # gRPC metadata keys are lower case
        if i == len(values) - 1:
            headers["inference-session-end"] = "true"
        result = client.infer("accumulator", [inp], headers=headers)
        sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
    client.close()
    return sums


def stream_session(url: str, session: str, values: list[float], max_reopens: int = 10) -> list[float]:
    """One step at a time over a stream, reopened when its replica drains. Stream metadata
    belongs to the whole stream, so it routes the stream; the requests name their sequence with
    sequence_id (START on the first step, END on the last), as Triton clients do."""
    client = grpcclient.InferenceServerClient(url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def open_stream() -> None:
        client.start_stream(callback=lambda result, error: replies.put((result, error)),
                            headers={"inference-session-id": session})  # fmt: skip

    open_stream()
    sums: list[float] = []
    reopens = 0
    i = 0
    while i < len(values):
        inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[values[i]]], np.float32))
        client.async_stream_infer("accumulator", [inp], sequence_id=session,
                                  sequence_start=i == 0, sequence_end=i == len(values) - 1)  # fmt: skip
        result, error = replies.get(timeout=60)
        if error is not None:
            if not not_run_here(error) or reopens == max_reopens:
                raise error  # a real error
            reopens += 1
            client.stop_stream()
            time.sleep(min(0.05 * 2**reopens, 1.0))  # HAProxy takes about a second to drop a draining replica
            open_stream()
            continue  # send the same step again, on the new stream
        sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
        i += 1
    client.stop_stream()
    client.close()
    return sums


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="localhost:8000", help="HAProxy's HTTP or gRPC address (host:port)")
    ap.add_argument("--protocol", choices=["http", "grpc", "stream"], default="http")
    ap.add_argument("--session", default=None, help="session id (default: a new random one)")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    session = args.session or f"session-{uuid.uuid4().hex[:12]}"
    values = [float(i + 1) for i in range(args.steps)]
    run = {"http": http_session, "grpc": grpc_session, "stream": stream_session}[args.protocol]
    try:
        sums = run(args.url, session, values)
    except InferenceServerException as e:
        raise SystemExit(f"{session}: {e.status()} {e.message()}") from None
    print(session, " ".join(f"{s:g}" for s in sums))


if __name__ == "__main__":
    main()
