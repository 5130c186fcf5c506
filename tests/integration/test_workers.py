"""`seqserve serve --workers N`: front-end worker processes in front of one engine process.

Sequences whose steps arrive on different connections (so on different workers) keep one state
in the engine; a worker killed mid-run is replaced and the sequences go on; an engine that dies
takes its workers down; SIGTERM drains and exits 0; the flag refuses what cannot run."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.checks import wait_until_sync
from tests.support.clients import grpc_input, new_int_id, new_str_id
from tests.support.models import copy_demo_models, write_model
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, run_serve, start_server

SEQUENCES = 32
STEPS = 3


def _children(pid: int) -> list[int]:
    """The worker processes of an engine process (its children)."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry))
    return sorted(kids)


def _workers(srv: ServerProcess, n: int = 2) -> list[int]:
    found: list[int] = []

    def enough() -> bool:
        found[:] = _children(srv.proc.pid)
        return len(found) >= n

    wait_until_sync(enough, f"{n} worker processes run")
    return found


def _established_by_pid(pids: list[int], port: int) -> dict[int, int]:
    """Established TCP connections to ``port`` held by each process (from /proc)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                inodes[inode] = 1
    counts = {}
    for pid in pids:
        n = 0
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    n += 1
        except OSError:
            pass
        counts[pid] = n
    return counts


def _http_step(srv: ServerProcess, seq: int | str, x: float, start: bool, end: bool = False) -> float:
    """One accumulator step on a fresh connection."""
    body = {
        "parameters": {"sequence_id": seq, "sequence_start": start, "sequence_end": end},
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [x]}],
    }
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        doc = json.loads(r.read())
        assert r.status == 200, doc
        return float(doc["outputs"][0]["data"][0])
    finally:
        conn.close()


def _grpc_step(srv: ServerProcess, seq: int | str, x: float, start: bool, end: bool = False) -> float:
    """One accumulator step on a fresh gRPC channel (a new connection)."""
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        result = client.infer("accumulator", [grpc_input(x)], sequence_id=seq, sequence_start=start, sequence_end=end)
        return float(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.close()


def _run_sequences(
    srv: ServerProcess, ids: list[int | str], steps: range, sums: dict[int | str, float], *, end: bool = True
) -> None:
    """Each sequence's ``steps`` over fresh connections, HTTP and gRPC in turn; ``end``: the last
    step ends the sequences (the server then drains at once)."""
    for step in steps:
        for i, seq in enumerate(ids):
            x = float(i + step + 1)
            step_fn = _http_step if (i + step) % 2 == 0 else _grpc_step
            got = step_fn(srv, seq, x, step == 0, end and step == steps[-1])
            sums[seq] = sums.get(seq, 0.0) + x
            assert got == sums[seq], f"sequence {seq} step {step}: {got} != {sums[seq]}"


def _roomy_repo(tmp_path: Path) -> Path:
    """The demo accumulator with a slot for each of the 32 sequences and a long idle timeout
    (a slow machine takes seconds per round of fresh connections)."""
    repo = copy_demo_models(tmp_path / "models", "accumulator")
    config = repo / "accumulator" / "config.pbtxt"
    text = config.read_text().replace(
        "max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: 120000000"
    )
    config.write_text(text.replace("count: 2 kind: KIND_CPU", "count: 4 kind: KIND_CPU"))
    return repo


def test_sequences_over_fresh_connections_spread_over_workers(
    launch: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    srv = launch(_roomy_repo(tmp_path), "--workers", "2")
    workers = _workers(srv)
    # connections held open together land on both workers (they share the listening socket)
    conns = [http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30) for _ in range(16)]
    try:
        for c in conns:
            c.request("GET", "/v2/health/ready")
            assert c.getresponse().read() == b""
        counts = _established_by_pid(workers, srv.http_port)
        assert len(workers) == 2 and all(n > 0 for n in counts.values()), counts
    finally:
        for c in conns:
            c.close()
    ids: list[int | str] = [new_int_id() if i % 2 else new_str_id() for i in range(SEQUENCES)]
    _run_sequences(srv, ids, range(STEPS), {})


def test_gRPC_stream_and_decoupled_model_through_workers(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, "--workers", "2")
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    results: list[object] = []
    client.start_stream(callback=lambda result, error: results.append(error or result))
    seq = new_int_id()
    try:
        for i in range(1, 6):
            client.async_stream_infer(
                "accumulator", [grpc_input(i)], sequence_id=seq, sequence_start=i == 1, request_id=str(i)
            )
        wait_until_sync(lambda: len(results) == 5, "5 stream replies")
    finally:
        client.stop_stream()
        client.close()
    sums = [float(r.as_numpy("OUTPUT")[0, 0]) for r in results]  # type: ignore[attr-defined]
    assert sums == [1, 3, 6, 10, 15]


def test_a_killed_worker_is_replaced_and_sequences_go_on(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    srv = launch(_roomy_repo(tmp_path), "--workers", "2")
    workers = _workers(srv)
    ids: list[int | str] = [new_int_id() for _ in range(8)]
    sums: dict[int | str, float] = {}
    _run_sequences(srv, ids, range(2), sums, end=False)
    victim = workers[0]
    os.kill(victim, signal.SIGKILL)
    wait_until_sync(lambda: f"(pid {victim}) was killed by signal 9; starting a new one" in srv.log(), "the restart")
    wait_until_sync(lambda: len([p for p in _children(srv.proc.pid) if p != victim]) == 2, "a new worker runs")
    deadline = time.monotonic() + 30
    for step in range(2, 4):  # new connections: the sequences' state lives in the engine
        for i, seq in enumerate(ids):
            x = float(i + step + 1)
            while True:
                try:
                    got = (_http_step if (i + step) % 2 == 0 else _grpc_step)(srv, seq, x, False, step == 3)
                    break
                except (ConnectionError, http.client.RemoteDisconnected, grpcclient.InferenceServerException):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)  # a connection the dying worker had accepted
            sums[seq] += x
            assert got == sums[seq]
    assert srv.alive()


def test_workers_exit_when_the_engine_dies(tmp_path: Path) -> None:
    srv = start_server(DEMO_REPO, "--workers", "2", log_dir=tmp_path)
    try:
        workers = _workers(srv)
        srv.proc.kill()
        srv.proc.wait(10)
        wait_until_sync(lambda: not any(os.path.exists(f"/proc/{p}") and _alive(p) for p in workers), "workers exit")
        assert "the engine process" in srv.log() and "is gone; exiting" in srv.log()
    finally:
        for p in _children(srv.proc.pid):
            os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_drains_with_workers_and_exits_0(tmp_path: Path) -> None:
    srv = start_server(DEMO_REPO, "--workers", "2", log_dir=tmp_path, exit_timeout_s=20.0)
    workers = _workers(srv)
    seq = new_int_id()
    assert _http_step(srv, seq, 2.0, True) == 2.0
    srv.terminate()
    time.sleep(0.5)
    assert _grpc_step(srv, seq, 3.0, False) == 5.0  # a running sequence goes on while draining
    body = {"parameters": {"sequence_id": seq, "sequence_end": True}, "inputs": [_input(1.0)]}
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body))
    assert conn.getresponse().status == 200
    conn.close()
    assert srv.wait() == 0, srv.log()
    assert not any(_alive(p) for p in workers)


def test_plain_sequence_steps_take_the_engines_compiled_path(tmp_path: Path) -> None:
    """Steps of plain sequences (no session, scope, trace or parameters) over --workers 2 are
    validated in the workers and run by the engine's compiled path (its counts, logged at exit);
    requests that need the engine's Python (a stream-scoped sequence, a bad request) still work."""
    srv = start_server(_roomy_repo(tmp_path), "--workers", "2", log_dir=tmp_path, exit_timeout_s=30.0)
    _workers(srv)
    ids: list[int | str] = [new_int_id() if i % 2 else new_str_id() for i in range(8)]
    _run_sequences(srv, ids, range(STEPS), {})
    # a wrong shape: the worker's validator sends it the slow way; the engine's words come back
    body = {"parameters": {"sequence_id": new_int_id(), "sequence_start": True}, "inputs": [_input(1.0)]}
    body["inputs"][0]["shape"] = [1, 2]  # type: ignore[index]
    body["inputs"][0]["data"] = [1.0, 2.0]  # type: ignore[index]
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body))
    r = conn.getresponse()
    assert r.status == 400 and "unexpected shape for input 'INPUT'" in r.read().decode()
    conn.close()
    srv.terminate()
    assert srv.wait() == 0, srv.log()
    line = next(x for x in srv.log().splitlines() if "the workers' rings carried" in x)
    fast, slow = (int(n) for n in re.findall(r"carried (\d+) requests .* and (\d+) to", line)[0])
    assert fast >= len(ids) * STEPS and slow >= 1, line


