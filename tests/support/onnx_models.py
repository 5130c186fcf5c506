"""ONNX test models built with the `onnx` helper API, equivalent to the ones Triton's
`qa/common/gen_qa_sequence_models.py` and `gen_qa_implicit_models.py` generate with `--onnx`
(same graphs, tensor names, encodings and configs), plus a few of our own.

* `sequence_model`: OUTPUT = READY * (INPUT + START); no state (the QA "sequence" models).
* `implicit_model`: INPUT_STATE / OUTPUT_STATE implicit state. With an initial state
  OUTPUT = INPUT + INPUT_STATE; without one OUTPUT = INPUT + INPUT_STATE * (READY and not START).
  String models are the identity, as in Triton's generator.
* `controls_model`: echoes each configured control tensor as an output, to check every encoding.
* `add_sub_model`: a stateless two-input model, written without config.pbtxt (autocomplete).

Strings follow Triton's generator: INPUT/OUTPUT are STRING and the graph casts them to INT32
and back; the control tensors are then INT32. "bool" models have INT32 INPUT/OUTPUT and BOOL
controls.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper

# Old enough for every onnxruntime this project supports (>= 1.17: IR 9, opset 20).
IR_VERSION = 8
OPSET = 17

_ONNX_DTYPE = {"int32": TP.INT32, "float32": TP.FLOAT, "object": TP.STRING, "bool": TP.BOOL}
_CONFIG_DTYPE = {
    TP.INT32: "TYPE_INT32",
    TP.FLOAT: "TYPE_FP32",
    TP.STRING: "TYPE_STRING",
    TP.BOOL: "TYPE_BOOL",
    TP.INT64: "TYPE_INT64",
    TP.UINT64: "TYPE_UINT64",
    TP.UINT32: "TYPE_UINT32",
}
NP_DTYPE = {"int32": np.int32, "float32": np.float32, "object": np.object_, "bool": np.int32}


def save(model_dir: Path, graph: onnx.GraphProto, config: str | None, version: int = 1) -> Path:
    """Write `<model_dir>/<version>/model.onnx` (checked by onnx.checker) and config.pbtxt."""
    model = helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[helper.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_dir / str(version) / "model.onnx"))
    if config is not None:
        (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    return model_dir


def model_name(prefix: str, dtype: str, max_batch: int) -> str:
    """Triton's QA names: onnx_sequence_int32, onnx_nobatch_sequence_object, ..."""
    return f"{prefix}{'_nobatch' if max_batch == 0 else ''}_sequence_{dtype}"


def _types(dtype: str) -> tuple[int, int]:
    """(data dtype, control dtype) as the QA generators choose them."""
    data = _ONNX_DTYPE[dtype]
    control = data
    if data == TP.STRING:
        control = TP.INT32
    if data == TP.BOOL:
        data = TP.INT32
    return data, control


def _controls_config(control: int) -> str:
    spec = {TP.INT32: "int32_false_true", TP.FLOAT: "fp32_false_true", TP.BOOL: "bool_false_true"}[control]
    values = "[ 0, 1 ]" if control != TP.FLOAT else "[ 0.0, 1.0 ]"
    return f"""
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START {spec}: {values} }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY {spec}: {values} }} ] }}
  ]"""


def _io_config(data: int, dims: str) -> str:
    t = _CONFIG_DTYPE[data]
    return f"""
input [ {{ name: "INPUT" data_type: {t} dims: {dims} }} ]
output [ {{ name: "OUTPUT" data_type: {t} dims: {dims} }} ]"""


