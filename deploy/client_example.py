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
- gRPC streams: a stream lives on one replica. When that replica drains, it answers the steps
  it took, then ends the stream with status UNAVAILABLE (tritonclient's stream callback gets an
  error whose status() is "StatusCode.UNAVAILABLE"; through HAProxy 2.6 it may read
  CANCELLED, see stream_ended_by_replica). Reopen the stream (through HAProxy, which
  picks a ready replica) and send again the steps that got no reply: they did not run, and the
  sequence continues from the state store. With the `triton_grpc_error: true` header, a step
  refused for another reason that is not its own fault (its sequence is moving, no free slot)
  ends the stream the same way, so UNAVAILABLE is the one signal to act on.
"""

from __future__ import annotations

import argparse
import json
import queue
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


def stream_ended_by_replica(error: InferenceServerException) -> bool:
    """The replica ended the stream: its replica is draining (or, with triton_grpc_error,
    refused a step it did not run), after answering every step it took, so the steps without
    a reply did not run. It ends it with UNAVAILABLE; HAProxy versions with
    haproxy/haproxy#1219 (Debian 12's 2.6) may turn that end of a stream the client has not
    half-closed into a reset, which tritonclient reports as CANCELLED "Received RST_STREAM with
    error code 8". This client never cancels its own streams mid-step, so either means the same."""
    return error.status() in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED")


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
    """One step at a time over a stream, reopened when its replica ends it (UNAVAILABLE). Stream metadata
    belongs to the whole stream, so it routes the stream; the requests name their sequence with
    sequence_id (START on the first step, END on the last), as Triton clients do. A client that
    keeps several steps in flight resends, in order, every step that got no reply."""
    client = grpcclient.InferenceServerClient(url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def open_stream() -> None:
        # The callback gets each reply, and once, when the stream ends with a status, that
        # status as the error (result None): InferenceServerException, status() e.g.
        # "StatusCode.UNAVAILABLE", message() the server's details.
        client.start_stream(callback=lambda result, error: replies.put((result, error)),
                            headers={"inference-session-id": session,
                                     "triton_grpc_error": "true"})  # fmt: skip

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
            if not stream_ended_by_replica(error) or reopens == max_reopens:
                raise error  # a real error
            # the step got no reply: it did not run; its replica drained (or it belongs elsewhere)
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
