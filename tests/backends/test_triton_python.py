"""Triton-style Python models (`TritonPythonModel` + `triton_python_backend_utils`) on the python
backend. The models below are written the way Triton's qa/python_models are: `SEQUENCE_PY` is
the equivalent of sequence_py (state in a dict keyed by correlation_id, START/END flags),
`SEQUENCE_INT32` of sequence_int32 (START/READY control inputs, max_batch_size 0) and
`ADD_SUB` of add_sub."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError
from seqserve.engine.backends.base import ModelContext
from seqserve.engine.backends.python_batch import PythonBackend
from seqserve.engine.config import load_model_config
from tests.support.models import write_model
from tests.support.process import ServerProcess

# ------------------------------------------------------------------------------ models

SEQUENCE_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.sequences = {}
        self.seen = []
        self.decoupled = self.model_config.get("model_transaction_policy", {}).get("decoupled")

    def next_output(self, request):
        sid = request.correlation_id()
        flags = request.flags()
        self.seen.append((sid, flags))
        if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
            if sid in self.sequences:
                raise pb_utils.TritonModelException("Can't start a new sequence with existing ID")
            self.sequences[sid] = [1]
        else:
            if sid not in self.sequences:
                raise pb_utils.TritonModelException("Need START flag for a sequence ID that doesn't already exist.")
            self.sequences[sid].append(self.sequences[sid][-1] + 1)
        out = self.sequences[sid][-1]
        if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            del self.sequences[sid]
        return pb_utils.Tensor("OUTPUT0", np.array([out], dtype=np.int32))

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                sender = request.get_response_sender()
                out = self.next_output(request)
                for _ in range(int(self.model_config["parameters"]["RESPONSES"]["string_value"])):
                    sender.send(pb_utils.InferenceResponse([out]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        return [pb_utils.InferenceResponse([self.next_output(r)]) for r in requests]
"""

SEQUENCE_PY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
sequence_batching {{
  oldest {{ max_candidate_sequences: 4 max_queue_delay_microseconds: {delay} preserve_ordering: false }}
  max_sequence_idle_microseconds: 10000000
}}
{extra}
"""

SEQUENCE_INT32 = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self.accumulator = np.zeros(1)
        self.max_batch_size = model_config["max_batch_size"]

    def execute(self, requests):
        responses = []
        for request in requests:
            inp = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().astype(np.int32)
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().astype(np.int32)
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().astype(np.int32)
            if self.max_batch_size == 0:
                tmp = np.where(np.equal(start, 1), inp, np.add(self.accumulator, inp))
                self.accumulator = np.where(np.equal(ready, 1), tmp, self.accumulator)
                out = pb_utils.Tensor("OUTPUT", self.accumulator.astype(self.output_dtype))
            else:
                tmp = np.where(np.equal(ready, 1), np.add(start, inp), np.zeros(np.shape(inp), dtype=self.output_dtype))
                out = pb_utils.Tensor("OUTPUT", tmp.astype(self.output_dtype))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""

SEQUENCE_INT32_CONFIG = """
name: "seq_int32"
backend: "python"
max_batch_size: 0
instance_group [ { kind: KIND_GPU count: 4 } ]
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
"""

ADD_SUB = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        self.args = args
        out0 = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        out1 = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(out0["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(out1["data_type"])
        self.batches = []

    def execute(self, requests):
        self.batches.append([(r.request_id(), r.requested_output_names()) for r in requests])
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            a, b = in_0.as_numpy(), in_1.as_numpy()
            if a.dtype.type is np.bytes_ or a.dtype == np.object_:
                a, b = a.astype(np.int32), b.astype(np.int32)
            if (a < 0).any():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)))
                continue
            out_0 = pb_utils.Tensor("OUTPUT0", (a + b).astype(self.output0_dtype))
            out_1 = pb_utils.Tensor("OUTPUT1", (a - b).astype(self.output1_dtype))
            responses.append(pb_utils.InferenceResponse([out_0, out_1]))
        return responses
"""


