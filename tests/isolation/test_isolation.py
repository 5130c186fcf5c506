"""Process isolation of Python models: real child processes, crashes, hangs, restarts.

Every test here starts real children (a fresh interpreter each, about half a second on the
project's machine), so each test keeps to one or two servers. Waits are bounded and never
sleeps used as synchronization: a killed child is awaited through its pidfd, a blocked model
is released through an event the test sets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import sys
import time

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, Server
from seqserve.engine.isolation import channel as channel_mod
from seqserve.engine.isolation.proxy import IsolatedInstance
from tests.support.checks import expect_error
from tests.support.models import copy_model, write_model
from tests.support.paths import DEMO_REPO

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process isolation is tested on Linux")


# Running sum with the sum kept by the server (implicit state), plus the pid of the process
# that ran the batch. INPUT -3 exits the process (code 3); -9 blocks execute for good, or
# until GATE is set (in-process runs).
ACC_MODEL = """
import os
import threading
import numpy as np

GATE = threading.Event()

class Model:
    def initialize(self, ctx):
        self.pid = os.getpid()

    def execute(self, batch):
        x = batch.inputs["INPUT"]
        real = batch.ready[:, None]
        if np.any((x == -3) & real):
            os._exit(3)
        if np.any((x == -9) & real):
            GATE.wait()
        total = batch.states["SUM_IN"] + x
        return {"OUTPUT": total, "SUM_OUT": total, "PID": np.full((batch.size, 1), self.pid, np.int64)}
"""


def acc_config(name: str, *, isolation: str | None = "process", timeout_ms: int | None = None, count: int = 1) -> str:
    params = []
    if isolation is not None:
        params.append(f'{{ key: "isolation" value: {{ string_value: "{isolation}" }} }}')
    if timeout_ms is not None:
        params.append(f'{{ key: "execute_timeout_ms" value: {{ string_value: "{timeout_ms}" }} }}')
    parameters = f"parameters [ {', '.join(params)} ]" if params else ""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }}
]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  direct {{ }}
  state [ {{
    input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }}
  }} ]
}}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{parameters}
"""