def _input(x: float) -> dict[str, object]:
    return {"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [x]}


@pytest.mark.parametrize("value", ["0", "-1", "junk", "65"])
def test_workers_flag_refuses_what_cannot_run(value: str) -> None:
    done = run_serve("--workers", value, "--model-repository", str(DEMO_REPO))
    assert done.returncode == 2
    assert f"{value} is not a number of worker processes (1-64) or 'auto'" in done.stderr


def test_workers_refuse_servers_that_bind_their_own_port() -> None:
    done = run_serve("--workers", "2", "--grpc-server", "grpcio", "--model-repository", str(DEMO_REPO))
    assert done.returncode == 2
    assert "--workers needs the builtin gRPC server, not grpcio" in done.stderr


def test_numpy_roundtrip_of_every_output_kind(launch: Callable[..., ServerProcess]) -> None:
    """add_sub over a worker: two inputs in, two outputs back, bit for bit."""
    srv = launch(None, "--workers", "2")
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), np.float32)
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        x = grpcclient.InferInput(name, [1, 4], "FP32")
        x.set_data_from_numpy(arr)
        inputs.append(x)
    result = client.infer("add_sub", inputs)
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    client.close()


# Stateless models: Y = 2 X; X < 0 fails the batch; X == 7 holds its instance until the gate
# file exists (after writing the started file), so that a queue can fill. ``gated`` has an
# unbounded queue, ``bounded`` a one-request queue; both take the compiled path.
GATED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ {queue} }}
"""
GATED_MODEL = """
import os
import time

