"""Issue 11's "Done when" checks, as tests.

(a) With default flags no client can load, replace or unload a model: model control is off by
    default, as with Triton's `--model-control-mode=none`, and the repository API answers
    503 / UNAVAILABLE (Triton: "explicit model load / unload is not allowed ...", UNAVAILABLE).
(b) A 1 MiB gzip body that inflates to 1 GiB gets 413 within 1 s, while another client's
    sequence steps stay under 100 ms (the longest step overlapping the bomb is measured).
(c) The BYTES amplification request (shape [1, 250000000], 8 bytes of data) gets 400 /
    INVALID_ARGUMENT in under 0.5 s, with under 100 MB growth of the server's resident memory
    (peak VmRSS, from VmHWM after resetting it through /proc/<pid>/clear_refs, and sampled).
(d) A garbage message on a ModelStreamInfer stream, between two valid requests, is answered
    with an error or ends the stream at once (within 1 s), never silence.

(a), (b) and (c) run on servers of their own: (a) must not let a client change the shared
server's models if control turns out to be open, and (b), (c) measure.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2

from tests.support.clients import new_int_id
from tests.support.hostile import Harness, health_live, log_tail, release_sequence
from tests.support.live import LiveSequences
from tests.support.process import ServerProcess, serving
from tests.support.wire import (
    ALLOWED_GRPC,
    BOMB_PREFIX,
    GRPC_OPTIONS,
    RawStream,
    acc_request,
    assert_clean_grpc,
    assert_clean_http,
    bytes_elements,
    error_message,
    grpc_unary,
    gzip_bomb,
    http_bytes,
    http_send,
    infer_path,
    output_values,
    send_raw,
    stream_reply_value,
)

Code = grpc.StatusCode

# ------------------------------------------------------------------ (a) model control


@pytest.fixture(scope="module")
def control_server(security_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with default flags on its own copy of the repository."""
    root = tmp_path_factory.mktemp("control")
    repo = root / "models"
    shutil.copytree(security_repo, repo, ignore=shutil.ignore_patterns("__pycache__"))
    with serving(repo, log_dir=root) as srv:
        yield srv


MARKER_NAME = "model-control-was-open"


def _evil_model(marker: Path) -> bytes:
    """A model whose loading leaves a marker file: proof that client code ran in the server."""
    return (
        f"open({str(marker)!r}, 'w').write('loaded')\n"
        "class Model:\n"
        "    def execute(self, batch):\n"
        "        return {'OUT': batch.inputs['IN'].copy()}\n"
    ).encode()


