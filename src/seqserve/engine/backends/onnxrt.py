"""The `onnxruntime` backend (platform `onnxruntime_onnx`): ONNX models run by ONNX Runtime.

`<version>/model.onnx` (or the config's `default_model_filename`) is loaded once per model
instance. At load, every tensor the config names is matched by name with the graph:

* graph inputs  <- config `input`s, `sequence_batching.control_input`s (dims [1]; data type
  from the control: INT32 / FP32 / BOOL for START/END/READY, the CORRID's `data_type`) and
  `sequence_batching.state` input names (the state's dims and data type);
* graph outputs -> config `output`s and the states' output names.

Data types and shapes are checked then (with max_batch_size > 0 the graph's first dimension
must be variable: it is the batch); a mismatch fails the load with a message naming the model,
the tensor, what the config expects and what the graph has. Every graph input must be fed by
one of those.

`execute` feeds the batch (inputs, control tensors, implicit state) to `session.run`, which
releases the GIL, and returns the requested outputs and every output state.

Config `parameters`, as Triton's onnxruntime backend reads them: `intra_op_thread_count`,
`inter_op_thread_count`, `execution_mode` (0 sequential, 1 parallel), `enable_mem_arena`,
`enable_mem_pattern`, `memory.enable_memory_arena_shrinkage` (a run option); any `session.*`
key is passed to ONNX Runtime as a session config entry (e.g. `session.intra_op.allow_spinning`).
`optimization { graph { level } }`: -1 basic, 1 extended, 2 none, otherwise all.

BYTES tensors: ONNX Runtime's Python API carries strings as text, so BYTES inputs are decoded
as UTF-8 (non-UTF-8 data goes in as raw bytes, trailing NUL bytes lost) and string outputs
come back UTF-8 encoded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.base import (
    DEFAULT_MAX_BATCH_SIZE,
    Backend,
    BackendInstance,
    InstanceContext,
    ModelContext,
)
from seqserve.engine.backends.onnxrt_tensors import OnnxPlan, to_bytes, to_text
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.paths import inside
from seqserve.engine.tensors import DATA_TYPES

log = logging.getLogger("seqserve.onnxruntime")

DEFAULT_MODEL_FILENAME = "model.onnx"

_ORT_TYPE: dict[int, str] = {d.config: d.onnx for d in DATA_TYPES}
_FROM_ORT_TYPE = {v: k for k, v in _ORT_TYPE.items()}

_Control = mc.ModelSequenceBatching.Control
_BOOL_KINDS = (_Control.CONTROL_SEQUENCE_START, _Control.CONTROL_SEQUENCE_END, _Control.CONTROL_SEQUENCE_READY)


def _import_ort() -> Any:
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover - onnxruntime is a dependency
        raise InferenceError(Code.INVALID_ARG, f"the onnxruntime backend needs the 'onnxruntime' package: {e}") from e
    return ort


def _type_name(dt: int) -> str:
    try:
        return mc.DataType.Name(dt)
    except ValueError:
        return str(dt)


def _ort_type_name(ort_type: str) -> str:
    dt = _FROM_ORT_TYPE.get(ort_type)
    return _type_name(dt) if dt is not None else ort_type


def _shape_str(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _graph_dims(shape: Any) -> list[int] | None:
    """A NodeArg shape as ints, -1 for symbolic or unknown dimensions; None for unknown rank."""
    if shape is None:
        return None
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


# --------------------------------------------------------------------------- model file


def _model_path(version_dir: Path, cfg: mc.ModelConfig) -> Path:
    where = f"the version folder of model '{cfg.name}'"
    path = inside(version_dir, cfg.default_model_filename or DEFAULT_MODEL_FILENAME, "default_model_filename", where)
    if path.is_dir():  # a model directory (external data): Triton loads model.onnx inside it
        path = path / DEFAULT_MODEL_FILENAME
    return path


#: words of a session config key that names a file or folder ("session.<...>_file_folder_path")
_PATH_WORDS = frozenset({"file", "filename", "filepath", "path", "folder", "dir", "directory"})


def session_entry_value(key: str, value: str, version_dir: Path, model: str) -> str:
    """A ``session.*`` parameter goes to ONNX Runtime as is, except one that names a file or a
    folder (ONNX Runtime reads or writes it): that must be a path inside the model's version
    folder (``seqserve.engine.paths``), and is handed over as that absolute path."""
    words = set(key.replace(".", "_").lower().split("_"))
    if not value or not words & _PATH_WORDS:
        return value
    where = f"the version folder of model '{model}'"
    return str(inside(version_dir, value, f"parameter '{key}'", where))


def _session_options(ort: Any, cfg: mc.ModelConfig, params: Mapping[str, str], version_dir: Path) -> tuple[Any, Any]:
    """SessionOptions and RunOptions from the config's parameters and optimization level."""
    name = cfg.name
    so = ort.SessionOptions()
    ro = ort.RunOptions()

    def as_int(key: str, low: int, high: int | None = None) -> int | None:
        raw = params.get(key, "").strip()
        if not raw:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
            raise InferenceError(Code.INVALID_ARG, f"model '{name}': parameter '{key}' must be {allowed}, got '{raw}'")
        return value

    def as_bool(key: str) -> bool | None:
        raw = params.get(key, "").strip().lower()
        if not raw:
            return None
        if raw in ("1", "true", "on", "yes"):
            return True
        if raw in ("0", "false", "off", "no"):
            return False
        raise InferenceError(Code.INVALID_ARG, f"model '{name}': parameter '{key}' must be true or false, got '{raw}'")

    intra = as_int("intra_op_thread_count", 0)
    if intra:
        so.intra_op_num_threads = intra
    inter = as_int("inter_op_thread_count", 0)
    if inter:
        so.inter_op_num_threads = inter
    mode = as_int("execution_mode", 0, 1)
    if mode is not None:
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    arena = as_bool("enable_mem_arena")
    if arena is not None:
        so.enable_cpu_mem_arena = arena
    pattern = as_bool("enable_mem_pattern")
    if pattern is not None:
        so.enable_mem_pattern = pattern
    shrink = params.get("memory.enable_memory_arena_shrinkage", "").strip()
    if shrink:
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrink)
    for key, value in params.items():
        if key.startswith("session."):
            so.add_session_config_entry(key, session_entry_value(key, value, version_dir, name))

    level = cfg.optimization.graph.level if cfg.optimization.HasField("graph") else 0
    so.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return so, ro


