"""The pytorch (TorchScript) backend, with tiny models scripted here. Skipped without torch (an
optional extra), unless SEQSERVE_REQUIRE_TORCH=1."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError
from tests.support.checks import import_torch

torch = import_torch()
nn = torch.nn
Tensor = torch.Tensor

from seqserve.engine.backends.torchscript import load_torchscript  # noqa: E402

# Making TorchScript archives takes torch.jit.script, deprecated since torch 2.10 in favour of
# torch.export, which writes another format (.pt2). The backend serves TorchScript, so the tests
# still script their models, with exactly that notice silenced, in `script_to` only.
_SCRIPT_DEPRECATED = r"`torch\.jit\.script` is deprecated"


def script_to(module: nn.Module, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SCRIPT_DEPRECATED, category=DeprecationWarning)
        torch.jit.script(module).save(str(path))


# ------------------------------------------------------------------------------ models


class AddSub(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return a + b, a - b


class DictModel(nn.Module):
    def forward(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"SUM": inputs["A"] + inputs["B"], "PROD": inputs["A"] * inputs["B"]}


class GRUStep(nn.Module):
    """One GRU step; the hidden state is the implicit state H -> H_NEXT."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(3, 4)

    def forward(self, x: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        h2 = self.cell(x, h)
        return torch.tanh(h2), h2


class LSTMStep(nn.Module):
    """An LSTM step returning (y, (h, c)): nested tuples are flattened."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(2, 3)

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h2, c2 = self.cell(x, (h, c))
        return h2.sum(dim=1, keepdim=True), (h2, c2)


class Controls(nn.Module):
    """OUT = x + 1000*START + 100*END + 10*READY, and the CORRID it saw."""

    def forward(self, x: Tensor, START: Tensor, END: Tensor, READY: Tensor, CORRID: Tensor) -> tuple[Tensor, Tensor]:
        return x + 1000 * START + 100 * END + 10 * READY, CORRID


class OnlyOne(nn.Module):
    def forward(self, INPUT__0: Tensor) -> Tensor:
        return INPUT__0 * 2


def save(repo: Path, name: str, module: nn.Module, config: str) -> Path:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(config))
    script_to(module, d / "1" / "model.pt")
    return d


def io(kind: str, name: str, dims: str = "[ 1 ]", dtype: str = "TYPE_FP32") -> str:
    return f'{kind} [ {{ name: "{name}" data_type: {dtype} dims: {dims} }} ]'


ADD_SUB_CONFIG = """
name: "{name}"
{which}
max_batch_size: 8
{inputs}
{outputs}
dynamic_batching {{ }}
"""


def add_sub_config(name: str, in_names: tuple[str, str], out_names: tuple[str, str], which: str) -> str:
    return ADD_SUB_CONFIG.format(
        name=name,
        which=which,
        inputs="\n".join(io("input", n, "[ 4 ]") for n in in_names),
        outputs="\n".join(io("output", n, "[ 4 ]") for n in out_names),
    )


GRU_CONFIG = """
name: "gru"
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
sequence_batching {
  state [ { input_name: "h" output_name: "H_NEXT" data_type: TYPE_FP32 dims: [ 4 ]
            initial_state { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true name: "zero" } } ]
}
"""

LSTM_CONFIG = """
name: "lstm"
backend: "pytorch"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  state [
    { input_name: "h" output_name: "h_out" data_type: TYPE_FP32 dims: [ 3 ]
      initial_state { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true name: "z" } },
    { input_name: "c" output_name: "c_out" data_type: TYPE_FP32 dims: [ 3 ]
      initial_state { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true name: "z" } }
  ]
}
"""

CONTROLS_CONFIG = """
name: "ctl"
backend: "pytorch"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SEEN_CORRID" data_type: TYPE_UINT64 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


@pytest.fixture(autouse=True)
def _keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


async def load_error(serve: Any, name: str) -> str:
    s = await serve()
    with pytest.raises(InferenceError) as e:
        await s.load_model(name)
    return str(e.value)


# -------------------------------------------------------------------------- outputs