async def step(
    s: Server, model: str, sid: int, x: float, *, start: bool = False, end: bool = False
) -> tuple[float, int]:
    r = await s.infer(
        model, {"INPUT": np.array([[x]], np.float32)}, sequence_id=sid, sequence_start=start, sequence_end=end
    )
    return float(r.outputs["OUTPUT"][0, 0]), int(r.outputs["PID"][0, 0])


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Block until process ``pid`` has exited (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return  # exited and reaped already
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        assert ready, f"process {pid} did not exit"
    finally:
        os.close(fd)


def exited_logs(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    """The instance's own lines (not the failed requests' lines, which name a request id)."""
    return [r.getMessage() for r in caplog.records if text in r.getMessage() and "request id" not in r.getMessage()]


# ------------------------------------------------------------------------------ crashes


async def test_crash_fails_only_its_request_and_the_instance_comes_back(repo, serve, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="seqserve.model")
    write_model(repo, "acc", acc_config("acc"), ACC_MODEL)
    write_model(repo, "other", acc_config("other", isolation="thread"), ACC_MODEL)
    s = await serve()
    sums = {1: 0.0, 2: 0.0}
    pid = 0
    for k, (sid, x) in enumerate([(1, 1.0), (2, 10.0), (1, 2.0), (2, 20.0)]):
        sums[sid] += x
        out, pid = await step(s, "acc", sid, x, start=k < 2)
        assert out == sums[sid]
    assert pid != os.getpid()  # it ran in a child
    await step(s, "other", 7, 1.0, start=True)

    err = await expect_error(step(s, "acc", 1, -3.0), Code.UNAVAILABLE)
    assert str(err).startswith(  # then the request id its log line names
        "model 'acc' instance 'acc_0_0' exited unexpectedly (exit code 3); restarting it (request id "
    )

    # Another model never notices.
    assert (await step(s, "other", 7, 2.0))[0] == 3.0
    # The same model's sequences go on from their stored state once the instance is back.
    t0 = time.monotonic()
    sums[2] += 5.0
    out, new_pid = await step(s, "acc", 2, 5.0)
    assert out == sums[2]
    assert time.monotonic() - t0 < 10
    assert new_pid not in (pid, os.getpid())
    sums[1] += 4.0  # the failed step left sequence 1's sum as it was
    assert (await step(s, "acc", 1, 4.0))[0] == sums[1]
    assert len(exited_logs(caplog, "exited unexpectedly")) == 1
    assert len(exited_logs(caplog, "restarted (pid")) == 1


async def test_idle_child_killed_is_restarted_before_the_next_batch(repo, serve, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="seqserve.model")
    write_model(repo, "acc", acc_config("acc"), ACC_MODEL)
    s = await serve()
    out, pid = await step(s, "acc", 1, 1.0, start=True)
    os.kill(pid, 9)
    wait_gone(pid)
    # The batch finds the child gone before it was sent: it runs on the restarted one.
    out, new_pid = await step(s, "acc", 1, 2.0)
    assert out == 3.0 and new_pid != pid
    (msg,) = exited_logs(caplog, "exited unexpectedly")
    assert msg == "model 'acc' instance 'acc_0_0' exited unexpectedly (killed by signal 9, SIGKILL); restarting it"


async def test_crash_loop_backs_off_and_says_so(repo, serve) -> None:
    write_model(repo, "acc", acc_config("acc"), ACC_MODEL)
    s = await serve()
    await step(s, "acc", 1, 1.0, start=True)
    await expect_error(step(s, "acc", 1, -3.0), Code.UNAVAILABLE)
    # The restarted child dies at once too: the next restart waits (backoff), and a batch that
    # arrives meanwhile fails at once, saying why and when the next attempt is.
    await expect_error(step(s, "acc", 1, -3.0), Code.UNAVAILABLE)
    err = await expect_error(step(s, "acc", 1, 1.0), Code.UNAVAILABLE)
    assert str(err).startswith("model 'acc' instance 'acc_0_0' is not available (model 'acc' instance 'acc_0_0' exited")
    assert "the next attempt is in" in str(err)


# ------------------------------------------------------------------------------ timeouts


async def test_hung_isolated_execute_is_killed_and_restarted(repo, serve, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="seqserve.model")
    write_model(repo, "acc", acc_config("acc", timeout_ms=300), ACC_MODEL)
    s = await serve()
    out, pid = await step(s, "acc", 1, 1.0, start=True)
    t0 = time.monotonic()
    err = await expect_error(step(s, "acc", 1, -9.0), Code.UNAVAILABLE)
    assert time.monotonic() - t0 < 5
    assert str(err).startswith(
        "model 'acc' instance 'acc_0_0' did not finish execute within 300 ms; it was killed; restarting it (request id "
    )
    out, new_pid = await step(s, "acc", 1, 2.0)
    assert out == 3.0 and new_pid != pid
    assert len(exited_logs(caplog, "did not finish execute")) == 1


async def test_thread_timeout_fails_the_requests_and_keeps_the_state(repo, serve) -> None:
    write_model(repo, "acc", acc_config("acc", isolation="thread", timeout_ms=200), ACC_MODEL)
    s = await serve()
    await step(s, "acc", 1, 1.0, start=True)
    err = await expect_error(step(s, "acc", 1, -9.0), Code.UNAVAILABLE)
    assert str(err) == (
        "model 'acc' instance 'acc_0_0' did not finish execute within 200 ms (thread isolation: the instance "
        "cannot be stopped and stays busy until execute returns)"
    )
    sys.modules["seqserve_models.acc.v1"].GATE.set()  # the stuck execute returns now
    assert (await step(s, "acc", 1, 2.0))[0] == 3.0  # the timed-out step changed nothing
    stats = s.statistics("acc")[0].inference_stats
    assert stats.fail.count == 1


async def test_shutdown_kills_a_child_stuck_in_execute(repo, serve) -> None:
    write_model(repo, "acc", acc_config("acc"), ACC_MODEL)  # no execute timeout
    s = await serve()
    _, pid = await step(s, "acc", 1, 1.0, start=True)
    stuck = asyncio.create_task(step(s, "acc", 1, -9.0))  # blocks its child for good
    t0 = time.monotonic()
    await asyncio.wait_for(s.shutdown(timeout_s=0), 30)  # the instance is left behind...
    assert time.monotonic() - t0 < 20
    with pytest.raises(InferenceError) as ei:
        await stuck
    assert ei.value.code == Code.UNAVAILABLE
    wait_gone(pid)  # ...and its child does not outlive it


async def test_bad_settings_fail_the_load(repo, serve) -> None:
    write_model(repo, "a", acc_config("a", isolation="fork"), ACC_MODEL)
    write_model(repo, "b", acc_config("b", isolation=None, timeout_ms=-5), ACC_MODEL)
    s = await serve()
    reasons = {e["name"]: e["reason"] for e in s.repository_index()}
    assert reasons["a"] == "model 'a': parameter 'isolation' must be 'thread' or 'process', not 'fork'"
    assert reasons["b"] == (
        "model 'b': parameter 'execute_timeout_ms' must be a whole number of milliseconds (0: no timeout), not '-5'"
    )
    with pytest.raises(InferenceError):
        Server(repo, python_isolation="fork")


# ----------------------------------------------------------------------- loading, unloading

FAILS_INIT = """
class Model:
    def initialize(self, ctx):
        raise ValueError("no weights in " + ctx.name)

    def execute(self, batch):
        return {}
"""

EXITS_ON_IMPORT = """
import os
os._exit(5)
"""

# Writes what finalize saw next to the model, so the test can read it after unload.
FINALIZES = """
import os
from pathlib import Path
import numpy as np

class Model:
    def initialize(self, ctx):
        self.out = ctx.model.model_dir / "finalized.txt"
        self.batches = 0

    def execute(self, batch):
        self.batches += 1
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total, "SUM_OUT": total, "PID": np.full((batch.size, 1), os.getpid(), np.int64)}

    def finalize(self):
        self.out.write_text(f"{os.getpid()} {self.batches}")
"""


async def test_initialization_failures_fail_the_load_with_the_models_words(repo, serve) -> None:
    write_model(repo, "init_t", acc_config("init_t", isolation="thread"), FAILS_INIT)
    write_model(repo, "init_p", acc_config("init_p", count=2), FAILS_INIT)
    write_model(repo, "import_exit", acc_config("import_exit"), EXITS_ON_IMPORT)
    s = await serve()
    reasons = {e["name"]: e["reason"] for e in s.repository_index()}
    assert reasons["init_t"] == "ValueError: no weights in init_t_0_0"
    assert reasons["init_p"] == "ValueError: no weights in init_p_0_0"
    assert (
        reasons["import_exit"]
        == "model 'import_exit' instance 'import_exit_0_0' exited during initialization (exit code 5)"
    )


async def test_unload_runs_finalize_in_the_child(repo, serve) -> None:
    d = write_model(repo, "fin", acc_config("fin"), FINALIZES)
    s = await serve()
    _, pid = await step(s, "fin", 1, 1.0, start=True)
    await step(s, "fin", 1, 1.0, end=True)
    await s.unload_model("fin")
    assert (d / "finalized.txt").read_text() == f"{pid} 2"
    wait_gone(pid, 5)
    await s.load_model("fin")  # and loads again, in a new child
    _, pid2 = await step(s, "fin", 2, 1.0, start=True)
    assert pid2 != pid


async def test_server_default_and_per_model_override(repo, serve) -> None:
    write_model(repo, "default", acc_config("default", isolation=None), ACC_MODEL)
    write_model(repo, "pinned", acc_config("pinned", isolation="thread"), ACC_MODEL)
    s = await serve(python_isolation="process")
    assert (await step(s, "default", 1, 1.0, start=True))[1] != os.getpid()
    assert (await step(s, "pinned", 1, 1.0, start=True))[1] == os.getpid()
    assert isinstance(s.model("default")._instances[0], IsolatedInstance)


def test_cli_option() -> None:
    from seqserve.api.cli import build_parser

    assert build_parser().parse_args(["serve"]).python_isolation == "thread"
    assert build_parser().parse_args(["serve", "--python-isolation", "process"]).python_isolation == "process"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--python-isolation", "fork"])


# --------------------------------------------------------------- same results, no pickling

# A stateful model that exercises every kind of batch data: a BYTES input and output, string
# sequence ids through the CORRID control, START/END/READY controls, an implicit state of three
# floats, and batches of several sequences (Oldest).
EQUAL_MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        h = batch.states["H_IN"]
        x = batch.inputs["X"]
        new = np.tanh(0.5 * h + x + batch.controls["START"].astype(np.float32))
        tags = batch.inputs["TAG"].reshape(-1)
        ids = batch.controls["CORRID"].reshape(-1)
        echo = np.array([t + b"|" + c for t, c in zip(tags, ids)], dtype=object).reshape(-1, 1)
        ends = batch.controls["END"].astype(np.int32)
        return {"Y": new * 2, "H_OUT": new, "ECHO": echo, "ENDED": ends}
"""


def equal_config(name: str, isolation: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [
  {{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }},
  {{ name: "TAG" data_type: TYPE_STRING dims: [ 1 ] }}
]
output [
  {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }},
  {{ name: "ECHO" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "ENDED" data_type: TYPE_INT32 dims: [ 1 ] }}
]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  oldest {{ max_candidate_sequences: 8 max_queue_delay_microseconds: 2000 }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }} ] }}
  ]
  state [ {{
    input_name: "H_IN" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ 3 ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ 3 ] zero_data: true }}
  }} ]
}}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
parameters [ {{ key: "isolation" value: {{ string_value: "{isolation}" }} }} ]
"""


async def test_thread_and_process_agree_step_by_step(repo, serve) -> None:
    write_model(repo, "eq_t", equal_config("eq_t", "thread"), EQUAL_MODEL)
    write_model(repo, "eq_p", equal_config("eq_p", "process"), EQUAL_MODEL)
    s = await serve()
    rng = np.random.default_rng(7)
    steps = 6
    seqs = [f"seq-{k}" for k in range(6)]
    plan = {sid: rng.normal(size=(steps, 3)).astype(np.float32) for sid in seqs}

    async def run(model: str, sid: str) -> list[tuple[list[float], bytes, int]]:
        got = []
        for k in range(steps):
            r = await s.infer(
                model,
                {"X": plan[sid][k][None, :], "TAG": np.array([[f"{sid}:{k}".encode()]], dtype=object)},
                sequence_id=sid,
                sequence_start=k == 0,
                sequence_end=k == steps - 1,
            )
            got.append((r.outputs["Y"][0].tolist(), r.outputs["ECHO"][0, 0], int(r.outputs["ENDED"][0, 0])))
        return got

    for model in ("eq_t", "eq_p"):  # concurrent sequences: multi-request batches
        results = await asyncio.gather(*(run(model, sid) for sid in seqs))
        if model == "eq_t":
            expected = results
        else:
            assert results == expected
    assert expected[0][2][1] == b"seq-0:2|seq-0"
    assert [e[2] for e in expected[0]] == [0] * (steps - 1) + [1]


# Stateless, dynamic batches of requests of several rows: what the model sees of the requests.
ROWS_MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        rows = batch.request_rows
        per_row = np.repeat(np.array(rows, np.int32), rows)[:, None]
        ids = [rid.encode() for rid, n in zip(batch.request_ids, rows) for _ in range(n)]
        wanted = [",".join(w or ()).encode() for w, n in zip(batch.request_outputs, rows) for _ in range(n)]
        return {
            "Y": batch.inputs["X"] * 2,
            "ROWS": per_row,
            "RID": np.array(ids, dtype=object)[:, None],
            "WANTED": np.array(wanted, dtype=object)[:, None],
        }
"""


def rows_config(name: str, isolation: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [
  {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }},
  {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "RID" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "WANTED" data_type: TYPE_STRING dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [ {{ key: "isolation" value: {{ string_value: "{isolation}" }} }} ]
"""


async def test_dynamic_batches_of_multi_row_requests_agree(repo, serve) -> None:
    write_model(repo, "rows_t", rows_config("rows_t", "thread"), ROWS_MODEL)
    write_model(repo, "rows_p", rows_config("rows_p", "process"), ROWS_MODEL)
    s = await serve()
    sizes = [1, 3, 2, 1, 2]
    outputs = [None, None, ["Y", "ROWS", "RID", "WANTED"], ["WANTED", "Y"], None]

    async def one(model: str, k: int) -> dict[str, list]:
        x = np.arange(sizes[k] * 2, dtype=np.float32).reshape(sizes[k], 2) + k
        rid = f"r{k}" if k % 2 else ""
        r = await s.infer(model, {"X": x}, request_id=rid, outputs=outputs[k])
        return {name: value.tolist() for name, value in r.outputs.items()}

    got = {m: await asyncio.gather(*(one(m, k) for k in range(len(sizes)))) for m in ("rows_t", "rows_p")}
    assert got["rows_t"] == got["rows_p"]
    assert got["rows_p"][1]["RID"] == [[b"r1"]] * 3
    assert got["rows_p"][3] == {"WANTED": [[b"WANTED,Y"]], "Y": [[6.0, 8.0]]}
    assert max(r["ROWS"][0][0] for r in got["rows_p"] if "ROWS" in r) == 3


# Ragged inputs (allow_ragged_batch): each request's own part, answered as one array per request.
RAGGED_MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        parts = batch.request_inputs("IN")
        shapes = [",".join(map(str, r)).encode() for r in batch.ragged["IN"].shapes]
        return {
            "OUT": [p * 2 for p in parts],
            "SHAPES": [np.array([[s]] * n, dtype=object) for s, n in zip(shapes, batch.request_rows)],
        }
"""


def ragged_config(name: str, isolation: str) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SHAPES" data_type: TYPE_STRING dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 50000 preferred_batch_size: [ 4 ] }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters [ {{ key: "isolation" value: {{ string_value: "{isolation}" }} }} ]
"""


async def test_ragged_inputs_and_per_request_outputs_agree(repo, serve) -> None:
    write_model(repo, "rg_t", ragged_config("rg_t", "thread"), RAGGED_MODEL)
    write_model(repo, "rg_p", ragged_config("rg_p", "process"), RAGGED_MODEL)
    s = await serve()
    inputs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[9]], np.float32), np.ones((1, 4), np.float32)]
    got = {}
    for model in ("rg_t", "rg_p"):
        out = await asyncio.wait_for(asyncio.gather(*(s.infer(model, {"IN": x}) for x in inputs)), 30)
        got[model] = [{k: v.tolist() for k, v in r.outputs.items()} for r in out]
    assert got["rg_t"] == got["rg_p"]
    assert got["rg_p"][0]["OUT"] == (inputs[0] * 2).tolist()
    assert got["rg_p"][2]["OUT"] == [[2.0] * 4]


