"""The onnxruntime backend: load checks, Triton's QA sequence / implicit-state ONNX models
(equivalents built in tests/support/onnx_models.py), control inputs in every encoding, batching
across sequences, autocomplete of stateless models, and one run through the real server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import onnxruntime  # noqa: F401  (a runtime dependency: missing, it is an error, not a skip)
import pytest
import tritonclient.grpc
import tritonclient.http

from seqserve.engine import Code, InferenceError, Server
from tests.support import onnx_models as fx

# ------------------------------------------------------------------------------ helpers


async def started(repo: Path, serve) -> Server:
    s = await serve()
    for st in s.repository_index():
        assert st["state"] == "READY", st
    return s


def encode(values: list[int], dtype: str) -> np.ndarray:
    if dtype == "object":
        return np.array([str(v).encode() for v in values], dtype=object)
    return np.array(values, dtype=fx.NP_DTYPE[dtype])


def decode(arr: np.ndarray) -> list[float]:
    return [float(v) for v in arr.reshape(-1)]


def expected_step(kind: str, dtype: str, x: np.ndarray, acc: np.ndarray | None, start: bool) -> np.ndarray:
    if kind == "sequence":
        return x + (1 if start else 0)  # READY * (INPUT + START)
    if dtype == "object":
        return x  # the string implicit-state models are the identity
    return x if start or acc is None else acc + x


async def run_sequences(s: Server, name: str, kind: str, dtype: str, *, nobatch: bool, widths: list[int]) -> None:
    """Interleave one sequence per width (5 steps each; one after another without batching)
    and check every output."""
    rng = np.random.default_rng(len(name))
    seqs = {1000 + i: (w, rng.integers(1, 9, size=5)) for i, w in enumerate(widths)}
    groups = [[sid] for sid in seqs] if nobatch else [list(seqs)]
    for group in groups:
        acc: dict[int, np.ndarray | None] = dict.fromkeys(group)
        for step in range(5):
            calls, wants = [], []
            for sid in group:
                width, values = seqs[sid]
                x = np.full(width, values[step])
                arr = encode(x.tolist(), dtype)
                start, end = step == 0, step == 4
                want = expected_step(kind, dtype, x, acc[sid], start)
                acc[sid] = want
                calls.append(
                    s.infer(
                        name,
                        {"INPUT": arr if nobatch else arr[None]},
                        sequence_id=sid,
                        sequence_start=start,
                        sequence_end=end,
                    )
                )
                wants.append(want)
            results = await asyncio.wait_for(asyncio.gather(*calls), 10)
            for r, want in zip(results, wants, strict=True):
                out = r.outputs["OUTPUT"]
                assert out.shape == ((len(want),) if nobatch else (1, len(want)))
                if dtype == "object":
                    assert out.dtype == object and all(isinstance(v, bytes) for v in out.reshape(-1))
                assert decode(out) == [float(v) for v in want], (name, step)


# ---------------------------------------------------------- Triton's QA sequence models

DTYPES = ["int32", "float32", "object", "bool"]
QA_VARIANTS = {
    # name: (kind, variable shapes, initial state)
    "sequence": ("sequence", False, None),
    "sequence_variable": ("sequence", True, None),
    "implicit_initial_state": ("implicit", False, True),
    "implicit_initial_state_variable": ("implicit", True, True),
    "implicit": ("implicit", False, False),
    "implicit_variable": ("implicit", True, False),
}


@pytest.mark.parametrize("variant", list(QA_VARIANTS))
async def test_qa_sequence_models(repo, serve, variant):
    """Batching (max_batch_size 8) and nobatch variants, int32/fp32/string/bool, fixed and
    variable shapes, implicit state with and without initial state: as Triton's generators
    make them (the nobatch models only for fixed shapes, as there)."""
    kind, variable, initial = QA_VARIANTS[variant]
    names = []
    for dtype in DTYPES:
        for mbs in (8,) if variable else (8, 0):
            if kind == "sequence":
                names.append((fx.sequence_model(repo, dtype, mbs, variable), dtype, mbs))
            else:
                names.append((fx.implicit_model(repo, dtype, mbs, variable, bool(initial)), dtype, mbs))
    s = await started(repo, serve)
    widths = [1, 2, 3, 1, 2, 3] if variable else [1] * 6
    await asyncio.gather(
        *(
            run_sequences(s, name, kind, dtype, nobatch=mbs == 0, widths=widths[:2] if mbs == 0 else widths)
            for name, dtype, mbs in names
        )
    )
    for name, _, mbs in names:
        st = s.statistics(name)[0]
        assert st.inference_count == (10 if mbs == 0 else 30)
        if mbs > 0 and not variable:  # six sequences in lockstep share batches
            assert st.execution_count < st.inference_count, st


async def test_string_padding_rows_do_not_fail_the_batch(repo, serve):
    """A string graph that parses its input (Cast to INT32) gets a real row's data on
    padding rows instead of empty strings, so a batch with holes runs."""
    name = fx.sequence_model(repo, "object", 8)
    s = await started(repo, serve)
    a = s.infer(name, {"INPUT": encode([1], "object")[None]}, sequence_id=1, sequence_start=True)
    b = s.infer(name, {"INPUT": encode([2], "object")[None]}, sequence_id=2, sequence_start=True)
    c = s.infer(name, {"INPUT": encode([3], "object")[None]}, sequence_id=3, sequence_start=True)
    await asyncio.gather(a, b, c)
    # slot 1's sequence has nothing queued: C's step runs with slot 1 (at least) as padding
    r = await asyncio.gather(
        s.infer(name, {"INPUT": encode([10], "object")[None]}, sequence_id=1),
        s.infer(name, {"INPUT": encode([30], "object")[None]}, sequence_id=3),
    )
    assert [decode(x.outputs["OUTPUT"]) for x in r] == [[10.0], [30.0]]


# ------------------------------------------------------------------ Direct batching


async def test_direct_batches_across_sequences(repo, serve, monkeypatch):
    """Four sequences' steps, all queued before the first batch forms, run as three batches
    of four (one session.run each), each sequence keeping its own state."""
    name = fx.implicit_model(repo, "int32", 8)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "12")
    s = await started(repo, serve)
    calls = []
    for step in range(3):
        for sid in (1, 2, 3, 4):
            x = np.array([[sid * 10 + step]], np.int32)
            task = asyncio.ensure_future(
                s.infer(name, {"INPUT": x}, sequence_id=sid, sequence_start=step == 0, sequence_end=step == 2)
            )
            await asyncio.sleep(0)  # queued in this order
            calls.append(task)
    results = await asyncio.wait_for(asyncio.gather(*calls), 10)
    want = [sum(sid * 10 + k for k in range(step + 1)) for step in range(3) for sid in (1, 2, 3, 4)]
    assert [int(r.outputs["OUTPUT"][0, 0]) for r in results] == want
    st = s.statistics(name)[0]
    assert (st.inference_count, st.execution_count) == (12, 3)


# --------------------------------------------------------------------- control inputs

FLAG_IDS = list(fx.FLAG_ENCODINGS)
CORRID_IDS = list(fx.CORRID_ENCODINGS)


@pytest.mark.parametrize("max_batch", [4, 0], ids=["batch", "nobatch"])
async def test_control_inputs_every_encoding(repo, serve, max_batch):
    """START/END/READY as INT32 / FP32 / BOOL (with unusual false/true values) and CORRID as
    UINT64 / INT64 / UINT32 / INT32 / STRING reach the graph with the configured values."""
    models = {}
    for flags in FLAG_IDS:
        for corrid in CORRID_IDS:
            models[(flags, corrid)] = fx.controls_model(repo, f"ctl_{flags}_{corrid}", flags, corrid, max_batch)
    s = await started(repo, serve)
    big = 2**40 + 7  # the 32-bit encodings keep the low 32 bits: 7

    async def check(flags: str, corrid: str, name: str) -> None:
        _, _, false, true = fx.FLAG_ENCODINGS[flags]
        sid: int | str = f"seq-{flags}" if corrid == "string" else big
        steps = [(True, False), (False, False), (False, True), (True, True)]
        for start, end in steps:
            x = np.array([[1.5]] if max_batch else [1.5], np.float32)
            r = await s.infer(name, {"X": x}, sequence_id=sid, sequence_start=start, sequence_end=end)
            out = {k: v.reshape(-1)[0] for k, v in r.outputs.items()}
            shape = (1, 1) if max_batch else (1,)
            assert all(v.shape == shape for v in r.outputs.values()), r.outputs
            assert out["Y"] == 1.5
            assert out["OUT_START"] == (true if start else false)
            assert out["OUT_END"] == (true if end else false)
            assert out["OUT_READY"] == true
            if corrid == "string":
                assert out["OUT_CORRID"] == sid.encode()  # type: ignore[union-attr]
            elif corrid in ("uint32", "int32"):
                assert int(out["OUT_CORRID"]) == 7
            else:
                assert int(out["OUT_CORRID"]) == big

    await asyncio.gather(*(check(f, c, n) for (f, c), n in models.items()))


# ------------------------------------------------------------------------ load errors

SEQ_CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "{input}" data_type: {dtype} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START {start} }} ] }}
    {ready}
  ]
  {state}
}}
"""
READY = ', { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }'
STATE = """state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]"""