def add_sub_config(name: str = "add_sub", *, dtype: str = "TYPE_FP32", mbs: int = 0, extra: str = "") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ 16 ] }}, {{ name: "INPUT1" data_type: {dtype} dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: {dtype} dims: [ 16 ] }} ]
instance_group [ {{ kind: KIND_CPU }} ]
{extra}
"""


def model_obj(server, model: str, index: int = 0):
    """The TritonPythonModel object behind instance `index` of a loaded model."""
    return server.model(model)._instances[index]._obj


async def seq_step(s, model, sid, *, start=False, end=False):
    r = await s.infer(
        model, {"INPUT0": np.array([[0]], np.int32)}, sequence_id=sid, sequence_start=start, sequence_end=end
    )
    return r.outputs["OUTPUT0"].reshape(-1).tolist()


# ------------------------------------------------------------------------- sequence_py


async def test_sequence_py_interleaved_sequences(repo, serve):
    write_model(repo, "seq", SEQUENCE_PY_CONFIG.format(name="seq", delay=20000, extra=""), SEQUENCE_PY)
    s = await serve()
    ids = [1, 2**63 + 5, "alpha"]
    for k in range(3):
        got = await asyncio.gather(*(seq_step(s, "seq", i, start=k == 0, end=k == 2) for i in ids))
        assert got == [[k + 1]] * 3
    seen = model_obj(s, "seq").seen
    # correlation_id() is the uint64 or the string id; flags are START=1 / END=2 bits
    assert {sid for sid, _ in seen} == {1, 2**63 + 5, "alpha"}
    assert sorted(f for sid, f in seen if sid == 1) == [0, 1, 2]
    assert model_obj(s, "seq").sequences == {}


async def test_sequence_py_exception_fails_the_batch(repo, serve):
    write_model(repo, "seq", SEQUENCE_PY_CONFIG.format(name="seq", delay=0, extra=""), SEQUENCE_PY)
    s = await serve()
    assert await seq_step(s, "seq", 5, start=True) == [1]
    with pytest.raises(InferenceError) as e:  # START on an id the model still holds
        await seq_step(s, "seq", 5, start=True)
    assert e.value.code == Code.INTERNAL
    assert re.fullmatch(  # Triton's message, then the request id its log line names
        r"Failed to process the request\(s\) for model 'seq_0_0', message: "
        r"TritonModelException: Can't start a new sequence with existing ID \(request id \w+\)",
        str(e.value),
    )
    # the server and the model's other state are fine
    assert await seq_step(s, "seq", 6, start=True, end=True) == [1]


@pytest.mark.parametrize("responses", [0, 1, 3])
async def test_decoupled_sender(repo, serve, responses):
    """sequence_py made decoupled: N responses per request, then a bare final flag."""
    extra = (
        "model_transaction_policy { decoupled: true }\n"
        f'parameters {{ key: "RESPONSES" value: {{ string_value: "{responses}" }} }}'
    )
    write_model(repo, "dec", SEQUENCE_PY_CONFIG.format(name="dec", delay=0, extra=extra), SEQUENCE_PY)
    s = await serve()
    for step in (1, 2):
        got = [
            r.outputs["OUTPUT0"].tolist()
            async for r in s.stream(
                "dec", {"INPUT0": np.array([[0]], np.int32)}, sequence_id=3, sequence_start=step == 1
            )
        ]
        assert got == [[step]] * responses


async def test_final_end_step_reaches_the_model(repo, serve):
    """TIMEOUT_COMPLETE: an idle sequence's final END step is a request with the END flag (no reply)."""
    cfg = SEQUENCE_PY_CONFIG.format(name="seq", delay=0, extra="").replace(
        "max_sequence_idle_microseconds: 10000000",
        "max_sequence_idle_microseconds: 200000 timeout_action: TIMEOUT_COMPLETE",
    )
    write_model(repo, "seq", cfg, SEQUENCE_PY)
    s = await serve()
    assert await seq_step(s, "seq", "idle", start=True) == [1]
    obj = model_obj(s, "seq")
    for _ in range(100):
        if not obj.sequences:
            break
        await asyncio.sleep(0.05)
    assert obj.sequences == {}  # the model saw END and dropped the sequence
    assert obj.seen == [("idle", 1), ("idle", 2)]


# ---------------------------------------------------------------------- sequence_int32