BIG_STATE = """
import numpy as np

class Model:
    def execute(self, batch):
        h = batch.states["H_IN"] + batch.inputs["X"]
        return {"H_OUT": h, "S": h.sum(axis=1, keepdims=True)}
"""

BIG_CONFIG = """
name: "big"
backend: "python"
max_batch_size: 2
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "S" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  direct { }
  state [ {
    input_name: "H_IN" output_name: "H_OUT" data_type: TYPE_FP32 dims: [ 262144 ]
    initial_state { name: "zero" data_type: TYPE_FP32 dims: [ 262144 ] zero_data: true }
  } ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters [ { key: "isolation" value: { string_value: "process" } } ]
"""


async def test_tensors_cross_in_shared_memory_not_in_messages(repo, serve, monkeypatch) -> None:
    """1 MiB of state per sequence goes back and forth; every message stays small."""
    sizes: list[int] = []
    send, recv = channel_mod.Channel.send, channel_mod.Channel.recv

    def recording_send(self, body, fds=None):  # type: ignore[no-untyped-def]
        sizes.append(len(body))
        return send(self, body, fds)

    def recording_recv(self, timeout=None):  # type: ignore[no-untyped-def]
        body, fds = recv(self, timeout)
        sizes.append(len(body))
        return body, fds

    write_model(repo, "big", BIG_CONFIG, BIG_STATE)
    s = await serve()
    monkeypatch.setattr(channel_mod.Channel, "send", recording_send)
    monkeypatch.setattr(channel_mod.Channel, "recv", recording_recv)
    for k in range(3):
        r = await s.infer("big", {"X": np.array([[1.0]], np.float32)}, sequence_id=1, sequence_start=k == 0)
        assert float(r.outputs["S"][0, 0]) == (k + 1) * 262144
    assert len(sizes) == 6
    assert max(sizes) < 512, sizes
    assert s.model("big")._instances[0]._writer.slab.slab.size >= 2 * 262144 * 4


