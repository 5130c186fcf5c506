"""Triton's QA sequence ensembles for the onnx platform, the models that
`qa/common/gen_qa_sequence_models.py --onnx --ensemble` and `gen_qa_models.py --ensemble` write
into `qa_ensemble_model_repository` (same names, tensor names, maps and configs), built here:

* `simple_onnx[_nobatch]_sequence_<dtype>`: INPUT -> the sequence model -> OUTPUT;
* `sequence_...`: INPUT -> nop -> the sequence model -> OUTPUT;
* `fan_...`: INPUT -> nop -> the sequence model -> nop -> OUTPUT.

The `nop_<TYPE>_-1` helpers are Triton's `identity` backend models (two inputs, each output the
input of the same number, max_batch_size 1024); they are ONNX Identity graphs here, with the
same config otherwise. String ensembles use the simple schedule for every kind (the nop cannot
carry strings), as Triton's generator does. The sequence models are `onnx_models.sequence_model`.
"""

from __future__ import annotations

from pathlib import Path

from onnx import TensorProto, helper

from tests.support import onnx_models as fx

#: Triton's ensemble kinds (gen_ensemble_model_utils.BASIC_ENSEMBLE_TYPES)
KINDS = ("simple", "sequence", "fan")

_CONFIG_TYPE = {"int32": "TYPE_INT32", "float32": "TYPE_FP32", "object": "TYPE_STRING"}
_ONNX_TYPE = {"TYPE_INT32": TensorProto.INT32, "TYPE_FP32": TensorProto.FLOAT}


def nop_model(repo: Path, config_type: str, dims: str = "-1") -> str:
    """`nop_<config_type>_<dims>`: OUTPUT0 = INPUT0, OUTPUT1 = INPUT1."""
    name = f"nop_{config_type}_{dims}"
    onnx_type = _ONNX_TYPE[config_type]
    shape = [None, "d0"]
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]) for i in range(2)],
        name,
        [helper.make_tensor_value_info(f"INPUT{i}", onnx_type, shape) for i in range(2)],
        [helper.make_tensor_value_info(f"OUTPUT{i}", onnx_type, shape) for i in range(2)],
    )
    io = "\n".join(
        f'{kind} [ {{ name: "{kind.upper()}{i}" data_type: {config_type} dims: [ {dims} ] }} ]'
        for kind in ("input", "output")
        for i in range(2)
    )
    config = f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 1024
version_policy: {{ latest {{ num_versions: 1 }} }}
instance_group [ {{ kind: KIND_CPU }} ]
{io}
"""
    fx.save(repo / name, graph, config)
    return name


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def _schedule(kind: str, base: str, nop: str) -> list[str]:
    if kind == "simple":
        return [_step(base, {"INPUT": "INPUT"}, {"OUTPUT": "OUTPUT"})]
    first = _step(nop, {"INPUT0": "INPUT", "INPUT1": "INPUT"}, {"OUTPUT0": "same_input"})
    if kind == "sequence":
        return [first, _step(base, {"INPUT": "same_input"}, {"OUTPUT": "OUTPUT"})]
    return [
        first,
        _step(base, {"INPUT": "same_input"}, {"OUTPUT": "same_output"}),
        _step(nop, {"INPUT0": "same_output", "INPUT1": "same_output"}, {"OUTPUT0": "OUTPUT"}),
    ]


def sequence_ensembles(repo: Path, dtype: str, max_batch: int) -> list[str]:
    """The three ensembles over `onnx[_nobatch]_sequence_<dtype>` (made here too), and the nop
    model they need. Returns the ensembles' names."""
    base = fx.sequence_model(repo, dtype, max_batch)
    config_type = _CONFIG_TYPE[dtype]
    nop = f"nop_{config_type}_-1"
    if dtype != "object" and not (repo / nop).exists():
        nop_model(repo, config_type)
    names = []
    for kind in KINDS:
        name = f"{kind}_onnx{'_nobatch' if max_batch == 0 else ''}_sequence_{dtype}"
        steps = _schedule("simple" if dtype == "object" else kind, base, nop)
        config = f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch}
version_policy: {{ latest {{ num_versions: 1 }} }}
input [ {{ name: "INPUT" data_type: {config_type} dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: {config_type} dims: [ 1 ] }} ]
ensemble_scheduling {{
  step [
    {("," + chr(10) + "    ").join(steps)}
  ]
}}
"""
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config)
        names.append(name)
    return names


# A Triton-style decoupled model: one response per element of X (dims [-1], no batching)
SPLIT_CONFIG = """
name: "split"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

SPLIT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            for v in x.tolist():
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([v], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def split_model(repo: Path) -> None:
    """Writes the decoupled ``split`` model into ``repo``."""
    (repo / "split" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "split" / "config.pbtxt").write_text(SPLIT_CONFIG)
    (repo / "split" / "1" / "model.py").write_text(SPLIT_MODEL)