async def test_sequence_int32_controls_without_batching(repo, serve):
    write_model(repo, "seq_int32", SEQUENCE_INT32_CONFIG, SEQUENCE_INT32)
    s = await serve(kind_gpu_on_cpu=True)  # Triton QA's config asks for KIND_GPU

    async def acc(sid, v, **kw):
        r = await s.infer("seq_int32", {"INPUT": np.array([v], np.int32)}, sequence_id=sid, **kw)
        return r.outputs["OUTPUT"].tolist()

    a = [acc(10, 5, sequence_start=True), acc(11, 100, sequence_start=True)]
    assert await asyncio.gather(*a) == [[5], [100]]
    assert await asyncio.gather(acc(10, 3), acc(11, 1)) == [[8], [101]]
    assert await asyncio.gather(acc(10, 10, sequence_end=True), acc(11, -1, sequence_end=True)) == [[18], [100]]
    assert len(s.model("seq_int32")._instances) == 4  # KIND_GPU x4 runs on the CPU (kind_gpu_on_cpu)


# ----------------------------------------------------------------------------- add_sub


async def test_add_sub_and_initialize_args(repo, serve):
    write_model(repo, "add_sub", add_sub_config(), ADD_SUB)
    s = await serve()
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 2, np.float32)
    r = await s.infer("add_sub", {"INPUT0": a, "INPUT1": b}, request_id="r-1")
    np.testing.assert_array_equal(r.outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(r.outputs["OUTPUT1"], a - b)
    assert r.id == "r-1"
    r = await s.infer("add_sub", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"])
    assert list(r.outputs) == ["OUTPUT1"]
    obj = model_obj(s, "add_sub")
    assert obj.batches == [[("r-1", ["OUTPUT0", "OUTPUT1"])], [("", ["OUTPUT1"])]]
    args = obj.args
    assert set(args) == {
        "model_config",
        "model_instance_kind",
        "model_instance_name",
        "model_instance_device_id",
        "model_repository",
        "model_version",
        "model_name",
    }
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_version"] == "1"
    assert args["model_name"] == "add_sub"
    assert Path(args["model_repository"]) == repo / "add_sub"
    cfg = json.loads(args["model_config"])
    assert cfg["max_batch_size"] == 0  # defaults are printed, as Triton does
    assert cfg["input"][0]["dims"] == [16]  # 64-bit ints as numbers


async def test_add_sub_bytes(repo, serve):
    write_model(repo, "add_sub_str", add_sub_config("add_sub_str", dtype="TYPE_STRING"), ADD_SUB)
    s = await serve()
    a = np.array([str(i).encode() for i in range(16)], dtype=object)
    b = np.array([b"1"] * 16, dtype=object)
    r = await s.infer("add_sub_str", {"INPUT0": a, "INPUT1": b})
    assert r.outputs["OUTPUT0"].tolist()[:3] == [1, 2, 3]  # int32 results in a BYTES output


async def test_dynamic_batch_is_split_into_requests_and_errors_stay_per_request(repo, serve, monkeypatch):
    cfg = add_sub_config("add_sub_b", mbs=8, extra="dynamic_batching { max_queue_delay_microseconds: 500000 }")
    write_model(repo, "add_sub_b", cfg, ADD_SUB)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")  # the three requests form one batch
    s = await serve()
    xs = [np.full((n, 16), v, np.float32) for n, v in ((2, 1.0), (1, -1.0), (3, 5.0))]
    calls = [s.infer("add_sub_b", {"INPUT0": x, "INPUT1": x}, request_id=f"q{i}") for i, x in enumerate(xs)]
    ok1, bad, ok2 = await asyncio.gather(*calls, return_exceptions=True)
    assert model_obj(s, "add_sub_b").batches == [[(f"q{i}", ["OUTPUT0", "OUTPUT1"]) for i in range(3)]]
    assert ok1.outputs["OUTPUT0"].shape == (2, 16) and (ok1.outputs["OUTPUT0"] == 2).all()
    assert ok2.outputs["OUTPUT0"].shape == (3, 16) and (ok2.outputs["OUTPUT0"] == 10).all()
    assert isinstance(bad, InferenceError)
    assert bad.code == Code.INVALID_ARG and str(bad) == "negative input"
    st = s.statistics("add_sub_b")[0].inference_stats
    assert (st.success.count, st.fail.count) == (2, 1)


# ------------------------------------------------------------------- contract checks

BROKEN = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.mode = args["model_name"]

    def execute(self, requests):
        if self.mode == "too_few":
            return []
        if self.mode == "not_a_list":
            return pb_utils.InferenceResponse([])
        if self.mode == "wrong_dtype":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.zeros(1, np.float64))])]
        if self.mode == "no_response":
            return [None]
        if self.mode == "sender_single":
            requests[0].get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([[7]], np.int32))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