# --------------------------------------------------------------- Triton models, decoupled

STREAMS = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        self.name = args["model_instance_name"]

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            if n < 0:  # one response of -n values (larger than the first response slab)
                big = np.arange(-n, dtype=np.int32)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", big)]), flags=1)
                continue
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([-1], np.int32))]))
            t = threading.Thread(target=self.stream, args=(sender, n))
            t.start()
            self.threads.append(t)
        return None

    def stream(self, sender, n):
        for k in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([99], np.int32))]))
        except pb_utils.TritonModelException as e:
            pb_utils.Logger.log_error(f"{self.name} after final: {e}")

    def finalize(self):
        for t in self.threads:
            t.join()
"""

STREAMS_CONFIG = """
name: "streams"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters [ { key: "isolation" value: { string_value: "process" } } ]
"""

# Streams until the client goes; finalize writes what is_cancelled() said next to the model.
UNTIL_CANCELLED = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        self.seen = []
        self.out = args["model_repository"] + "/cancelled.txt"

    def execute(self, requests):
        for request in requests:
            t = threading.Thread(target=self.stream, args=(request, request.get_response_sender()))
            t.start()
            self.threads.append(t)
        return None

    def stream(self, request, sender):
        k = 0
        while not sender.is_cancelled() and k < 100000:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))]))
            k += 1
        self.seen.append(request.is_cancelled())
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for t in self.threads:
            t.join()
        with open(self.out, "w") as f:
            f.write(repr(self.seen))
"""