def bad_config(name: str, **kw: str) -> str:
    values = {
        "name": name,
        "input": "INPUT",
        "dtype": "TYPE_INT32",
        "dims": "1",
        "start": "int32_false_true: [ 0, 1 ]",
        "ready": READY,
        "state": "",
    } | kw
    return SEQ_CONFIG.format(**values)


LOAD_ERRORS = {
    "input_name": (
        {"input": "IN"},
        "unable to load model 'm': configuration expects input 'IN', but the ONNX graph has no such input; "
        "graph inputs: ['INPUT', 'READY', 'START']",
    ),
    "input_dtype": (
        {"dtype": "TYPE_FP32"},
        "unable to load model 'm', input 'INPUT': configuration expects data type TYPE_FP32, "
        "the ONNX graph has TYPE_INT32",
    ),
    "input_dims": (
        {"dims": "2"},
        "unable to load model 'm', input 'INPUT': configuration dims [-1,2] do not match the ONNX graph's shape [-1,1]",
    ),
    "control_dtype": (
        {"start": "fp32_false_true: [ 0, 1 ]"},
        "unable to load model 'm', sequence control 'START': configuration expects data type TYPE_FP32, "
        "the ONNX graph has TYPE_INT32",
    ),
    "unfed_graph_input": (
        {"ready": ""},
        "unable to load model 'm': ONNX graph input(s) ['READY'] are not in the configuration",
    ),
    "state_not_in_graph": (
        {"state": STATE},
        "unable to load model 'm': configuration expects state input 'INPUT_STATE', but the ONNX graph has "
        "no such input",
    ),
}