"""

SIMPLE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


@pytest.mark.parametrize(
    ("mode", "code", "message"),
    [
        (
            "too_few",
            Code.INTERNAL,
            "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
            "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0",
        ),
        ("not_a_list", Code.INTERNAL, "Expected a list in the execute return"),
        ("wrong_dtype", Code.INTERNAL, "produced output 'OUTPUT0' as float64, but its config says INT32"),
        ("no_response", Code.INTERNAL, "returned from execute without a response for this request"),
        ("sender_single", None, None),
    ],
)
async def test_execute_return_is_checked(repo, serve, mode, code, message):
    write_model(repo, mode, SIMPLE_CONFIG.format(name=mode), BROKEN)
    s = await serve()
    call = s.infer(mode, {"INPUT0": np.array([[1]], np.int32)})
    if code is None:
        assert (await call).outputs["OUTPUT0"].tolist() == [[7]]
        return
    with pytest.raises(InferenceError) as e:
        await call
    assert e.value.code == code
    assert message in str(e.value)


def test_model_defines_neither_class(repo):
    write_model(repo, "neither", SIMPLE_CONFIG.format(name="neither"), "class Other:\n    pass\n")
    cfg = load_model_config(repo / "neither")
    ctx = ModelContext("neither", 1, cfg, repo / "neither", repo / "neither" / "1")
    with pytest.raises(InferenceError, match=r"must define a class named 'Model'.*or 'TritonPythonModel'"):
        PythonBackend(ctx)


# ------------------------------------------------------------------ implicit state

STATEFUL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            acc = pb_utils.get_input_tensor_by_name(r, "ACC").as_numpy()
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            new = (acc + x).astype(np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", new), pb_utils.Tensor("ACC_OUT", new)]))
        return out
"""


async def test_implicit_state_for_triton_style_models(repo, serve):
    cfg = (
        SIMPLE_CONFIG.format(name="st")
        + """
sequence_batching {
  state [ { input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" } } ]
}
"""
    )
    write_model(repo, "st", cfg, STATEFUL)
    s = await serve()

    async def step(sid, v, **kw):
        r = await s.infer("st", {"INPUT0": np.array([[v]], np.int32)}, sequence_id=sid, **kw)
        return r.outputs["OUTPUT0"].item()

    assert await asyncio.gather(step(1, 5, sequence_start=True), step(2, 1, sequence_start=True)) == [5, 1]
    assert await asyncio.gather(step(1, 5), step(2, 1, sequence_end=True)) == [10, 2]
    assert await step(1, 1, sequence_end=True) == 11


# ------------------------------------------------------------ the real server + client


def test_real_server_with_tritonclient(tmp_path: Path, launch: Callable[..., ServerProcess]) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    repo = tmp_path / "models"
    write_model(repo, "seq", SEQUENCE_PY_CONFIG.format(name="seq", delay=1000, extra=""), SEQUENCE_PY)
    write_model(repo, "add_sub", add_sub_config(), ADD_SUB)
    srv = launch(repo)  # stopped after the test; must exit 0
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    for k in range(3):
        for sid in (42, "forty-two"):
            inp = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
            inp.set_data_from_numpy(np.zeros((1, 1), np.int32))
            r = g.infer("seq", [inp], sequence_id=sid, sequence_start=k == 0, sequence_end=k == 2)
            assert r.as_numpy("OUTPUT0").tolist() == [k + 1]
    g.close()

    h = httpclient.InferenceServerClient(srv.http_url)
    a = np.arange(16, dtype=np.float32)
    ins = [httpclient.InferInput("INPUT0", [16], "FP32"), httpclient.InferInput("INPUT1", [16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    r = h.infer("add_sub", ins)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * a)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), 0 * a)
    ins[0].set_data_from_numpy(-a - 1)
    with pytest.raises(Exception, match="negative input"):
        h.infer("add_sub", ins)
    h.close()