@pytest.mark.parametrize(
    ("ins", "outs", "which"),
    [
        (("a", "b"), ("SUM", "DIFF"), 'platform: "pytorch_libtorch"'),  # by argument name; outputs in order
        (("INPUT__0", "INPUT__1"), ("OUTPUT__1", "OUTPUT__0"), 'backend: "pytorch"'),  # Triton's convention
    ],
    ids=["by_name", "by_index"],
)
async def test_add_sub_outputs(repo, serve, ins, outs, which):
    save(repo, "m", AddSub(), add_sub_config("m", ins, outs, which))
    s = await serve()
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    r = await s.infer("m", {ins[0]: a, ins[1]: b})
    total, diff = (outs[0], outs[1]) if ins[0] == "a" else ("OUTPUT__0", "OUTPUT__1")
    np.testing.assert_array_equal(r.outputs[total], a + b)
    np.testing.assert_array_equal(r.outputs[diff], a - b)
    r = await s.infer("m", {ins[0]: a[:1], ins[1]: b[:1]}, outputs=[diff])
    assert list(r.outputs) == [diff]


async def test_dict_in_dict_out(repo, serve):
    save(repo, "d", DictModel(), add_sub_config("d", ("A", "B"), ("PROD", "SUM"), 'backend: "pytorch"'))
    s = await serve()
    a = np.full((1, 4), 3, np.float32)
    r = await s.infer("d", {"A": a, "B": a})
    assert r.outputs["SUM"].tolist() == [[6.0] * 4]
    assert r.outputs["PROD"].tolist() == [[9.0] * 4]


async def test_missing_output_fails_the_batch(repo, serve):
    cfg = add_sub_config("one", ("INPUT__0", "X"), ("OUTPUT__0", "OUTPUT__1"), 'backend: "pytorch"')
    cfg = cfg.replace(io("input", "X", "[ 4 ]"), "")
    save(repo, "one", OnlyOne(), cfg)
    s = await serve()
    x = np.ones((1, 4), np.float32)
    assert (await s.infer("one", {"INPUT__0": x}, outputs=["OUTPUT__0"])).outputs["OUTPUT__0"].tolist() == [[2.0] * 4]
    with pytest.raises(InferenceError, match="did not produce output 'OUTPUT__1'"):
        await s.infer("one", {"INPUT__0": x})


# ----------------------------------------------------------------------- load errors


async def test_missing_model_file(repo, serve):
    d = save(repo, "m", AddSub(), add_sub_config("m", ("a", "b"), ("S", "D"), 'backend: "pytorch"'))
    (d / "1" / "model.pt").unlink()
    assert "pytorch model file not found" in await load_error(serve, "m")


async def test_not_torchscript(repo, serve):
    d = save(repo, "m", AddSub(), add_sub_config("m", ("a", "b"), ("S", "D"), 'backend: "pytorch"'))
    (d / "1" / "model.pt").write_bytes(b"not a zip archive")
    assert "failed to load TorchScript model" in await load_error(serve, "m")


async def test_input_matches_no_argument(repo, serve):
    save(repo, "m", AddSub(), add_sub_config("m", ("a", "zzz"), ("S", "D"), 'backend: "pytorch"'))
    msg = await load_error(serve, "m")
    assert "input 'zzz' matches no argument of forward(a, b)" in msg


async def test_unfed_argument(repo, serve):
    cfg = add_sub_config("m", ("a", "b"), ("S", "D"), 'backend: "pytorch"').replace(io("input", "b", "[ 4 ]"), "")
    save(repo, "m", AddSub(), cfg)
    assert "forward argument(s) ['b'] get no input, control or state" in await load_error(serve, "m")


async def test_string_tensors_unsupported(repo, serve):
    cfg = add_sub_config("m", ("a", "b"), ("S", "D"), 'backend: "pytorch"').replace(
        'name: "a" data_type: TYPE_FP32', 'name: "a" data_type: TYPE_STRING'
    )
    save(repo, "m", AddSub(), cfg)
    assert "tensor 'a' is TYPE_STRING, which the pytorch backend does not support yet" in await load_error(serve, "m")


def test_loading_torchscript_gives_no_deprecation_notice(tmp_path):
    script_to(OnlyOne(), tmp_path / "m.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = load_torchscript(torch, tmp_path / "m.pt")
    assert m(torch.ones(1)).item() == 2
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning)], [str(w.message) for w in caught]


async def test_without_torch_installed(repo, serve, monkeypatch):
    save(repo, "m", AddSub(), add_sub_config("m", ("a", "b"), ("S", "D"), 'platform: "pytorch_libtorch"'))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    msg = await load_error(serve, "m")
    assert "the pytorch backend needs torch: `pip install '.[torch]'` in the seqserve checkout" in msg


# ---------------------------------------------------------------- state and controls