def _providers(ort: Any, device: str, model: str) -> list[Any]:
    """CPU, or CUDA first on a `cuda:N` instance when this onnxruntime build has it."""
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" in ort.get_available_providers():
            index = int(device.partition(":")[2] or 0)
            return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        log.warning(
            "model '%s': instance on %s, but this onnxruntime has no CUDAExecutionProvider; running on CPU",
            model,
            device,
        )
    return ["CPUExecutionProvider"]


def _open_session(ort: Any, path: Path, model: str, so: Any, providers: list[Any]) -> Any:
    if not path.is_file():
        raise InferenceError(Code.INVALID_ARG, f"unable to load model '{model}': ONNX model file not found: {path}")
    try:
        return ort.InferenceSession(str(path), sess_options=so, providers=providers)
    except Exception as e:
        raise InferenceError(
            Code.INVALID_ARG, f"unable to load model '{model}': ONNX Runtime cannot load {path}: {e}"
        ) from e


# ----------------------------------------------------------------------- config <-> graph


@dataclass(slots=True, frozen=True)
class _Tensor:
    """A tensor the config expects the graph to have."""

    name: str
    role: str  # "input", "sequence control", "state input", "output", "state output"
    data_type: int
    dims: tuple[int, ...]  # without the batch dimension (the reshape, when one is given)
    reshape: tuple[int, ...] | None = None  # the config dims, when the model sees other ones


def _control_tensors(sb: mc.ModelSequenceBatching) -> list[_Tensor]:
    out = []
    for ci in sb.control_input:
        dt = None
        for c in ci.control:  # several kinds on one tensor: the later one wins, as in the core
            if c.kind in _BOOL_KINDS:
                if len(c.int32_false_true) == 2:
                    dt = mc.TYPE_INT32
                elif len(c.fp32_false_true) == 2:
                    dt = mc.TYPE_FP32
                else:
                    dt = mc.TYPE_BOOL
            else:
                dt = c.data_type
        if dt is not None:
            out.append(_Tensor(ci.name, "sequence control", dt, (1,)))
    return out