@pytest.mark.parametrize("case", list(LOAD_ERRORS))
async def test_load_errors(repo, serve, case):
    overrides, message = LOAD_ERRORS[case]
    src = fx.sequence_model(repo, "int32", 8)
    (repo / src).rename(repo / "m")
    (repo / "m" / "config.pbtxt").write_text(bad_config("m", **overrides))
    s = await serve()
    with pytest.raises(InferenceError) as ei:
        await s.load_model("m")
    assert ei.value.code == Code.INVALID_ARG
    assert message in str(ei.value), str(ei.value)
    assert not s.is_model_ready("m")


async def test_load_error_missing_file_and_batch_dim(repo, serve):
    (repo / "nofile" / "1").mkdir(parents=True)
    (repo / "nofile" / "config.pbtxt").write_text(bad_config("nofile"))
    fx.add_sub_model(
        repo,
        "fixed",
        batch=False,
        config="""
name: "fixed"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
""",
    )
    fx.add_sub_model(
        repo,
        "no_output",
        config="""
name: "no_output"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT9" data_type: TYPE_FP32 dims: [ 4 ] } ]
""",
    )
    s = await serve()
    reasons = {e["name"]: e["reason"] for e in s.repository_index()}
    assert "unable to load model 'nofile': ONNX model file not found: " in reasons["nofile"]
    assert str(repo / "nofile" / "1" / "model.onnx") in reasons["nofile"]
    assert reasons["fixed"] == (
        "unable to load model 'fixed', input 'INPUT0': max_batch_size 8 needs a variable first (batch) dimension, "
        "but the ONNX graph's shape is [4] (set max_batch_size: 0 to give the model whole tensors)"
    )
    assert reasons["no_output"].startswith(
        "unable to load model 'no_output': configuration expects output 'OUTPUT9', but the ONNX graph has no "
        "such output; graph outputs: ['OUTPUT0', 'OUTPUT1']"
    )