def sequence_model(repo: Path, dtype: str, max_batch: int, variable: bool = False) -> str:
    """gen_qa_sequence_models.create_onnx_modelfile / create_onnx_modelconfig."""
    name = model_name("onnx", dtype, max_batch)
    data, control = _types(dtype)
    batch: list[int | str | None] = [] if max_batch == 0 else [None]
    shape: list[int | str | None] = ["d0"] if variable else [1]
    inputs = [
        helper.make_tensor_value_info("INPUT", data, batch + shape),
        helper.make_tensor_value_info("START", control, [*batch, 1]),
        helper.make_tensor_value_info("READY", control, [*batch, 1]),
    ]
    outputs = [helper.make_tensor_value_info("OUTPUT", data, batch + shape)]
    nodes = [
        helper.make_node("Cast", ["INPUT"], ["_INPUT"], to=TP.INT32)
        if data == TP.STRING
        else helper.make_node("Identity", ["INPUT"], ["_INPUT"])
    ]
    if control == TP.BOOL:
        nodes += [
            helper.make_node("Cast", ["START"], ["_START"], to=TP.INT32),
            helper.make_node("Cast", ["READY"], ["_READY"], to=TP.INT32),
            helper.make_node("Add", ["_INPUT", "_START"], ["add"]),
            helper.make_node("Mul", ["_READY", "add"], ["CAST"]),
        ]
    else:
        nodes += [
            helper.make_node("Add", ["_INPUT", "START"], ["add"]),
            helper.make_node("Mul", ["READY", "add"], ["CAST"]),
        ]
    nodes.append(helper.make_node("Cast", ["CAST"], ["OUTPUT"], to=data))
    config = f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
instance_group [ {{ kind: KIND_CPU }} ]
{_io_config(data, "[ -1 ]" if variable else "[ 1 ]")}
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {_controls_config(control)}
}}
"""
    save(repo / name, helper.make_graph(nodes, name, inputs, outputs), config)
    return name


def implicit_model(repo: Path, dtype: str, max_batch: int, variable: bool = False, initial_state: bool = True) -> str:
    """gen_qa_implicit_models.create_onnx_modelfile (with / without initial state)."""
    name = model_name("onnx", dtype, max_batch)
    data, control = _types(dtype)
    batch: list[int | str | None] = [] if max_batch == 0 else [None]
    shape: list[int | str | None] = ["d0"] if variable else [1]
    inputs = [
        helper.make_tensor_value_info("INPUT_STATE", data, batch + shape),
        helper.make_tensor_value_info("INPUT", data, batch + shape),
        helper.make_tensor_value_info("START", control, [*batch, 1]),
        helper.make_tensor_value_info("READY", control, [*batch, 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("OUTPUT", data, batch + shape),
        helper.make_tensor_value_info("OUTPUT_STATE", data, batch + shape),
    ]
    if data == TP.STRING:
        nodes = [
            helper.make_node("Identity", ["INPUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["INPUT"], ["OUTPUT_STATE"]),
        ]
    elif initial_state:
        nodes = [
            helper.make_node("Add", ["INPUT", "INPUT_STATE"], ["CAST"]),
            helper.make_node("Cast", ["CAST"], ["OUTPUT"], to=data),
            helper.make_node("Cast", ["CAST"], ["OUTPUT_STATE"], to=data),
        ]
    else:
        if control == TP.BOOL:
            nodes = [
                helper.make_node("Not", ["START"], ["_NOT_START"]),
                helper.make_node("And", ["READY", "_NOT_START"], ["cond"]),
            ]
        else:
            nodes = [
                helper.make_node("Cast", ["START"], ["_START_B"], to=TP.BOOL),
                helper.make_node("Not", ["_START_B"], ["_NOT_START"]),
                helper.make_node("Cast", ["READY"], ["_READY_B"], to=TP.BOOL),
                helper.make_node("And", ["_NOT_START", "_READY_B"], ["cond"]),
            ]
        nodes += [
            helper.make_node("Cast", ["cond"], ["cond_i"], to=data),
            helper.make_node("Mul", ["INPUT_STATE", "cond_i"], ["mul_state"]),
            helper.make_node("Add", ["INPUT", "mul_state"], ["CAST"]),
            helper.make_node("Cast", ["CAST"], ["OUTPUT"], to=data),
            helper.make_node("Cast", ["CAST"], ["OUTPUT_STATE"], to=data),
        ]
    t = _CONFIG_DTYPE[data]
    dims = "-1" if variable else "1"
    init = f'initial_state: {{ name: "state init" data_type: {t} dims: 1 zero_data: true }}' if initial_state else ""
    config = f"""
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch}
instance_group [ {{ kind: KIND_CPU }} ]
{_io_config(data, f"[ {dims} ]")}
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {_controls_config(control)}
  state [ {{
    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: {t} dims: {dims}
    {init}
  }} ]
}}
"""
    save(repo / name, helper.make_graph(nodes, name, inputs, outputs), config)
    return name


# Flag encodings: (config list, onnx dtype, false value, true value)
FLAG_ENCODINGS = {
    "int32": ("int32_false_true: [ 5, 7 ]", TP.INT32, 5, 7),
    "fp32": ("fp32_false_true: [ -0.5, 2.25 ]", TP.FLOAT, -0.5, 2.25),
    "bool": ("bool_false_true: [ true, false ]", TP.BOOL, True, False),
}
CORRID_ENCODINGS = {
    "uint64": ("TYPE_UINT64", TP.UINT64),
    "int64": ("TYPE_INT64", TP.INT64),
    "uint32": ("TYPE_UINT32", TP.UINT32),
    "int32": ("TYPE_INT32", TP.INT32),
    "string": ("TYPE_STRING", TP.STRING),
}


def controls_model(repo: Path, name: str, flags: str, corrid: str, max_batch: int = 4) -> str:
    """X (FP32 [1]) -> Y = X; every control tensor echoed as OUT_<control>."""
    spec, flag_type, _, _ = FLAG_ENCODINGS[flags]
    corrid_cfg, corrid_type = CORRID_ENCODINGS[corrid]
    batch: list[int | str | None] = [] if max_batch == 0 else [None]
    controls = [("START", flag_type), ("END", flag_type), ("READY", flag_type), ("CORRID", corrid_type)]
    inputs = [helper.make_tensor_value_info("X", TP.FLOAT, [*batch, 1])]
    outputs = [helper.make_tensor_value_info("Y", TP.FLOAT, [*batch, 1])]
    nodes = [helper.make_node("Identity", ["X"], ["Y"])]
    for c, t in controls:
        inputs.append(helper.make_tensor_value_info(c, t, [*batch, 1]))
        outputs.append(helper.make_tensor_value_info(f"OUT_{c}", t, [*batch, 1]))
        nodes.append(helper.make_node("Identity", [c], [f"OUT_{c}"]))
    outs = ", ".join(f'{{ name: "OUT_{c}" data_type: {_CONFIG_DTYPE[t]} dims: [ 1 ] }}' for c, t in controls)
    config = f"""