def _expected(cfg: mc.ModelConfig) -> tuple[list[_Tensor], list[_Tensor]]:
    """(inputs, outputs) the graph must provide."""
    inputs = []
    for t in cfg.input:
        if t.HasField("reshape"):
            inputs.append(_Tensor(t.name, "input", t.data_type, tuple(t.reshape.shape), tuple(t.dims)))
        else:
            inputs.append(_Tensor(t.name, "input", t.data_type, tuple(t.dims)))
    outputs = []
    for o in cfg.output:
        if o.HasField("reshape"):
            outputs.append(_Tensor(o.name, "output", o.data_type, tuple(o.reshape.shape), tuple(o.dims)))
        else:
            outputs.append(_Tensor(o.name, "output", o.data_type, tuple(o.dims)))
    if cfg.HasField("sequence_batching"):
        sb = cfg.sequence_batching
        inputs.extend(_control_tensors(sb))
        seen_in: set[str] = set()
        seen_out = {o.name for o in cfg.output}
        for st in sb.state:
            in_name = st.input_name or st.name
            out_name = st.output_name or st.name
            if in_name not in seen_in:  # duplicates: the engine ignores the later one
                seen_in.add(in_name)
                inputs.append(_Tensor(in_name, "state input", st.data_type, tuple(st.dims)))
            if out_name not in seen_out:
                seen_out.add(out_name)
                outputs.append(_Tensor(out_name, "state output", st.data_type, tuple(st.dims)))
    return inputs, outputs


def _check_tensor(model: str, t: _Tensor, arg: Any, mbs: int) -> tuple[int, ...] | None:
    """Check one config tensor against its graph NodeArg; returns the shape to reshape a feed
    to (without the batch dim) when the graph's rank differs (a scalar), else None."""
    want = _ORT_TYPE.get(t.data_type)
    if want is None or want != arg.type:
        raise InferenceError(
            Code.INVALID_ARG,
            f"unable to load model '{model}', {t.role} '{t.name}': configuration expects data type "
            f"{_type_name(t.data_type)}, the ONNX graph has {_ort_type_name(arg.type)}",
        )
    if t.data_type == mc.TYPE_BF16:
        raise InferenceError(
            Code.INVALID_ARG, f"unable to load model '{model}', {t.role} '{t.name}': TYPE_BF16 is not supported"
        )
    gdims = _graph_dims(arg.shape)
    if gdims is None:
        return None
    batch = (-1,) if mbs > 0 else ()
    shown = _shape_str(gdims)
    if mbs > 0:
        if not gdims or gdims[0] != -1:
            raise InferenceError(
                Code.INVALID_ARG,
                f"unable to load model '{model}', {t.role} '{t.name}': max_batch_size {mbs} needs a variable "
                f"first (batch) dimension, but the ONNX graph's shape is {shown} (set max_batch_size: 0 to "
                "give the model whole tensors)",
            )
        gdims = gdims[1:]
    if not gdims and all(d == 1 for d in t.dims):  # a scalar (per batch row) in the graph
        return ()
    if len(gdims) != len(t.dims) or any(g != -1 and g != d for g, d in zip(gdims, t.dims, strict=True)):
        what = "reshape" if t.reshape is not None else "dims"
        raise InferenceError(
            Code.INVALID_ARG,
            f"unable to load model '{model}', {t.role} '{t.name}': configuration {what} "
            f"{_shape_str(batch + t.dims)} do not match the ONNX graph's shape {shown}",
        )
    return None


def _plan(cfg: mc.ModelConfig, session: Any) -> OnnxPlan:
    model = cfg.name
    mbs = cfg.max_batch_size
    inputs, outputs = _expected(cfg)
    graph_in = {a.name: a for a in session.get_inputs()}
    # initializers the graph lets callers override may be fed too (but need not be)
    overridable = {a.name: a for a in session.get_overridable_initializers() if a.name not in graph_in}
    graph_out = {a.name: a for a in session.get_outputs()}
    feeds = []
    for t in inputs:
        arg = graph_in.get(t.name) or overridable.get(t.name)
        if arg is None:
            raise InferenceError(
                Code.INVALID_ARG,
                f"unable to load model '{model}': configuration expects {t.role} '{t.name}', but the ONNX graph "
                f"has no such input; graph inputs: {sorted(graph_in)}",
            )
        scalar = _check_tensor(model, t, arg, mbs)
        reshape = t.dims if t.reshape is not None else scalar
        where = {"input": "inputs", "sequence control": "controls", "state input": "states"}[t.role]
        feeds.append((t.name, where, reshape, t.data_type == mc.TYPE_STRING))
    fed = {t.name for t in inputs}
    unfed = [n for n in graph_in if n not in fed]
    if unfed:
        raise InferenceError(
            Code.INVALID_ARG,
            f"unable to load model '{model}': ONNX graph input(s) {unfed} are not in the configuration; list each "
            "as an 'input', a sequence_batching 'control_input' or a sequence_batching 'state' input",
        )
    reshape_outputs = []
    for t in outputs:
        arg = graph_out.get(t.name)
        if arg is None:
            raise InferenceError(
                Code.INVALID_ARG,
                f"unable to load model '{model}': configuration expects {t.role} '{t.name}', but the ONNX graph "
                f"has no such output; graph outputs: {sorted(graph_out)}",
            )
        scalar = _check_tensor(model, t, arg, mbs)
        if t.reshape is not None and sum(d < 0 for d in t.reshape) <= 1:
            reshape_outputs.append((t.name, t.reshape))
        elif scalar is not None:
            reshape_outputs.append((t.name, t.dims))
    return OnnxPlan(
        feeds=tuple(feeds),
        outputs=tuple(t.name for t in outputs),
        state_outputs=frozenset(st.output_name or st.name for st in cfg.sequence_batching.state),
        string_outputs=frozenset(t.name for t in outputs if t.data_type == mc.TYPE_STRING),
        reshape_outputs=tuple(reshape_outputs),
    )