async def test_decoupled_triton_model_streams_from_its_threads(repo, serve, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="seqserve.model")
    write_model(repo, "streams", STREAMS_CONFIG, STREAMS)
    s = await serve()
    for n in (0, 3, 50):
        got = [int(r.outputs["OUT"][0]) async for r in s.stream("streams", {"N": np.array([n], np.int32)})]
        assert got == [-1, *range(n)]
    (big,) = [r.outputs["OUT"] async for r in s.stream("streams", {"N": np.array([-100_000], np.int32)})]
    assert big.tolist() == list(range(100_000))
    assert s.model("streams").open_responses == 0
    await s.unload_model("streams")  # finalize joins the model's threads: their logs are in
    assert exited_logs(caplog, "after final") and all(
        m.endswith("after final: Unable to send response. Response sender has been closed.")
        for m in exited_logs(caplog, "after final")
    )


async def test_cancelled_stream_is_seen_by_the_isolated_model(repo, serve) -> None:
    d = write_model(repo, "uc", STREAMS_CONFIG.replace('"streams"', '"uc"'), UNTIL_CANCELLED)
    s = await serve()
    got = []
    async for r in s.stream("uc", {"N": np.array([0], np.int32)}):
        got.append(int(r.outputs["OUT"][0]))
        if len(got) == 3:
            break
    assert got == [0, 1, 2]
    await s.unload_model("uc")  # waits for the open request; finalize writes what the model saw
    assert (d / "cancelled.txt").read_text() == "[True]"


