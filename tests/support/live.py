"""Live sequences: threads that step accumulator sequences against a running server until
stopped (END every 10 steps, then a new START) and check every sum, with per-step latencies and
a timeout on every step, over raw HTTP, tritonclient gRPC and a ModelStreamInfer stream. The
security suite runs them beside hostile traffic; the bad-input tests beside malformed requests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.support.clients import new_int_id, new_str_id
from tests.support.process import ServerProcess
from tests.support.wire import GRPC_OPTIONS, SERVICE, acc_request, stream_reply_value

LIVE_HTTP_MODEL = "live_acc"  # the security repository's copy of accumulator
LIVE_GRPC_MODEL = "live_acc_corrid"  # the security repository's copy of accumulator_corrid
STEP_TIMEOUT_S = 10.0  # a live step that takes longer is a failure (the server hung)


class LiveSequences:
    """Steppers (threads) that run accumulator sequences until stopped and check every sum:
    "http" (raw JSON over one keep-alive connection, string ids), "grpc" (tritonclient unary,
    uint64 ids, CORRID model) and "stream" (one ModelStreamInfer stream, uint64 ids)."""

    FLAVOURS = ("http", "grpc", "stream")

    def __init__(
        self,
        srv: ServerProcess,
        *,
        flavours: tuple[str, ...] = FLAVOURS,
        pace_s: float = 0.01,
        http_model: str = LIVE_HTTP_MODEL,
        grpc_model: str = LIVE_GRPC_MODEL,
        step_timeout_s: float = STEP_TIMEOUT_S,
    ) -> None:
        self.srv = srv
        self.pace_s = pace_s
        self.http_model = http_model  # implicit state, string ids (also the stream's model)
        self.grpc_model = grpc_model  # a CORRID model, uint64 ids
        self.step_timeout_s = step_timeout_s
        self.stop_event = threading.Event()
        self.steps = dict.fromkeys(flavours, 0)
        self.latencies: dict[str, list[tuple[float, float]]] = {f: [] for f in flavours}  # (start, seconds)
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True) for f in flavours]

    def start(self) -> LiveSequences:
        for t in self.threads:
            t.start()
        return self

    def _guard(self, flavour: str) -> None:
        try:
            getattr(self, "_" + flavour)()
        except Exception as e:  # reported by check() / stop()
            self.failures.append(f"live {flavour} stepper: {type(e).__name__}: {e}")

    def _plan(self) -> Iterator[tuple[int, float, bool, bool, float]]:
        k = 0
        while not self.stop_event.is_set():
            total = 0.0
            for j in range(10):
                value = float(k % 5 + 1)
                total += value
                yield k, value, j == 0, j == 9, total
                k += 1

    def _record(self, flavour: str, t0: float) -> None:
        self.latencies[flavour].append((t0, time.monotonic() - t0))
        self.steps[flavour] += 1
        if self.pace_s:
            time.sleep(self.pace_s)

    def _http(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.http_port, timeout=self.step_timeout_s)
        sid = new_str_id()
        try:
            for _, value, start, end, total in self._plan():
                doc = {
                    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
                    "parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end},
                }
                t0 = time.monotonic()
                conn.request("POST", f"/v2/models/{self.http_model}/infer", body=json.dumps(doc).encode())
                r = conn.getresponse()
                body = r.read()
                if r.status != 200:
                    self.failures.append(f"live http step: {r.status} {body[:200]!r}, expected sum {total}")
                    return
                (out,) = [o for o in json.loads(body)["outputs"] if o["name"] == "OUTPUT"]
                if out["data"] != [total]:
                    self.failures.append(f"live http step: got {out['data']}, expected [{total}]")
                    return
                self._record("http", t0)
        finally:
            conn.close()

    def _grpc(self) -> None:
        cl = grpcclient.InferenceServerClient(self.srv.grpc_url)
        sid = new_int_id()
        try:
            for _, value, start, end, total in self._plan():
                inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
                inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
                t0 = time.monotonic()
                res = cl.infer(
                    self.grpc_model,
                    [inp],
                    sequence_id=sid,
                    sequence_start=start,
                    sequence_end=end,
                    client_timeout=self.step_timeout_s,
                )
                got = float(res.as_numpy("OUTPUT")[0, 0])
                if got != total:
                    self.failures.append(f"live grpc step: got {got}, expected {total}")
                    return
                self._record("grpc", t0)
        finally:
            cl.close()

    def _stream(self) -> None:
        sid = new_int_id()
        out: queue.Queue[bytes | None] = queue.Queue()
        replies: queue.Queue[Any] = queue.Queue()

        def requests() -> Iterator[bytes]:
            while (item := out.get()) is not None:
                yield item

        with grpc.insecure_channel(self.srv.grpc_url, options=GRPC_OPTIONS) as ch:
            call = ch.stream_stream(SERVICE + "ModelStreamInfer")(requests())

            def read() -> None:
                try:
                    for raw in call:
                        replies.put(service_pb2.ModelStreamInferResponse.FromString(raw))
                    replies.put("stream ended")
                except grpc.RpcError as e:
                    replies.put(f"stream ended with {e.code().name}: {e.details()}")

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                for k, value, start, end, total in self._plan():
                    req = acc_request(sid, value, model=self.http_model, start=start, end=end, rid=f"live-{k}")
                    t0 = time.monotonic()
                    out.put(req.SerializeToString())
                    try:
                        reply = replies.get(timeout=self.step_timeout_s)
                    except queue.Empty:
                        self.failures.append(f"live stream step {k}: no reply within {self.step_timeout_s} s")
                        return
                    if isinstance(reply, str):
                        self.failures.append(f"live stream step {k}: {reply}")
                        return
                    if reply.error_message or reply.infer_response.id != f"live-{k}":
                        self.failures.append(
                            f"live stream step {k}: error {reply.error_message!r} id {reply.infer_response.id!r}"
                        )
                        return
                    got = stream_reply_value(reply)
                    if got != total:
                        self.failures.append(f"live stream step {k}: got {got}, expected {total}")
                        return
                    self._record("stream", t0)
            finally:
                out.put(None)
                with contextlib.suppress(Exception):
                    call.cancel()
                reader.join(5)

    # ---------------------------------------------------------------------- checks

    def snapshot(self) -> dict[str, int]:
        return dict(self.steps)

    def problems(self, since: dict[str, int], timeout: float = 5.0) -> list[str]:
        """Why the sequences are not fine: a wrong sum or failed step, or a flavour that made no
        step since `since` within `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.failures:
            if all(self.steps[f] > since.get(f, 0) for f in self.steps):
                break
            time.sleep(0.005)
        out = list(self.failures)
        stuck = [f for f in self.steps if self.steps[f] <= since.get(f, 0)]
        if stuck and not out:
            out.append(f"live sequences made no step within {timeout} s: {stuck} (steps {self.steps})")
        return out

    def max_latency(self, t0: float, t1: float) -> dict[str, float]:
        """Per flavour, the longest step that overlapped [t0, t1] (a step still running at t1
        counts from its start to t1)."""
        out = {}
        for f, lat in self.latencies.items():
            worst = 0.0
            for start, dur in lat:
                if start <= t1 and start + dur >= t0:
                    worst = max(worst, dur)
            out[f] = worst
        return out

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads)

    def stop(self) -> list[str]:
        self.stop_event.set()
        for t in self.threads:
            t.join(self.step_timeout_s * 2)
        return list(self.failures)