name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch}
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}, {outs} ]
sequence_batching {{
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START {spec} }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END {spec} }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY {spec} }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_cfg} }} ] }}
  ]
}}
"""
    save(repo / name, helper.make_graph(nodes, name, inputs, outputs), config)
    return name


def add_sub_model(repo: Path, name: str = "add_sub", *, batch: bool = True, config: str | None = None) -> str:
    """INPUT0, INPUT1 (FP32 [4]) -> OUTPUT0 = sum, OUTPUT1 = difference; no config.pbtxt unless
    given. Without `batch` the graph has fixed shapes [4] (no batch dimension)."""
    shape: list[int | str | None] = ["batch", 4] if batch else [4]
    inputs = [helper.make_tensor_value_info(n, TP.FLOAT, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, TP.FLOAT, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    save(repo / name, helper.make_graph(nodes, name, inputs, outputs), config)
    return name


def scalar_model(repo: Path, name: str = "scalar") -> str:
    """A per-row scalar graph: X [batch] INT64 -> Y = X * 2; no config (autocomplete gives
    dims [1] with an empty reshape)."""
    two = helper.make_tensor("two", TP.INT64, [], [2])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "two"], ["Y"])],
        name,
        [helper.make_tensor_value_info("X", TP.INT64, ["batch"])],
        [helper.make_tensor_value_info("Y", TP.INT64, ["batch"])],
        initializer=[two],
    )
    save(repo / name, graph, None)
    return name