def gru_reference(path: Path, xs: list[np.ndarray]) -> list[np.ndarray]:
    m = load_torchscript(torch, path)
    h = torch.zeros(1, 4)
    out = []
    with torch.inference_mode():
        for x in xs:
            y, h = m(torch.from_numpy(x.reshape(1, 3)), h)
            out.append(y.numpy().reshape(-1))
    return out


async def test_gru_implicit_state_batched_across_sequences(repo, serve, monkeypatch):
    torch.manual_seed(0)
    d = save(repo, "gru", GRUStep(), GRU_CONFIG)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "2")  # each step of the two sequences forms one batch
    set_threads: list[tuple[str, int]] = []
    real_set_num_threads = torch.set_num_threads

    def recording_set_num_threads(n: int) -> None:
        set_threads.append((threading.current_thread().name, n))
        real_set_num_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", recording_set_num_threads)
    s = await serve()
    rng = np.random.default_rng(1)
    steps = 4
    xs = {sid: [rng.standard_normal(3).astype(np.float32) for _ in range(steps)] for sid in (7, "seven")}
    got: dict[Any, list[np.ndarray]] = {sid: [] for sid in xs}
    for k in range(steps):
        calls = [
            s.infer("gru", {"x": xs[sid][k].reshape(1, 3)}, sequence_id=sid, sequence_start=k == 0, sequence_end=k == 3)
            for sid in xs
        ]
        for sid, r in zip(xs, await asyncio.gather(*calls), strict=True):
            got[sid].append(r.outputs["Y"].reshape(-1))
    for sid in xs:
        np.testing.assert_allclose(
            np.stack(got[sid]), np.stack(gru_reference(d / "1" / "model.pt", xs[sid])), rtol=1e-5
        )
    st = s.statistics("gru")[0]
    assert st.inference_count == 2 * steps and st.execution_count == steps  # two sequences per batch
    # INTRA_OP_THREAD_COUNT: torch's setting is per thread, so it is applied where the model
    # loads and again on the executor thread that runs it (not the event loop's)
    assert set_threads and {n for _, n in set_threads} == {1}
    assert len({name for name, _ in set_threads}) >= 2 and "MainThread" not in {name for name, _ in set_threads}


async def test_lstm_two_states_and_restart(repo, serve):
    torch.manual_seed(0)
    d = save(repo, "lstm", LSTMStep(), LSTM_CONFIG)
    s = await serve()
    m = load_torchscript(torch, d / "1" / "model.pt")

    async def step(v: float, **kw: Any) -> float:
        r = await s.infer("lstm", {"x": np.full((1, 2), v, np.float32)}, sequence_id=1, **kw)
        return float(r.outputs["y"].item())

    h = c = torch.zeros(1, 3)
    expected = []
    with torch.inference_mode():
        for v in (1.0, -0.5, 2.0):
            y, (h, c) = m(torch.full((1, 2), v), h, c)
            expected.append(float(y.item()))
    got = [await step(1.0, sequence_start=True), await step(-0.5), await step(2.0, sequence_end=True)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    # START resets both states to their initial (zero) value
    assert await step(1.0, sequence_start=True, sequence_end=True) == pytest.approx(expected[0], rel=1e-5)


async def test_control_tensors(repo, serve):
    save(repo, "ctl", Controls(), CONTROLS_CONFIG)
    s = await serve()

    async def step(v: int, **kw: Any) -> tuple[int, int]:
        r = await s.infer("ctl", {"x": np.array([[v]], np.int32)}, sequence_id=2**40 + 3, **kw)
        return int(r.outputs["OUT"].item()), int(r.outputs["SEEN_CORRID"].item())

    assert await step(1, sequence_start=True) == (1011, 2**40 + 3)
    assert await step(2) == (12, 2**40 + 3)
    assert await step(3, sequence_end=True) == (113, 2**40 + 3)


async def test_backend_rejects_nothing_else_and_describes(repo, serve):
    save(repo, "m", AddSub(), add_sub_config("m", ("a", "b"), ("S", "D"), 'backend: "pytorch"'))
    s = await serve()
    assert s.model("m").backend.describe() == {"backend": "pytorch", "torch": torch.__version__}
    with pytest.raises(InferenceError) as e:
        await s.infer("m", {"a": np.ones((1, 3), np.float32), "b": np.ones((1, 3), np.float32)})
    assert e.value.code == Code.INVALID_ARG  # shape checked against the config before the model runs