_X_CONFIG = json.dumps(
    {
        "name": "x",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
)
_ACC_REPLACEMENT = json.dumps(
    {
        "name": "accumulator",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
)


def _http_attempts(marker: Path) -> list[tuple[str, str, dict[str, Any]]]:
    evil = base64.b64encode(_evil_model(marker)).decode()
    return [
        ("http-load-new-model-with-files", "x", {"parameters": {"config": _X_CONFIG, "file:1/model.py": evil}}),
        ("http-replace-model-with-files", "accumulator",
         {"parameters": {"config": _ACC_REPLACEMENT, "file:1/model.py": evil}}),
        ("http-replace-model-config", "accumulator", {"parameters": {"config": _ACC_REPLACEMENT}}),
        ("http-reload-model", "accumulator", {}),
        ("http-load-traversal-file", "x", {"parameters": {"config": _X_CONFIG, "file:../../escape/model.py": evil}}),
    ]  # fmt: skip


HTTP_LOADS = [a[0] for a in _http_attempts(Path("/nonexistent"))]


@pytest.mark.parametrize("attempt", HTTP_LOADS)
def test_http_load_refused_by_default(control_server: ServerProcess, attempt: str) -> None:
    marker = control_server.repo.parent / MARKER_NAME
    (_, model, body) = next(a for a in _http_attempts(marker) if a[0] == attempt)
    reply = http_send(control_server.http_port, "POST", f"/v2/repository/models/{model}/load", body)
    assert_clean_http(reply, {503})


@pytest.mark.parametrize("unload_dependents", [False, True])
def test_http_unload_refused_by_default(control_server: ServerProcess, unload_dependents: bool) -> None:
    body = {"parameters": {"unload_dependents": unload_dependents}}
    reply = http_send(control_server.http_port, "POST", "/v2/repository/models/accumulator/unload", body)
    assert_clean_http(reply, {503})


def _grpc_attempts(marker: Path) -> list[tuple[str, str, Any]]:
    def load(name: str, config: str | None, files: dict[str, bytes]) -> service_pb2.RepositoryModelLoadRequest:
        r = service_pb2.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            r.parameters["config"].string_param = config
        for key, content in files.items():
            r.parameters[key].bytes_param = content
        return r

    evil = _evil_model(marker)
    return [
        ("grpc-load-new-model-with-files", "RepositoryModelLoad", load("x", _X_CONFIG, {"file:1/model.py": evil})),
        ("grpc-replace-model-with-files", "RepositoryModelLoad",
         load("accumulator", _ACC_REPLACEMENT, {"file:1/model.py": evil})),
        ("grpc-reload-model", "RepositoryModelLoad", load("accumulator", None, {})),
        ("grpc-unload-model", "RepositoryModelUnload",
         service_pb2.RepositoryModelUnloadRequest(model_name="accumulator")),
    ]  # fmt: skip


GRPC_CONTROL = [a[0] for a in _grpc_attempts(Path("/nonexistent"))]


@pytest.mark.parametrize("attempt", GRPC_CONTROL)
def test_grpc_model_control_refused_by_default(control_server: ServerProcess, attempt: str) -> None:
    marker = control_server.repo.parent / MARKER_NAME
    (_, method, msg) = next(a for a in _grpc_attempts(marker) if a[0] == attempt)
    with grpc.insecure_channel(control_server.grpc_url, options=GRPC_OPTIONS) as ch:
        reply = grpc_unary(ch, method, msg, timeout=15)
    assert_clean_grpc(reply, {Code.UNAVAILABLE})


def test_models_unchanged_after_control_attempts(control_server: ServerProcess) -> None:
    """After every attempt above: no client file ran or landed, `x` does not exist, and
    accumulator is the original model, serving."""
    repo = control_server.repo
    assert not (repo.parent / MARKER_NAME).exists(), "a model file sent by a client was executed"
    assert not (repo / "x").exists() and not (repo.parent / "escape").exists(), "client files were written"
    reply = http_send(control_server.http_port, "POST", "/v2/repository/index", b"")
    assert reply.status == 200, reply.describe()
    index = {e["name"]: e for e in json.loads(reply.body)}
    assert "x" not in index, index
    assert index["accumulator"].get("state") == "READY", index["accumulator"]
    sid = new_int_id()
    for step, want in ((1.0, 1.0), (2.0, 3.0)):
        params = {"sequence_id": sid, "sequence_start": step == 1.0, "sequence_end": step == 2.0}
        doc = {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [step]}], "parameters": params}
        r = http_send(control_server.http_port, "POST", infer_path(), doc)
        assert r.status == 200 and output_values(r) == [want], r.describe()


# --------------------------------------------------------------- (b) the gzip bomb


def vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


