"""Verified sessions of the demo `accumulator` through a balancer, for the scale-out test and
bench: every reply is checked against the running sum of what its session sent.

Each session sends `Inference-Session-Id` on every request, which is what the balancer hashes
on. Two styles are mixed, the two ways a client names a sequence:
- "triton": the `sequence_id` parameter with START on the first step and END on the last, as
  Triton clients do (the header only routes); a step that reaches a replica which does not
  know the sequence gets `must specify the START flag`.
- "session": the header alone (START implied on first use, `Inference-Session-End` on the
  last); a session that silently restarted on fresh state shows up as a wrong running sum.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from bench.scaleout.cluster import Cluster

STYLES = ("triton", "session")

# gRPC cannot be retried by HAProxy (errors travel in trailers), so gRPC clients retry
# UNAVAILABLE themselves: gRPC's own retry policy, set once on the channel, as
# docs/deployment.md shows. seqserve answers UNAVAILABLE only for requests it did not run
# (draining, a sequence handed to the store), so a retry never applies a step twice.
GRPC_SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [{"service": "inference.GRPCInferenceService"}],
            "retryPolicy": {
                "maxAttempts": 5,  # gRPC's ceiling
                "initialBackoff": "0.2s",
                "maxBackoff": "2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}

#: how a stream that its replica ended (draining, or a step it did not run) reaches the client:
#: UNAVAILABLE, as the replica ends it; or CANCELLED ("Received RST_STREAM with error code 8")
#: through HAProxy versions that turn the replica's end of a stream the client has not
#: half-closed into a reset (haproxy/haproxy#1219; Debian 12's 2.6 does). Either way every step
#: the replica took was answered first: the step without a reply did not run.
STREAM_ENDED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
#: grpc.aio clients (this one) have one more way to see it: a step written just as the stream
#: ended fails, and the client reports INTERNAL "Internal error from Core" instead of the
#: server's status (grpc/grpc#36066). That step was never read by the replica: it did not run.
AIO_WRITE_AFTER_END = (grpc.StatusCode.INTERNAL, "Internal error from Core")


def stream_ended(e: grpc.aio.AioRpcError) -> bool:
    """The replica ended the stream (see STREAM_ENDED): the step without a reply did not run."""
    return e.code() in STREAM_ENDED or (e.code(), e.details()) == AIO_WRITE_AFTER_END


#: stream headers: the session routes the stream; triton_grpc_error makes every refusal end the
#: stream with its status, so that UNAVAILABLE (a draining replica, a sequence that belongs
#: elsewhere) is the one signal to reopen it, never a message's text
def stream_headers(sid: str) -> dict[str, str]:
    return {"inference-session-id": sid, "triton_grpc_error": "true"}


def grpc_channel_args() -> list[tuple[str, object]]:
    """tritonclient's default channel options plus the retry policy."""
    return [
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.max_receive_message_length", 2**31 - 1),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(GRPC_SERVICE_CONFIG)),
    ]


@dataclass
class LoadResult:
    sessions_started: int = 0
    sessions_completed: int = 0
    steps: int = 0
    wrong: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    # (time.monotonic() when the reply came, latency) per step, for latency over time
    timeline: list[tuple[float, float]] = field(default_factory=list)
    # time.monotonic() when each completed session had its last reply
    completion_times: list[float] = field(default_factory=list)
    # streams reopened because their replica did not run a step (drain, moving sequence)
    stream_reopens: int = 0
    # time.monotonic() of each error and wrong answer
    failure_times: list[float] = field(default_factory=list)

    def failures(self, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for t in self.failure_times if since <= t <= until)

    def percentile_ms(self, q: float, since: float = 0.0, until: float = float("inf")) -> float:
        lat = [lat for t, lat in self.timeline if since <= t <= until]
        return float(np.percentile(lat, q) * 1e3) if lat else float("nan")

    def summary(self) -> str:
        return (
            f"sessions {self.sessions_completed}/{self.sessions_started} complete, steps {self.steps}, "
            f"wrong {len(self.wrong)}, errors {len(self.errors)}"
        )


def step_value(session: int, step: int) -> float:
    """Small integers: their float32 running sums are exact."""
    return float((session * 7 + step * 3) % 11 + 1)