async def test_unsupported_platform(repo, serve):
    d = repo / "tf"
    (d / "1" / "model.savedmodel").mkdir(parents=True)
    (d / "config.pbtxt").write_text(
        'name: "tf" platform: "tensorflow_savedmodel" max_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    s = await serve()
    with pytest.raises(InferenceError) as ei:
        await s.load_model("tf")
    msg = str(ei.value)
    assert "no backend for platform 'tensorflow_savedmodel'; supported: " in msg
    assert "onnxruntime_onnx" in msg and "python" in msg


async def test_bad_parameters(repo, serve):
    fx.add_sub_model(
        repo,
        "threads",
        config='name: "threads" backend: "onnxruntime" max_batch_size: 2\n'
        'parameters { key: "intra_op_thread_count" value: { string_value: "many" } }\n',
    )
    s = await serve()
    with pytest.raises(InferenceError, match="parameter 'intra_op_thread_count' must be an integer >= 0, got 'many'"):
        await s.load_model("threads")


async def test_decoupled_is_refused(repo, serve):
    """Only the python backend answers through responders: a decoupled ONNX model would hang."""
    fx.add_sub_model(
        repo,
        "dec",
        config='name: "dec" backend: "onnxruntime" max_batch_size: 2\nmodel_transaction_policy { decoupled: true }\n',
    )
    s = await serve()
    with pytest.raises(InferenceError) as ei:
        await s.load_model("dec")
    assert "backend 'onnxruntime' does not support decoupled models" in str(ei.value)


async def test_thread_parameters_and_graph_level(repo, serve):
    fx.add_sub_model(
        repo,
        "tuned",
        config='name: "tuned" backend: "onnxruntime" max_batch_size: 2\n'
        'parameters [ { key: "intra_op_thread_count" value: { string_value: "1" } },\n'
        '  { key: "inter_op_thread_count" value: { string_value: "1" } },\n'
        '  { key: "execution_mode" value: { string_value: "0" } },\n'
        '  { key: "session.intra_op.allow_spinning" value: { string_value: "0" } } ]\n'
        "optimization { graph { level: 1 } }\n",
    )
    s = await started(repo, serve)
    x = np.ones((2, 4), np.float32)
    r = await s.infer("tuned", {"INPUT0": x, "INPUT1": x})
    assert r.outputs["OUTPUT0"].tolist() == (2 * x).tolist()
    backend = s.model("tuned").backend
    opts = backend._options  # type: ignore[attr-defined]
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)


# ----------------------------------------------------------------------- autocomplete