class Model:
    def execute(self, batch):
        x = batch.inputs["X"]
        if (x < 0).any():
            raise ValueError("negative input")
        if (x == 7).any():
            open({started!r}, "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists({gate!r}) and time.monotonic() < deadline:
                time.sleep(0.01)
        return {{"Y": x * 2}}
"""


def _gated_post(srv: ServerProcess, model: str, body: dict[str, object]) -> tuple[int, str]:
    """One request on a fresh connection: (status, body with the engine-made request id of a
    failed batch masked)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=120)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, re.sub(r"\(request id [0-9a-f]+\)", "(request id ID)", r.read().decode())
    finally:
        conn.close()


def _x(value: int, shape: tuple[int, ...] = (1, 1)) -> dict[str, object]:
    return {"inputs": [{"name": "X", "datatype": "INT32", "shape": list(shape), "data": [value] * int(np.prod(shape))}]}


def _full_queue(srv: ServerProcess, gate_dir: Path) -> list[tuple[int, str]]:
    """Two requests to ``bounded`` behind a held one: one of them is refused."""
    with ThreadPoolExecutor(3) as pool:
        held = pool.submit(_gated_post, srv, "bounded", _x(7))
        wait_until_sync(lambda: (gate_dir / "started").exists(), "the held request runs", timeout=60)
        behind = [pool.submit(_gated_post, srv, "bounded", _x(v)) for v in (8, 9)]
        done, _ = wait(behind, timeout=60, return_when=FIRST_COMPLETED)
        (gate_dir / "gate").touch()
        assert held.result(timeout=120)[0] == 200
        answers = [f.result(timeout=120) for f in behind]
        assert done
    # which of the two is refused is a race: the other's result must be its own
    ok = [
        json.loads(b)["outputs"][0]["data"] == [2 * v]
        for v, (status, b) in zip((8, 9), answers, strict=True)
        if status == 200
    ]
    assert all(ok), answers
    return sorted((status, "its result" if status == 200 else b) for status, b in answers)