@dataclass
class SessionLoad:
    """`sessions` concurrent workers, each running sessions of `steps` steps back to back
    until `rounds` sessions each are done or `deadline` (time.monotonic()) has passed.

    `pace_s` sleeps between a session's steps; `hold_at`/`hold` slow every session down from
    that step on until the event is set: each step waits for it up to `hold_step_s` (below the
    model's idle timeout, so that a held session does not expire). The test keeps its sessions
    open across the restarts this way;
    `progress(step)` is called after every verified step."""

    url: str
    sessions: int = 24
    steps: int = 60
    rounds: int = 1
    protocol: str = "http"
    model: str = "accumulator"
    pace_s: float = 0.0
    deadline: float = float("inf")
    hold_at: int | None = None
    hold: asyncio.Event | None = None
    hold_step_s: float = 2.0
    progress: Callable[[int], None] | None = None
    stop_on_error: bool = True
    result: LoadResult = field(default_factory=LoadResult)

    async def run(self) -> LoadResult:
        if self.protocol == "http":
            client: Any = httpaio.InferenceServerClient(self.url, conn_limit=self.sessions + 4)
        else:
            client = grpcaio.InferenceServerClient(self.url, channel_args=grpc_channel_args())
        try:
            await asyncio.gather(*(self._worker(client, w) for w in range(self.sessions)))
        finally:
            await client.close()
        return self.result

    async def _worker(self, client: Any, w: int) -> None:
        for rnd in range(self.rounds):
            if time.monotonic() >= self.deadline:
                return
            # a stream names its sequences with sequence_id (its metadata only routes it)
            style = "triton" if self.protocol == "stream" else STYLES[w % 2]
            sid = f"s{w}-{rnd}-{uuid.uuid4().hex[:8]}"
            stream = _Stream(client, sid, self.model) if self.protocol == "stream" else None
            try:
                ok = await self._session(client, stream, w, style, sid)
            finally:
                if stream is not None:
                    self.result.stream_reopens += stream.reopens
                    stream.close()
            if not ok and self.stop_on_error:
                return

    async def _session(self, client: Any, stream: _Stream | None, w: int, style: str, sid: str) -> bool:
        res = self.result
        res.sessions_started += 1
        total = 0.0
        for i in range(self.steps):
            if self.hold is not None and self.hold_at is not None and i >= self.hold_at and not self.hold.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.hold.wait(), self.hold_step_s)
            if time.monotonic() >= self.deadline:
                return False
            last = i == self.steps - 1
            x = step_value(w, i)
            total += x
            headers = {"Inference-Session-Id": sid}
            kwargs: dict[str, object] = {}
            if style == "triton":
                kwargs = {"sequence_id": sid, "sequence_start": i == 0, "sequence_end": last}
            elif last:
                headers["Inference-Session-End"] = "true"
            if self.protocol != "http":  # gRPC metadata keys are lower case
                headers = {k.lower(): v for k, v in headers.items()}
            mod = httpaio if self.protocol == "http" else grpcaio
            inp = mod.InferInput("INPUT", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[x]], dtype=np.float32))
            t0 = time.monotonic()
            try:
                if stream is not None:
                    reply = await stream.step([inp], **kwargs)
                else:
                    reply = await client.infer(self.model, [inp], headers=headers, **kwargs)
            except InferenceServerException as e:
                res.failure_times.append(time.monotonic())
                res.errors.append(f"{sid} step {i}: {e.status()} {e.message()}")
                return False
            except Exception as e:  # a transport failure is an error too, not a crash of the run
                res.failure_times.append(time.monotonic())
                res.errors.append(f"{sid} step {i}: {type(e).__name__}: {e}")
                return False
            t1 = time.monotonic()
            res.steps += 1
            res.latencies_s.append(t1 - t0)
            res.timeline.append((t1, t1 - t0))
            got = float(reply.as_numpy("OUTPUT")[0, 0])
            if got != total:
                res.failure_times.append(t1)
                res.wrong.append(f"{sid} ({style}) step {i}: got {got}, expected {total}")
                return False
            if self.progress is not None:
                self.progress(i)
            if self.pace_s and not last:
                await asyncio.sleep(self.pace_s)
        res.sessions_completed += 1
        res.completion_times.append(time.monotonic())
        return True