# ------------------------------------------------------------------------------ strings


# ----------------------------------------------------------------------------- backend


class _Instance(BackendInstance):
    __slots__ = ("_batched", "_plan", "_run", "_run_options", "_session")

    def __init__(self, session: Any, plan: OnnxPlan, run_options: Any, batched: bool) -> None:
        self._session = session
        self._run = session.run
        self._plan = plan
        self._run_options = run_options
        self._batched = batched

    def execute(self, batch: ExecuteBatch) -> Mapping[str, np.ndarray]:
        plan = self._plan
        sources = {"inputs": batch.inputs, "controls": batch.controls, "states": batch.states}
        feeds: dict[str, np.ndarray] = {}
        for name, where, reshape, is_string in plan.feeds:
            arr = sources[where][name]
            if is_string:
                arr = to_text(arr)
                if self._batched and where != "controls":
                    # Padding rows hold empty strings, which a graph that parses its strings
                    # (Cast to a number) rejects, failing the real rows too: give them a real row's.
                    ready = batch.ready
                    if ready.any() and not ready.all():
                        arr[~ready] = arr[int(np.argmax(ready))]
            if reshape is not None:
                arr = arr.reshape((arr.shape[0], *reshape) if self._batched else reshape)
            feeds[name] = arr
        wanted: set[str] = set(plan.state_outputs)
        for outs in batch.request_outputs:
            if outs:
                wanted.update(outs)
        names = [n for n in plan.outputs if n in wanted] or list(plan.outputs)
        values = self._run(names, feeds, self._run_options)
        result = dict(zip(names, values, strict=True))
        for name in plan.string_outputs:
            if name in result:
                result[name] = to_bytes(result[name])
        for name, dims in plan.reshape_outputs:
            if name in result:
                value = result[name]
                result[name] = value.reshape((value.shape[0], *dims) if self._batched else dims)
        return result

    def finalize(self) -> None:
        self._session = None
        self._run = None


