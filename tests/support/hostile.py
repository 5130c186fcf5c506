"""The server the hostile traffic goes to, and the live sequences that step beside it.

`Harness` owns one `seqserve serve` process (started with `start_server`, default flags) on a
repository of the demo models plus a few test models. A case that kills or wedges the server
fails, and the next case gets a fresh server, so one hole does not hide the others.
`LiveSequences` is `BackgroundSequences` (tests/integration/test_bad_input.py) with the same
stepping plan (END every 10 steps, then a new START, every sum checked), plus a gRPC stream
flavour, per-step latencies, socket timeouts on every step and a little pacing so three
steppers do not eat a 2-core machine. It runs on its own copies of the accumulator models
(`live_acc`, `live_acc_corrid`), so hostile traffic that legitimately fills the demo models'
sequence slots cannot slow it: what it measures is the server as a whole.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.support.clients import new_int_id, new_str_id
from tests.support.models import copy_demo_models, copy_model
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, start_server
from tests.support.wire import GRPC_OPTIONS, SERVICE, acc_request, stream_reply_value

LIVE_HTTP_MODEL = "live_acc"  # a copy of accumulator (implicit state, string ids)
LIVE_GRPC_MODEL = "live_acc_corrid"  # a copy of accumulator_corrid (UINT64 CORRID)
STEP_TIMEOUT_S = 10.0  # a live step that takes longer is a failure (the server hung)


def build_repo(root: Path) -> Path:
    """The demo models the corpus aims at (accumulator, accumulator_corrid, add_sub), their
    live copies, `identity` (every datatype, [-1], max_batch_size 0) and `echo_bytes` (BYTES,
    [-1], max_batch_size 8)."""
    repo = copy_demo_models(root / "models", "accumulator", "accumulator_corrid", "add_sub")
    for src, dst in (("accumulator", LIVE_HTTP_MODEL), ("accumulator_corrid", LIVE_GRPC_MODEL)):
        copy_model(repo, src, dst, source=DEMO_REPO)
    copy_model(repo, "identity")
    copy_model(repo, "echo_bytes")
    return repo


# ---------------------------------------------------------------------- live sequences


class LiveSequences:
    """Steppers (threads) that run accumulator sequences until stopped and check every sum:
    "http" (raw JSON over one keep-alive connection, string ids), "grpc" (tritonclient unary,
    uint64 ids, CORRID model) and "stream" (one ModelStreamInfer stream, uint64 ids)."""

    FLAVOURS = ("http", "grpc", "stream")

    def __init__(self, srv: ServerProcess, *, flavours: tuple[str, ...] = FLAVOURS, pace_s: float = 0.01) -> None:
        self.srv = srv
        self.pace_s = pace_s
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
        conn = http.client.HTTPConnection("127.0.0.1", self.srv.http_port, timeout=STEP_TIMEOUT_S)
        sid = new_str_id()
        try:
            for _, value, start, end, total in self._plan():
                doc = {
                    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
                    "parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end},
                }
                t0 = time.monotonic()
                conn.request("POST", f"/v2/models/{LIVE_HTTP_MODEL}/infer", body=json.dumps(doc).encode())
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
                    LIVE_GRPC_MODEL,
                    [inp],
                    sequence_id=sid,
                    sequence_start=start,
                    sequence_end=end,
                    client_timeout=STEP_TIMEOUT_S,
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
                    req = acc_request(sid, value, model=LIVE_HTTP_MODEL, start=start, end=end, rid=f"live-{k}")
                    t0 = time.monotonic()
                    out.put(req.SerializeToString())
                    try:
                        reply = replies.get(timeout=STEP_TIMEOUT_S)
                    except queue.Empty:
                        self.failures.append(f"live stream step {k}: no reply within {STEP_TIMEOUT_S} s")
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
            t.join(STEP_TIMEOUT_S * 2)
        return list(self.failures)


# ---------------------------------------------------------------------------- harness


def health_live(srv: ServerProcess, timeout: float = 2.0) -> str | None:
    """None if /v2/health/live answers 200 within `timeout`, else what happened."""
    try:
        with urllib.request.urlopen(srv.base_url + "/v2/health/live", timeout=timeout) as r:
            return None if r.status == 200 else f"/v2/health/live answered {r.status}"
    except Exception as e:
        return f"/v2/health/live failed: {type(e).__name__}: {e}"


def log_tail(srv: ServerProcess, n: int = 3000) -> str:
    try:
        return srv.log()[-n:]
    except OSError:
        return "<no log>"


class Harness:
    """One hostile-traffic server plus live sequences; restarted when a case breaks them."""

    def __init__(self, repo: Path, log_dir: Path) -> None:
        self.repo = repo
        self.log_dir = log_dir
        self.srv: ServerProcess | None = None
        self.live: LiveSequences | None = None
        self.generation = 0
        self._channel: grpc.Channel | None = None
        self.restarts: list[str] = []

    # lifecycle
    def start(self) -> None:
        self.srv = start_server(self.repo, log_dir=self.log_dir)
        self.generation += 1
        self._start_live()

    def _start_live(self) -> None:
        assert self.srv is not None
        self.live = LiveSequences(self.srv).start()
        problems = self.live.problems({f: 2 for f in self.live.steps}, timeout=30)
        assert not problems, f"live sequences do not run on a fresh server: {problems}\n{log_tail(self.srv)}"

    def _stop_live(self) -> list[str]:
        failures = self.live.stop() if self.live is not None else []
        self.live = None
        return failures

    def _kill(self) -> None:
        self._stop_live()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self.srv is not None and self.srv.alive():
            self.srv.proc.kill()
            self.srv.proc.wait(10)
        self.srv = None

    def ensure(self) -> None:
        """Before a case: a live, answering server with healthy live sequences."""
        if self.srv is None:
            self.start()
            return
        why = None if self.srv.alive() else f"server exited with {self.srv.proc.returncode}"
        why = why or health_live(self.srv)
        if why:
            self.restarts.append(why)
            self._kill()
            self.start()
            return
        assert self.live is not None
        if self.live.failures or not self.live.alive():
            self.restarts.append(f"live sequences restarted after: {self.live.failures}")
            self._stop_live()
            self._start_live()

    def close(self) -> int:
        """Stop the live sequences (their failures were reported by the cases) and the server;
        returns the server's exit code."""
        self._stop_live()
        if self._channel is not None:
            self._channel.close()
        return self.srv.stop() if self.srv is not None else 0

    # access
    @property
    def server(self) -> ServerProcess:
        assert self.srv is not None
        return self.srv

    @property
    def port(self) -> int:
        return self.server.http_port

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.server.grpc_url, options=GRPC_OPTIONS)
        return self._channel

    # checks
    def problems(self, since: dict[str, int], timeout: float = 5.0) -> list[str]:
        """After a case: the server is up and answers, the live sequences stepped on with correct
        sums. Returns what is wrong (empty: fine)."""
        srv = self.server
        if not srv.alive():
            return [f"the server died (exit {srv.proc.returncode}); log tail:\n{log_tail(srv)}"]
        out = []
        why = health_live(srv)
        if why:
            out.append(why)
        assert self.live is not None
        out += self.live.problems(since, timeout)
        if out:
            out.append(f"server log tail:\n{log_tail(srv)}")
        return out

    def run_case(self, what: str, body: Callable[[], Any]) -> Any:
        """Run one hostile case and check the server and the live sequences after it; every
        problem is reported together, the case's own first."""
        self.ensure()
        assert self.live is not None
        since = self.live.snapshot()
        err: BaseException | None = None
        result = None
        try:
            result = body()
        except AssertionError as e:
            err = e
        problems = self.problems(since)
        if err is not None or problems:
            lines = [f"case {what}:"]
            if err is not None:
                lines.append(str(err))
            lines += problems
            raise AssertionError("\n".join(lines)) from err
        return result


def release_sequence(port: int, model: str, sid: int | str) -> None:
    """Best effort: END a sequence a case may have left open (frees its slot)."""
    doc = {
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}],
        "parameters": {"sequence_id": sid, "sequence_end": True},
    }
    with contextlib.suppress(Exception):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("POST", f"/v2/models/{model}/infer", body=json.dumps(doc).encode())
        c.getresponse().read()
        c.close()