class _Stream:
    """One session's ModelStreamInfer through the balancer (routed by its `inference-session-id`
    metadata), one step at a time, reopened when the stream ends with UNAVAILABLE: its replica
    drained (after answering every step it took) or did not run the step. The step, which got
    no reply, did not run: it is sent again on a new stream, which the balancer opens on a
    ready replica."""

    def __init__(self, client: grpcaio.InferenceServerClient, sid: str, model: str, max_reopens: int = 20) -> None:
        self.client, self.sid, self.model, self.max_reopens = client, sid, model, max_reopens
        self.reopens = 0
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.responses: Any = None

    def _open(self) -> None:
        queue = self.queue = asyncio.Queue()

        async def requests() -> Any:
            while (item := await queue.get()) is not None:
                yield item

        self.responses = self.client.stream_infer(requests(), headers=stream_headers(self.sid))

    async def step(self, inputs: list[Any], **kwargs: Any) -> Any:
        while True:
            if self.responses is None:
                self._open()
            await self.queue.put({"model_name": self.model, "inputs": inputs, **kwargs})
            try:
                result, error = await self.responses.__anext__()
            except grpc.aio.AioRpcError as e:
                if not stream_ended(e):
                    raise InferenceServerException(msg=e.details(), status=str(e.code())) from None
                why = f"stream ended: {e.code()} {e.details()}"
            except StopAsyncIteration:
                raise InferenceServerException(msg="the stream ended (OK) without a reply") from None
            else:
                if error is None:
                    return result
                raise error  # with triton_grpc_error, an in-stream error is the step's own
            if self.reopens == self.max_reopens:
                raise InferenceServerException(msg=f"gave up after {self.reopens} reopened streams: {why}")
            self.close()
            await asyncio.sleep(min(0.05 * 2**self.reopens, 1.0))  # the balancer needs ~1 s to notice
            self.reopens += 1

    def close(self) -> None:
        if self.responses is not None:
            self.queue.put_nowait(None)
            self.responses.cancel()
            self.responses = None


@dataclass
class Restart:
    replica: str
    exit_status: int
    exit_s: float  # SIGTERM to exit (the drain and handoff)
    back_s: float  # exit to UP again in HAProxy (startup, readiness, health checks)
    began: float  # time.monotonic() at SIGTERM
    ended: float  # time.monotonic() when HAProxy had it UP again


async def rolling_restart(
    cluster: Cluster, load: SessionLoad, *, after_steps: int = 2, delay_s: float = 0.0, tail_s: float | None = None
) -> list[Restart]:
    """Run `load` while every replica of `cluster` is restarted in turn (SIGTERM, wait for the
    exit, start again, wait until HAProxy has it UP), beginning `delay_s` after every session
    has made `after_steps` steps. If load.hold is set it is set when the restarts are done, so
    sessions held at load.hold_at live across every restart; with `tail_s`, the load stops that
    long after the last restart. Returns the restarts; load.result holds the sessions' outcome."""
    started = asyncio.Event()
    count = 0
    threshold = load.sessions * after_steps

    def progress(step: int) -> None:
        nonlocal count
        if step < after_steps:
            count += 1
            if count >= threshold:
                started.set()

    load.progress = progress
    restarts: list[Restart] = []

    async def restarter() -> None:
        try:
            waiter = asyncio.ensure_future(started.wait())
            await asyncio.wait([waiter, runner], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not started.is_set():
                return  # the load ended (failed) before every session began
            await asyncio.sleep(delay_s)
            for i in range(len(cluster.replicas)):
                t0 = time.monotonic()
                rc, exit_s, back_s = await asyncio.to_thread(cluster.restart, i)
                restarts.append(Restart(cluster.replicas[i].name, rc, exit_s, back_s, t0, time.monotonic()))
        finally:
            if load.hold is not None:
                load.hold.set()
            if tail_s is not None:
                load.deadline = time.monotonic() + tail_s

    runner = asyncio.ensure_future(load.run())
    await asyncio.gather(restarter(), runner)
    return restarts