async def test_autocomplete_stateless_models(repo, serve):
    fx.add_sub_model(repo, "add_sub")  # batchable graph, no config.pbtxt
    fx.add_sub_model(repo, "fixed", batch=False)  # no batch dimension
    fx.scalar_model(repo, "scalar")  # per-row scalars
    fx.add_sub_model(repo, "partial", config='name: "partial" backend: "onnxruntime" max_batch_size: 2\n')
    s = await started(repo, serve)

    cfg = s.model_config_json("add_sub")
    assert (cfg["platform"], cfg["backend"], cfg["max_batch_size"]) == ("onnxruntime_onnx", "onnxruntime", 4)
    assert "dynamic_batching" in cfg
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]] == [
        ("INPUT0", "TYPE_FP32", [4]),
        ("INPUT1", "TYPE_FP32", [4]),
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4]),
        ("OUTPUT1", "TYPE_FP32", [4]),
    ]
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), np.float32)
    r = await s.infer("add_sub", {"INPUT0": a, "INPUT1": b})
    assert r.outputs["OUTPUT0"].tolist() == (a + b).tolist()
    assert r.outputs["OUTPUT1"].tolist() == (a - b).tolist()

    cfg = s.model_config_json("fixed")
    assert cfg["max_batch_size"] == 0 and "dynamic_batching" not in cfg
    assert cfg["input"][0]["dims"] == [4]
    r = await s.infer("fixed", {"INPUT0": a[0], "INPUT1": b[0]})
    assert r.outputs["OUTPUT1"].tolist() == (a[0] - b[0]).tolist()

    cfg = s.model_config_json("scalar")
    assert cfg["input"][0]["dims"] == [1] and cfg["input"][0]["reshape"] == {"shape": []}
    r = await s.infer("scalar", {"X": np.array([[3], [4]], np.int64)})
    assert r.outputs["Y"].tolist() == [[6], [8]]

    cfg = s.model_config_json("partial")
    assert cfg["max_batch_size"] == 2 and [t["name"] for t in cfg["output"]] == ["OUTPUT0", "OUTPUT1"]


async def test_autocomplete_refuses_batching_a_fixed_graph(repo, serve):
    fx.add_sub_model(repo, "fixed", batch=False, config='name: "fixed" max_batch_size: 8\n')
    s = await serve()
    with pytest.raises(InferenceError) as ei:
        await s.load_model("fixed")
    assert (
        "autofill failed for model 'fixed': model does not support batching while non-zero max_batch_size is specified"
    ) in str(ei.value)


async def test_autocomplete_leaves_sequence_tensors_out(repo, serve):
    """A stateful model whose config lists controls and state but no inputs/outputs: the
    graph's other tensors become the inputs and outputs."""
    name = fx.implicit_model(repo, "int32", 8)
    text = (repo / name / "config.pbtxt").read_text()
    start, end = text.index("input ["), text.index("sequence_batching")
    (repo / name / "config.pbtxt").write_text(text[:start] + text[end:])
    s = await started(repo, serve)
    cfg = s.model_config_json(name)
    assert [t["name"] for t in cfg["input"]] == ["INPUT"]
    assert [t["name"] for t in cfg["output"]] == ["OUTPUT"]
    await run_sequences(s, name, "implicit", "int32", nobatch=False, widths=[1, 1])


# --------------------------------------------------------------- the real server


def test_real_server_with_tritonclient(tmp_path, launch):
    """`seqserve serve` on a repository of ONNX models, driven by tritonclient (HTTP + gRPC)."""
    repo = tmp_path / "models"
    repo.mkdir()
    name = fx.implicit_model(repo, "int32", 8)
    strings = fx.sequence_model(repo, "object", 8)
    fx.add_sub_model(repo, "add_sub")  # no config.pbtxt

    srv = launch(repo)  # stopped after the test; must exit 0
    g = tritonclient.grpc.InferenceServerClient(srv.grpc_url)
    h = tritonclient.http.InferenceServerClient(srv.http_url)
    meta = h.get_model_metadata(name)
    assert meta["platform"] == "onnxruntime_onnx"
    total = 0
    for step, value in enumerate([3, 4, 5]):
        inp = tritonclient.grpc.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[value]], np.int32))
        r = g.infer(name, [inp], sequence_id=77, sequence_start=step == 0, sequence_end=step == 2)
        total += value
        assert r.as_numpy("OUTPUT").tolist() == [[total]]

    inp = tritonclient.http.InferInput("INPUT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"41"]], dtype=object))
    r = h.infer(strings, [inp], sequence_id="s-1", sequence_start=True, sequence_end=True)
    assert r.as_numpy("OUTPUT").tolist() == [[b"42"]]  # READY * (INPUT + START)

    a = np.ones((2, 4), np.float32)
    ins = []
    for n in ("INPUT0", "INPUT1"):
        i = tritonclient.http.InferInput(n, [2, 4], "FP32")
        i.set_data_from_numpy(a)
        ins.append(i)
    r = h.infer("add_sub", ins)
    assert r.as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
    cfg = h.get_model_config("add_sub")
    assert cfg["max_batch_size"] == 4
    g.close()
    h.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