async def test_streaming_sum_demo_isolated_matches_in_process(repo, serve) -> None:
    for name, isolation in (("ss_t", "thread"), ("ss_p", "process")):
        d = copy_model(repo, "streaming_sum", name, source=DEMO_REPO)
        cfg = (d / "config.pbtxt").read_text()
        cfg += f'\nparameters [ {{ key: "isolation" value: {{ string_value: "{isolation}" }} }} ]\n'
        (d / "config.pbtxt").write_text(cfg)
    s = await serve()
    chunks = [[1, 2, 3], [4], [], [5, 5], [-20]]
    seen: dict[str, list[list[int]]] = {}
    for name in ("ss_t", "ss_p"):
        seen[name] = []
        for k, chunk in enumerate(chunks):
            inputs = {"CHUNK": np.array(chunk, np.int32)}
            stream = s.stream(name, inputs, sequence_id=11, sequence_start=k == 0)
            seen[name].append([int(r.outputs["PARTIAL"][0]) async for r in stream])
    assert seen["ss_t"] == seen["ss_p"] == [[1, 3, 6], [10], [], [15, 20], [0]]


async def test_crash_fails_open_decoupled_requests(repo, serve) -> None:
    """A child that dies while it still owes responses: those requests get the error."""
    model = STREAMS.replace(
        "        for k in range(n):",
        "        if n == 1234:\n            import os\n            os._exit(4)\n        for k in range(n):",
    )
    write_model(repo, "streams", STREAMS_CONFIG, model)
    s = await serve()
    got: list[int] = []
    with pytest.raises(InferenceError) as ei:
        async for r in s.stream("streams", {"N": np.array([1234], np.int32)}):
            got.append(int(r.outputs["OUT"][0]))
    assert got == [-1]
    assert ei.value.code == Code.UNAVAILABLE
    assert str(ei.value).startswith("model 'streams' instance 'streams_0_0' exited unexpectedly (exit code 4)")
    got2 = [int(r.outputs["OUT"][0]) async for r in s.stream("streams", {"N": np.array([2], np.int32)})]
    assert got2 == [-1, 0, 1]