class RssWatch:
    """Peak resident memory of a process over a window: VmHWM after resetting it (when the
    kernel lets us), and VmRSS sampled every 2 ms as a floor."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = vm_kib(pid, "VmRSS")
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.sampled = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.sampled = max(self.sampled, vm_kib(self.pid, "VmRSS"))
            except (OSError, AssertionError):
                return
            time.sleep(0.002)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = self.sampled
        if self.hwm_reset:
            self.peak = max(self.peak, vm_kib(self.pid, "VmHWM"))

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 1024


def test_gzip_bomb_413_fast_while_others_step(launch: Callable[..., ServerProcess], security_repo: Path) -> None:
    srv = launch(security_repo)
    bomb = gzip_bomb(1 << 30, BOMB_PREFIX)
    assert len(bomb) <= 1.1 * (1 << 20), len(bomb)  # ~1 MiB on the wire, 1 GiB inflated
    live = LiveSequences(srv, flavours=("http", "grpc"), pace_s=0.005).start()
    try:
        assert not live.problems({"http": 20, "grpc": 20}, timeout=30), live.failures
        request = http_bytes("POST", infer_path(), bomb, [("Content-Encoding", "gzip")])
        with RssWatch(srv.proc.pid) as rss:
            t0 = time.monotonic()
            reply = send_raw(srv.http_port, request, timeout=60)
            t1 = time.monotonic()
            since = live.snapshot()
            problems = live.problems(since, timeout=10)  # a step that began during the bomb has ended
    finally:
        failures = live.stop()
    worst = live.max_latency(t0, t1)
    info = (
        f"bomb answered {reply.describe()}; the other client's longest step during it: "
        + ", ".join(f"{f} {1000 * s:.0f} ms" for f, s in worst.items())
        + f"; server RSS growth {rss.growth_mb:.0f} MB"
    )
    assert reply.status == 413, info
    error_message(reply)
    assert reply.elapsed < 1.0, info
    assert max(worst.values()) < 0.100, info
    assert not failures and not problems, f"{info}\n{failures or problems}"
    assert srv.alive() and health_live(srv) is None, log_tail(srv)


# ------------------------------------------------------- (c) BYTES amplification


def _amplification_http(srv: ServerProcess) -> tuple[str, float]:
    head = json.dumps({"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1, 250_000_000],
                                   "parameters": {"binary_data_size": 8}}]}).encode()  # fmt: skip
    body = head + bytes_elements(b"abcd")
    reply = send_raw(
        srv.http_port,
        http_bytes("POST", infer_path("echo_bytes"), body, [("Inference-Header-Content-Length", str(len(head)))]),
        timeout=60,
    )
    if reply.status is not None and reply.status != 200:
        error_message(reply)
    return str(reply.status), reply.elapsed


def _amplification_grpc(srv: ServerProcess) -> tuple[str, float]:
    r = service_pb2.ModelInferRequest(model_name="echo_bytes", id="amplify")
    r.inputs.add(name="IN", datatype="BYTES", shape=[1, 250_000_000])
    r.raw_input_contents.append(bytes_elements(b"abcd"))
    with grpc.insecure_channel(srv.grpc_url, options=GRPC_OPTIONS) as ch:
        reply = grpc_unary(ch, "ModelInfer", r, timeout=60)
    return reply.code.name, reply.elapsed


@pytest.mark.parametrize(
    ("send", "want"), [(_amplification_http, "400"), (_amplification_grpc, "INVALID_ARGUMENT")], ids=["http", "grpc"]
)
def test_bytes_amplification_refused_cheaply(
    launch: Callable[..., ServerProcess],
    security_repo: Path,
    send: Callable[[ServerProcess], tuple[str, float]],
    want: str,
) -> None:
    srv = launch(security_repo)
    for _ in range(3):  # warm up the path with valid BYTES requests, so the baseline is steady
        head = json.dumps({"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1, 2],
                                       "parameters": {"binary_data_size": 12}}]}).encode()  # fmt: skip
        ok = send_raw(srv.http_port, http_bytes("POST", infer_path("echo_bytes"), head + bytes_elements(b"ab", b"cd"),
                                                [("Inference-Header-Content-Length", str(len(head)))]))  # fmt: skip
        assert ok.status == 200, ok.describe()
    with RssWatch(srv.proc.pid) as rss:
        status, elapsed = send(srv)
    info = f"answered {status} after {elapsed:.2f} s; server RSS growth {rss.growth_mb:.0f} MB (peak over baseline)"
    assert status == want, info
    assert elapsed < 0.5, info
    assert rss.growth_mb < 100, info
    assert srv.alive() and health_live(srv) is None, log_tail(srv)


# ---------------------------------------------------------- (d) garbage on a stream

GARBAGE = b"\xff" * 16


def test_stream_garbage_between_valid_requests(hostile: Harness) -> None:
    with pytest.raises(Exception, match="Error parsing"):
        service_pb2.ModelInferRequest.FromString(GARBAGE)
    sid = new_int_id()

    def run() -> None:
        stream = RawStream(hostile.channel())
        try:
            stream.send(acc_request(sid, 2.0, start=True, end=False, rid="first"))
            ev = stream.next_event(5.0)
            assert ev is not None and ev.message is not None, ev and ev.describe()
            assert not ev.message.error_message and stream_reply_value(ev.message) == 2.0, ev.describe()
            t0 = time.monotonic()
            stream.send(GARBAGE)
            stream.send(acc_request(sid, 3.0, start=False, end=True, rid="second"))
            ev = stream.next_event(1.0)
            assert ev is not None, "the stream went silent for 1 s after a garbage message"
            assert ev.at - t0 <= 1.0, f"answered after {ev.at - t0:.2f} s: {ev.describe()}"
            if ev.message is None:  # the stream ended: with a status that names a client fault
                assert ev.code in ALLOWED_GRPC, f"the garbage ended the stream with {ev.describe()}"
                return
            assert ev.message.infer_response.id != "second", f"the garbage got no answer: {ev.describe()}"
            assert ev.message.error_message, f"the garbage got a success reply: {ev.describe()}"
            nxt = stream.next_event(5.0)
            assert nxt is not None and nxt.message is not None, nxt and nxt.describe()
            assert not nxt.message.error_message and nxt.message.infer_response.id == "second", nxt.describe()
            assert stream_reply_value(nxt.message) == 5.0, nxt.describe()
        finally:
            stream.cancel()
            release_sequence(hostile.port, "accumulator", sid)

    hostile.run_case("stream-garbage-between-valid", run)