def _gated_answers(srv: ServerProcess, gate_dir: Path) -> dict[str, object]:
    """What the models answer: results over fresh connections, a bad shape, a failed batch, a
    full queue's refusal, and the failures /metrics counts."""
    got: dict[str, object] = {}
    got["results"] = [_gated_post(srv, "gated", _x(i)) for i in range(1, 7)]
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    x = grpcclient.InferInput("X", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[21]], np.int32))
    got["grpc"] = int(client.infer("gated", [x]).as_numpy("Y")[0, 0])
    client.close()
    got["bad_shape"] = _gated_post(srv, "gated", _x(1, (1, 2)))
    got["failed"] = _gated_post(srv, "gated", _x(-1))
    got["behind"] = _full_queue(srv, gate_dir)
    with urllib.request.urlopen(srv.metrics_url, timeout=30) as r:
        text = r.read().decode()
    got["failures"] = sorted(x for x in text.splitlines() if x.startswith("nv_inference_request_failure{"))
    return got


def _gated_repo(root: Path) -> Path:
    root.mkdir()
    repo = root / "models"
    model = GATED_MODEL.format(started=str(root / "started"), gate=str(root / "gate"))
    write_model(repo, "gated", GATED_CONFIG.format(name="gated", queue=""), model)
    queue = "default_queue_policy { max_queue_size: 1 }"
    write_model(repo, "bounded", GATED_CONFIG.format(name="bounded", queue=queue), model)
    return repo


def test_plain_requests_to_a_stateless_model_take_the_compiled_path_and_read_as_in_one_process(
    tmp_path: Path,
) -> None:
    """Requests to a model without a sequence batcher over --workers 2 run on the engine's
    compiled path (its exit line counts them) and every answer (results, a bad shape, a failed
    batch, a full queue's refusal with its request id, the failure counts) is what one process
    gives, word for word."""
    alone = start_server(_gated_repo(tmp_path / "one"), log_dir=tmp_path, exit_timeout_s=30.0)
    try:
        expected = _gated_answers(alone, tmp_path / "one")
    finally:
        alone.terminate()
        alone.wait()
    srv = start_server(_gated_repo(tmp_path / "two"), "--workers", "2", log_dir=tmp_path, exit_timeout_s=30.0)
    _workers(srv)
    got = _gated_answers(srv, tmp_path / "two")
    assert [json.loads(b)["outputs"][0]["data"] for _, b in got["results"]] == [[2 * i] for i in range(1, 7)]  # type: ignore[attr-defined]
    assert got["grpc"] == 42
    refused = [json.loads(b) for status, b in got["behind"] if status == 503]  # type: ignore[attr-defined]
    assert refused == [{"error": "[request id: <id_unknown>] Exceeds maximum queue size"}], got
    assert got == expected
    srv.terminate()
    assert srv.wait() == 0, srv.log()
    line = next(x for x in srv.log().splitlines() if "the workers' rings carried" in x)
    fast, slow = (int(n) for n in re.findall(r"carried (\d+) requests .* and (\d+) to", line)[0])
    # gated's 6 results, its gRPC request and its failed batch, bounded's 3 (the refusal too); the bad shape
    assert fast >= 11 and slow >= 1, line