class OnnxRuntimeBackend(Backend):
    names: ClassVar[tuple[str, ...]] = ("onnxruntime",)
    platforms: ClassVar[tuple[str, ...]] = ("onnxruntime_onnx",)
    supports_implicit_state: ClassVar[bool] = True

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__(ctx)
        self._ort = _import_ort()
        cfg = ctx.config
        self.path = _model_path(ctx.version_dir, cfg)
        self._options, self._run_options = _session_options(self._ort, cfg, ctx.parameters, ctx.version_dir)
        # The load-time check uses a CPU session, which the first CPU instance then keeps.
        session = self._session("cpu")
        self.plan = _plan(cfg, session)
        self._spare: Any = session

    def _session(self, device: str) -> Any:
        providers = _providers(self._ort, device, self.ctx.name)
        return _open_session(self._ort, self.path, self.ctx.name, self._options, providers)

    def gpu_unsupported_reason(self) -> str:
        from seqserve.engine.backends.onnxrt_gpu import cuda_provider_missing

        return cuda_provider_missing(self._ort)

    def create_instance(self, ictx: InstanceContext) -> BackendInstance:
        device = ictx.device if ictx.device.startswith("cuda") else "cpu"
        batched = self.ctx.config.max_batch_size > 0
        if device != "cpu":
            from seqserve.engine.backends.onnxrt_gpu import OnnxGpuInstance

            ordinal = int(device.partition(":")[2] or 0)
            return OnnxGpuInstance(
                self._session(device), self.plan, self._run_options, batched, ordinal=ordinal, stream=ictx.cuda_stream
            )
        if self._spare is not None:
            session, self._spare = self._spare, None
        else:
            session = self._session(device)
        return _Instance(session, self.plan, self._run_options, batched)

    def describe(self) -> dict[str, Any]:
        return {"backend": "onnxruntime", "model_file": str(self.path), "onnxruntime": self._ort.__version__}

    # ------------------------------------------------------------------- autocomplete

    @classmethod
    def autocomplete_config(
        cls, cfg: mc.ModelConfig, model_dir: Path, *, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    ) -> None:
        """Fill a config without inputs or outputs from the graph of the latest version, as
        Triton's onnxruntime backend does: max_batch_size (DEFAULT_MAX_BATCH_SIZE, with
        dynamic batching, when every graph tensor has a variable first dimension), then the
        inputs and outputs that are missing. Tensors the sequence batcher supplies (controls,
        states) are left out."""
        if not cfg.backend:
            cfg.backend = "onnxruntime"
        if not cfg.platform:
            cfg.platform = "onnxruntime_onnx"
        if cfg.input and cfg.output:
            return
        path = _latest_model_file(model_dir, cfg)
        if path is None:
            return  # the load reports the missing file
        ort = _import_ort()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = _open_session(ort, path, cfg.name, so, ["CPUExecutionProvider"])
        ins = [(a.name, a.type, _graph_dims(a.shape) or []) for a in session.get_inputs()]
        outs = [(a.name, a.type, _graph_dims(a.shape) or []) for a in session.get_outputs()]
        del session

        can_batch = all(dims and dims[0] == -1 for _, _, dims in ins + outs)
        if can_batch:
            if cfg.max_batch_size == 0:
                cfg.max_batch_size = default_max_batch_size
                log.warning(
                    "autofilled max_batch_size to %d for model '%s' since batching is supported but no "
                    "max_batch_size is specified in model configuration",
                    default_max_batch_size,
                    cfg.name,
                )
            if (
                cfg.max_batch_size > 1
                and not cfg.HasField("sequence_batching")
                and not cfg.HasField("dynamic_batching")
            ):
                cfg.dynamic_batching.SetInParent()
        elif cfg.max_batch_size != 0:
            raise InferenceError(
                Code.INVALID_ARG,
                f"autofill failed for model '{cfg.name}': model does not support batching while non-zero "
                "max_batch_size is specified",
            )

        supplied_in: set[str] = set()
        supplied_out: set[str] = set()
        if cfg.HasField("sequence_batching"):
            sb = cfg.sequence_batching
            supplied_in.update(ci.name for ci in sb.control_input)
            supplied_in.update(st.input_name or st.name for st in sb.state)
            supplied_out.update(st.output_name or st.name for st in sb.state)
        if not cfg.input:
            for name, ort_type, dims in ins:
                if name not in supplied_in:
                    _fill_io(cfg, cfg.input.add(), name, ort_type, dims)
        if not cfg.output:
            for name, ort_type, dims in outs:
                if name not in supplied_out:
                    _fill_io(cfg, cfg.output.add(), name, ort_type, dims)


def _latest_model_file(model_dir: Path, cfg: mc.ModelConfig) -> Path | None:
    versions = sorted(
        (int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0")),
        reverse=True,
    )
    for v in versions:
        path = _model_path(model_dir / str(v), cfg)
        if path.is_file():
            return path
    return None


def _fill_io(
    cfg: mc.ModelConfig, io: mc.ModelInput | mc.ModelOutput, name: str, ort_type: str, dims: list[int]
) -> None:
    dt = _FROM_ORT_TYPE.get(ort_type)
    if dt is None:
        raise InferenceError(
            Code.INVALID_ARG, f"autofill failed for model '{cfg.name}': tensor '{name}' has unsupported type {ort_type}"
        )
    io.name = name
    io.data_type = dt  # type: ignore[assignment]
    item = dims[1:] if cfg.max_batch_size > 0 else dims
    if item:
        io.dims.extend(item)
    else:  # a scalar: dims [1], and with batching an empty reshape
        io.dims.append(1)
        if cfg.max_batch_size > 0:
            io.reshape.SetInParent()
