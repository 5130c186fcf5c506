"""Model configuration: read ``config.pbtxt``, apply defaults, validate.

The file is protobuf text format of ``protos/model_config.proto`` (Triton's
``inference.ModelConfig`` plus seqserve extensions). Defaults and error
messages follow Triton's, because users and tools compare against them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePath
from typing import Any, cast

import numpy as np
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from seqserve._proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelQueuePolicy,
    ModelSequenceBatching,
    SeqserveTimeoutAction,
)
from seqserve.engine.errors import Code, ModelConfigError

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_MAX_SEQUENCE_IDLE_US",
    "DTYPE_SIZE",
    "INITIAL_STATE_DIR",
    "config_from_json",
    "config_to_json",
    "finish_model_config",
    "from_wire_dtype_name",
    "load_model_config",
    "normalize_config",
    "parse_config_json",
    "parse_model_config",
    "read_initial_state",
    "state_input_name",
    "state_output_name",
    "to_numpy_dtype",
    "validate_config",
    "wire_dtype_name",
]

CONFIG_FILENAME = "config.pbtxt"
INITIAL_STATE_DIR = "initial_state"
DEFAULT_MAX_SEQUENCE_IDLE_US = 1_000_000
WILDCARD_DIM = -1

Control = ModelSequenceBatching.Control
State = ModelSequenceBatching.State

# --------------------------------------------------------------------------
# Data types

# Bytes per element. TYPE_STRING (variable size) and TYPE_INVALID are absent.
DTYPE_SIZE: dict[int, int] = {
    DataType.TYPE_BOOL: 1,
    DataType.TYPE_UINT8: 1,
    DataType.TYPE_UINT16: 2,
    DataType.TYPE_UINT32: 4,
    DataType.TYPE_UINT64: 8,
    DataType.TYPE_INT8: 1,
    DataType.TYPE_INT16: 2,
    DataType.TYPE_INT32: 4,
    DataType.TYPE_INT64: 8,
    DataType.TYPE_FP16: 2,
    DataType.TYPE_FP32: 4,
    DataType.TYPE_FP64: 8,
    DataType.TYPE_BF16: 2,
}

# Explicit little-endian: the wire format is little-endian on every host.
_NUMPY_DTYPE: dict[int, np.dtype[Any] | None] = {
    DataType.TYPE_BOOL: np.dtype(np.bool_),
    DataType.TYPE_UINT8: np.dtype("u1"),
    DataType.TYPE_UINT16: np.dtype("<u2"),
    DataType.TYPE_UINT32: np.dtype("<u4"),
    DataType.TYPE_UINT64: np.dtype("<u8"),
    DataType.TYPE_INT8: np.dtype("i1"),
    DataType.TYPE_INT16: np.dtype("<i2"),
    DataType.TYPE_INT32: np.dtype("<i4"),
    DataType.TYPE_INT64: np.dtype("<i8"),
    DataType.TYPE_FP16: np.dtype("<f2"),
    DataType.TYPE_FP32: np.dtype("<f4"),
    DataType.TYPE_FP64: np.dtype("<f8"),
    DataType.TYPE_STRING: np.dtype(object),
    DataType.TYPE_BF16: None,  # numpy has no bfloat16
}

_WIRE_NAME: dict[int, str] = {
    value: ("BYTES" if value == DataType.TYPE_STRING else name.removeprefix("TYPE_"))
    for name, value in DataType.items()
}
_FROM_WIRE_NAME: dict[str, int] = {name: value for value, name in _WIRE_NAME.items()}


def to_numpy_dtype(dt: int) -> np.dtype[Any] | None:
    """numpy dtype for a config DataType; object for TYPE_STRING, None for BF16."""
    try:
        return _NUMPY_DTYPE[dt]
    except KeyError:
        raise ValueError(f"no numpy dtype for {_dtype_name(dt)}") from None


def wire_dtype_name(dt: int) -> str:
    """Protocol datatype name: TYPE_STRING -> "BYTES", TYPE_FP32 -> "FP32"."""
    return _WIRE_NAME.get(dt, "INVALID")


_WIRE_OF_NUMPY: dict[np.dtype[Any], str] = {
    dtype: _WIRE_NAME[dt] for dt, dtype in _NUMPY_DTYPE.items() if dtype is not None and dtype.kind != "O"
}


def numpy_wire_name(dtype: np.dtype[Any]) -> str:
    """Protocol datatype name of a numpy dtype ("FP32", "BYTES" for object/str/bytes)."""
    name = _WIRE_OF_NUMPY.get(dtype)
    if name is not None:
        return name
    return "BYTES" if dtype.kind in "OSU" else str(dtype)


def from_wire_dtype_name(name: str) -> int:
    """Config DataType for a protocol datatype name; TYPE_INVALID if unknown,
    so request decoding can report the bad name without catching."""
    return _FROM_WIRE_NAME.get(name, DataType.TYPE_INVALID)


def _dtype_name(dt: int) -> str:
    try:
        return DataType.Name(dt)
    except ValueError:
        return str(dt)


# --------------------------------------------------------------------------
# Loading


def load_model_config(model_dir: Path, *, name: str | None = None) -> ModelConfig:
    """Read, normalize and validate ``<model_dir>/config.pbtxt``.

    ``name`` is the model name to expect (default: the directory name). A
    missing file gives a config holding only the name, for backends that can
    complete the config themselves (see ``parse_model_config``).
    """
    cfg = parse_model_config(model_dir, name=name)
    finish_model_config(cfg, model_dir)
    return cfg


def parse_model_config(model_dir: Path, *, name: str | None = None) -> ModelConfig:
    """The first step of ``load_model_config``: read ``config.pbtxt`` and check the name,
    without defaults or validation, so that a backend can complete the config first."""
    model_dir = Path(model_dir)
    expected = name if name is not None else model_dir.name
    path = model_dir / CONFIG_FILENAME
    cfg = _parse_config_file(path) if path.is_file() else ModelConfig()
    if not cfg.name:
        cfg.name = expected
    elif cfg.name != expected:
        where = "the expected model name" if name is not None else "the model directory name"
        raise ModelConfigError(f"model name '{cfg.name}' in {path} does not match {where} '{expected}'")
    return cfg


def finish_model_config(cfg: ModelConfig, model_dir: Path) -> None:
    """The last step of loading a config: apply defaults, then validate."""
    normalize_config(cfg)
    validate_config(cfg, Path(model_dir))


def config_from_json(text: str, model_dir: Path, *, name: str) -> ModelConfig:
    """A config given as JSON (the repository load API's 'config' parameter), checked like a
    config.pbtxt."""
    cfg = parse_config_json(text, name=name)
    finish_model_config(cfg, model_dir)
    return cfg


def parse_config_json(text: str, *, name: str) -> ModelConfig:
    """The first step of ``config_from_json``: parse and check the name only."""
    try:
        cfg = json_format.Parse(text, ModelConfig())
    except json_format.ParseError as e:
        raise ModelConfigError(f"failed to parse the 'config' parameter for model '{name}': {e}") from e
    if not cfg.name:
        cfg.name = name
    elif cfg.name != name:
        raise ModelConfigError(f"model name '{cfg.name}' in the 'config' parameter does not match '{name}'")
    return cfg


def _parse_config_file(path: Path) -> ModelConfig:
    # INTERNAL, as Triton reports unreadable config files; protobuf's own
    # message carries the line:column and the offending field.
    prefix = f"failed to read text proto from {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{prefix}: {e}", Code.INTERNAL) from e
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as e:
        raise ModelConfigError(f"{prefix}: {e}", Code.INTERNAL) from e


# --------------------------------------------------------------------------
# Defaults


def normalize_config(cfg: ModelConfig) -> None:
    """Fill in the defaults Triton applies at load, in place.

    KIND_AUTO instance groups are left for the server, which knows the
    devices. seqserve extension fields are left as parsed.
    """
    _normalize_extensions(cfg)
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    _normalize_instance_groups(cfg)
    _normalize_pinned_memory(cfg)
    if cfg.HasField("dynamic_batching"):
        dyn = cfg.dynamic_batching
        if not dyn.preferred_batch_size and cfg.max_batch_size > 0:
            dyn.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching"):
        _normalize_sequence_batching(cfg.sequence_batching, cfg.max_batch_size)


#: Idle timeout of a model made stateful by `stateful_model_policy` alone: sessions are
#: conversational, so minutes rather than Triton's 1 s default.
STATEFUL_POLICY_IDLE_US = 300_000_000


def _normalize_extensions(cfg: ModelConfig) -> None:
    """Give seqserve's config extensions their meaning in terms of standard fields, before
    Triton's defaults are applied (so unset fields can still be told apart)."""
    dyn = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
    if dyn is not None:
        # default_batch_size adds a preferred size (next to max_batch_size when none is given).
        if dyn.default_batch_size > 0 and dyn.default_batch_size not in dyn.preferred_batch_size:
            sizes = set(dyn.preferred_batch_size) or ({cfg.max_batch_size} if cfg.max_batch_size > 0 else set())
            sizes.add(dyn.default_batch_size)
            del dyn.preferred_batch_size[:]
            dyn.preferred_batch_size.extend(sorted(sizes))
        if dyn.timeout_action == SeqserveTimeoutAction.TIMEOUT_COMPLETE:
            dyn.default_queue_policy.timeout_action = ModelQueuePolicy.DELAY
    policy = cfg.model_transaction_policy
    if policy.HasField("stateful_model_policy") and not cfg.HasField("sequence_batching"):
        cfg.sequence_batching.max_sequence_idle_microseconds = STATEFUL_POLICY_IDLE_US
    if not cfg.HasField("sequence_batching"):
        return
    seq = cfg.sequence_batching
    for state in seq.state:  # `name` is both the input and the output state
        if state.name:
            state.input_name = state.input_name or state.name
            state.output_name = state.output_name or state.name
    strategy = seq.WhichOneof("strategy_choice")
    if strategy == "reusable_batch":
        rb = seq.reusable_batch
        if rb.max_size == 0:
            rb.max_size = max(1, cfg.max_batch_size)
        if not rb.candidate_batch_size:
            if dyn is not None and dyn.preferred_batch_size:
                rb.candidate_batch_size.extend(dyn.preferred_batch_size)
            elif cfg.max_batch_size > 0:
                rb.candidate_batch_size.append(cfg.max_batch_size)
    elif strategy == "oldest" and dyn is not None:
        # Oldest batches honour dynamic_batching's delay and sizes unless they set their own.
        if not seq.oldest.preferred_batch_size:
            seq.oldest.preferred_batch_size.extend(dyn.preferred_batch_size)
        if seq.oldest.max_queue_delay_microseconds == 0:
            seq.oldest.max_queue_delay_microseconds = dyn.max_queue_delay_microseconds


def _normalize_instance_groups(cfg: ModelConfig) -> None:
    if not cfg.instance_group:
        cfg.instance_group.add()
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.count < 1:
            group.count = 1


def _normalize_pinned_memory(cfg: ModelConfig) -> None:
    # Triton turns pinned staging buffers on unless told otherwise (not for
    # ensembles, which have no buffers of their own).
    if cfg.HasField("ensemble_scheduling") or cfg.platform == "ensemble":
        return
    opt = cfg.optimization
    if not opt.HasField("input_pinned_memory"):
        opt.input_pinned_memory.enable = True
    if not opt.HasField("output_pinned_memory"):
        opt.output_pinned_memory.enable = True


def _normalize_sequence_batching(seq: ModelSequenceBatching, max_batch_size: int) -> None:
    if seq.max_sequence_idle_microseconds == 0:
        seq.max_sequence_idle_microseconds = DEFAULT_MAX_SEQUENCE_IDLE_US
    strategy = seq.WhichOneof("strategy_choice")
    if strategy is None:
        seq.direct.SetInParent()
    elif strategy == "oldest":
        oldest = seq.oldest
        if oldest.max_candidate_sequences == 0:
            oldest.max_candidate_sequences = max(1, max_batch_size)
        if not oldest.preferred_batch_size and max_batch_size > 0:
            oldest.preferred_batch_size.append(max_batch_size)


# --------------------------------------------------------------------------
# Validation


def validate_config(cfg: ModelConfig, model_dir: Path) -> None:
    """Raise ModelConfigError for the first invalid setting found.

    Backend-specific checks (platform, devices, whether the backend supports
    a feature) are the backend's and the server's business, not this one.
    """
    m = cfg.name
    if cfg.max_batch_size < 0:
        raise ModelConfigError(f"'max_batch_size' must be non-negative value for {m}")
    seq = cfg.sequence_batching if cfg.HasField("sequence_batching") else None
    _validate_io(cfg, seq)
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg)
    if seq is not None:
        _validate_control_inputs(seq, m)
        _validate_strategy(seq, cfg.max_batch_size, m)
        _validate_states(seq, m)
        _validate_initial_states(seq, Path(model_dir), m)


def state_input_name(state: State) -> str:
    """Name of the model input fed with this state (``input_name``, else the
    seqserve ``name`` extension)."""
    return state.input_name or state.name


def state_output_name(state: State) -> str:
    """Name of the model output that becomes the next state (``output_name``,
    else the seqserve ``name`` extension)."""
    return state.output_name or state.name


# ---- inputs and outputs


def _validate_io(cfg: ModelConfig, seq: ModelSequenceBatching | None) -> None:
    # Tensors the server supplies (controls, states) may be listed without
    # dims: their shape comes from the sequence batcher, not the client.
    implicit_inputs: set[str] = set()
    implicit_outputs: set[str] = set()
    if seq is not None:
        implicit_inputs.update(ci.name for ci in seq.control_input)
        implicit_inputs.update(state_input_name(s) for s in seq.state)
        implicit_outputs.update(state_output_name(s) for s in seq.state)
    _validate_tensors("input", cfg.input, implicit_inputs, cfg)
    _validate_tensors("output", cfg.output, implicit_outputs, cfg)


def _validate_tensors(
    kind: str,
    tensors: Sequence[ModelInput] | Sequence[ModelOutput],
    implicit: set[str],
    cfg: ModelConfig,
) -> None:
    m = cfg.name
    seen: set[str] = set()
    for t in tensors:
        if not t.name:
            raise ModelConfigError(f"model {kind} must specify 'name' for {m}")
        if t.name in seen:
            raise ModelConfigError(f"model {kind} '{t.name}' is specified more than once for {m}")
        seen.add(t.name)
        what = f"model {kind} '{t.name}'"
        if t.data_type == DataType.TYPE_INVALID:
            raise ModelConfigError(f"{what} must specify 'data_type' for {m}")
        if not t.dims and t.name not in implicit:
            raise ModelConfigError(f"{what} must specify 'dims' for {m}")
        if _has_bad_dim(t.dims):
            raise ModelConfigError(
                f"{what} dimension must be integer >= 1, or -1 to indicate a variable-size dimension for {m}"
            )
        if t.HasField("reshape") and not t.reshape.shape and cfg.max_batch_size == 0:
            raise ModelConfigError(f"{what} cannot have empty reshape for non-batching model {m}")
        if (
            isinstance(t, ModelInput)
            and t.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW)
            and len(t.dims) != 3
        ):
            raise ModelConfigError(f"{what} NHWC/NCHW require 3 dims for {m}")


def _has_bad_dim(dims: Iterable[int]) -> bool:
    return any(d < 1 and d != WILDCARD_DIM for d in dims)


# ---- dynamic batching


def _validate_dynamic_batching(cfg: ModelConfig) -> None:
    m = cfg.name
    dyn = cfg.dynamic_batching
    _check_preferred_sizes(dyn.preferred_batch_size, cfg.max_batch_size, "dynamic batching preferred size", m)
    levels = dyn.priority_levels
    if levels != 0:
        if not 1 <= dyn.default_priority_level <= levels:
            raise ModelConfigError(f"default priority level must be in range [1, {levels}] for {m}")
        for level in dyn.priority_queue_policy:
            if not 1 <= level <= levels:
                raise ModelConfigError(f"priority queue policy must have priority level in range [1, {levels}] for {m}")
    if dyn.preserve_ordering:
        if levels > 1:
            raise ModelConfigError(f"Only one priority level is allowed when 'preserve_ordering' is true for {m}")
        policies = [dyn.default_queue_policy, *dyn.priority_queue_policy.values()]
        if any(_delays_on_timeout(p) for p in policies):
            raise ModelConfigError(
                f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {m}"
            )


def _delays_on_timeout(policy: ModelQueuePolicy) -> bool:
    # A DELAY policy without a default timeout never reorders anything.
    return policy.timeout_action == ModelQueuePolicy.DELAY and policy.default_timeout_microseconds != 0


def _check_preferred_sizes(sizes: Iterable[int], max_batch_size: int, what: str, m: str) -> None:
    for size in sizes:
        if size <= 0:
            raise ModelConfigError(f"{what} must be positive for {m}")
        if size > max_batch_size:
            raise ModelConfigError(f"{what} must be <= max batch size for {m}")


# ---- sequence batching: controls

_BOOL_LISTS = ("int32_false_true", "fp32_false_true", "bool_false_true")
_CORRID_TYPES = frozenset(
    {
        DataType.TYPE_UINT64,
        DataType.TYPE_INT64,
        DataType.TYPE_UINT32,
        DataType.TYPE_INT32,
        DataType.TYPE_STRING,
    }
)


def _validate_control_inputs(seq: ModelSequenceBatching, m: str) -> None:
    names: set[str] = set()
    kinds: set[int] = set()
    for control_input in seq.control_input:
        if not control_input.name:
            raise ModelConfigError(f"sequence batching control tensor must have a name for {m}")
        if control_input.name in names:
            raise ModelConfigError(
                f"sequence batching control tensor '{control_input.name}' is specified "
                f"for multiple control kinds for {m}"
            )
        names.add(control_input.name)
        for control in control_input.control:
            kind = Control.Kind.Name(control.kind)
            if control.kind in kinds:
                raise ModelConfigError(f"sequence batching specifies multiple {kind} tensors for {m}")
            kinds.add(control.kind)
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                _validate_corrid_control(control, m)
            else:
                _validate_bool_control(control, kind, m)


def _validate_bool_control(control: Control, kind: str, m: str) -> None:
    given = [field for field in _BOOL_LISTS if len(getattr(control, field))]
    if not given:
        raise ModelConfigError(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' "
            f"or 'bool_false_true' for {kind} for {m}"
        )
    if len(given) > 1:
        raise ModelConfigError(
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind} for {m}"
        )
    if len(getattr(control, given[0])) != 2:
        raise ModelConfigError(f"sequence batching control '{given[0]}' must have exactly 2 entries for {kind} for {m}")


def _validate_corrid_control(control: Control, m: str) -> None:
    kind = Control.Kind.Name(Control.CONTROL_SEQUENCE_CORRID)
    if any(len(getattr(control, field)) for field in _BOOL_LISTS):
        raise ModelConfigError(
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' "
            f"or 'bool_false_true' for {kind} for {m}"
        )
    if control.data_type not in _CORRID_TYPES:
        raise ModelConfigError(
            f"unexpected data type for control {kind} for {m}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        )


# ---- sequence batching: strategy


def _validate_strategy(seq: ModelSequenceBatching, max_batch_size: int, m: str) -> None:
    strategy = seq.WhichOneof("strategy_choice")
    if strategy == "oldest":
        _check_preferred_sizes(
            seq.oldest.preferred_batch_size,
            max_batch_size,
            "sequence batching preferred batch size",
            m,
        )
    elif strategy == "reusable_batch":
        if seq.reusable_batch.max_size < 1:
            raise ModelConfigError(f"sequence batching reusable_batch max_size must be positive for {m}")
        _check_preferred_sizes(
            seq.reusable_batch.candidate_batch_size,
            max_batch_size,
            "sequence batching reusable_batch candidate batch size",
            m,
        )
    # Triton's text says (0.0, 1.0] but accepts 0.0 (meaning: no wait).
    elif strategy == "direct" and not 0.0 <= seq.direct.minimum_slot_utilization <= 1.0:
        raise ModelConfigError(f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {m}")


# ---- sequence batching: implicit state


def _validate_states(seq: ModelSequenceBatching, m: str) -> None:
    # Duplicate state names are not an error: Triton warns and ignores the
    # later one, which the model runtime does.
    for state in seq.state:
        _validate_state_names(state, m)
        name = state_input_name(state)
        if state.data_type == DataType.TYPE_INVALID:
            raise ModelConfigError(f"sequence batching state '{name}' must specify 'data_type' for {m}")
        if _has_bad_dim(state.dims):
            raise ModelConfigError(
                f"sequence batching state '{name}' dimension must be integer >= 1, or -1 "
                f"to indicate a variable-size dimension for {m}"
            )


def _validate_state_names(state: State, m: str) -> None:
    if state.name:
        for field in ("input_name", "output_name"):
            other = getattr(state, field)
            if other and other != state.name:
                raise ModelConfigError(
                    f"sequence batching state '{state.name}' sets both 'name' and a different "
                    f"'{field}' ('{other}') for {m}"
                )
        return
    if not state.input_name:
        raise ModelConfigError(f"sequence batching state must specify 'input_name' (or 'name') for {m}")
    if not state.output_name:
        raise ModelConfigError(
            f"sequence batching state '{state.input_name}' must specify 'output_name' (or 'name') for {m}"
        )


def _validate_initial_states(seq: ModelSequenceBatching, model_dir: Path, m: str) -> None:
    with_initial: set[str] = set()
    for state in seq.state:
        name = state_input_name(state)
        count = len(state.initial_state)
        if count == 0:
            continue
        if count > 1:
            raise ModelConfigError(
                f"initial_state field for state input '{name}' must contain exactly one "
                f"or zero element. Found '{count}' elements."
            )
        init = state.initial_state[0]
        if init.data_type != state.data_type:
            raise ModelConfigError(
                f"The data type used for 'initial_state' field of state '{name}' does not match the state data type."
            )
        if not init.name:
            raise ModelConfigError(f"Field 'name' must be set when using initial_state for state input '{name}'.")
        if name in with_initial:
            raise ModelConfigError(f"State input name '{name}' specified more than once.")
        with_initial.add(name)
        _validate_initial_dims(state, name)
        _validate_initial_data(state, name, model_dir)


def _validate_initial_dims(state: State, name: str) -> None:
    init_dims = state.initial_state[0].dims
    if len(init_dims) != len(state.dims):
        raise ModelConfigError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(init_dims)} != {len(state.dims)}"
        )
    for init_dim, state_dim in zip(init_dims, state.dims, strict=True):
        if init_dim == WILDCARD_DIM:
            raise ModelConfigError(f"'initial_state' field for state input name '{name}' contains variable dimensions.")
        if state_dim != WILDCARD_DIM and init_dim != state_dim:
            raise ModelConfigError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {init_dim} != {state_dim}"
            )


def _validate_initial_data(state: State, name: str, model_dir: Path) -> None:
    init = state.initial_state[0]
    source = init.WhichOneof("state_data")
    if source is None:
        raise ModelConfigError(f"initial_state setting expects state'{name}' to have state_data set")
    if source == "data_file" and init.data_type != DataType.TYPE_STRING:
        # Only the size matters at load; the bytes are read when first used.
        path = _initial_state_path(model_dir, init.data_file)
        _check_initial_data_size(init, _file_size(path))


def _check_initial_data_size(init: ModelSequenceBatching.InitialState, have: int) -> None:
    need = _initial_byte_size(init.data_type, init.dims)
    if have < need:
        # The missing space before "only" is Triton's; clients may match it.
        raise ModelConfigError(
            f"initial_state setting expects {need} bytes, but the data provided from "
            f"{init.data_file}only has {have} bytes."
        )


# --------------------------------------------------------------------------
# Initial state data


def read_initial_state(model_dir: Path, state: State, max_batch_size: int) -> tuple[bytes, tuple[int, ...]]:
    """Bytes and shape (without the batch dim) a slot's state starts from.

    ``zero_data`` gives zeros; ``data_file`` gives the leading bytes of
    ``<model_dir>/initial_state/<file>`` (the whole file for TYPE_STRING,
    which must already be in the 4-byte-length serialized form). A state
    without ``initial_state`` starts as zeros of its dims with -1 -> 1
    (Triton leaves it uninitialized; zeros are a safe choice of garbage).
    The data is the same with or without a batch dim of 1, so
    ``max_batch_size`` only matters to the caller's final shape.
    """
    del max_batch_size  # the per-sequence data does not depend on it
    if not state.initial_state:
        shape = tuple(1 if d == WILDCARD_DIM else int(d) for d in state.dims)
        return _zero_bytes(state.data_type, shape), shape
    init = state.initial_state[0]
    shape = tuple(int(d) for d in init.dims)
    if init.WhichOneof("state_data") != "data_file":
        return _zero_bytes(init.data_type, shape), shape
    path = _initial_state_path(Path(model_dir), init.data_file)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelConfigError(f"failed to read initial state from {path}: {e}") from e
    if init.data_type == DataType.TYPE_STRING:
        return data, shape
    _check_initial_data_size(init, len(data))
    return data[: _initial_byte_size(init.data_type, shape)], shape


def _initial_state_path(model_dir: Path, data_file: str) -> Path:
    # A config can arrive over the load API, so the name must not lead out of
    # the folder. Symlinks the repository owner placed there are fine.
    rel = PurePath(data_file)
    if rel.is_absolute() or ".." in rel.parts:
        raise ModelConfigError(
            f"initial_state data_file '{data_file}' must be a file inside {model_dir / INITIAL_STATE_DIR}"
        )
    return model_dir / INITIAL_STATE_DIR / rel


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as e:
        raise ModelConfigError(f"failed to read initial state from {path}: {e}") from e


def _zero_bytes(dt: int, shape: Sequence[int]) -> bytes:
    # An empty string serializes as a 4-byte zero length.
    return bytes(_initial_byte_size(dt, shape))


def _initial_byte_size(dt: int, shape: Iterable[int]) -> int:
    count = math.prod(int(d) for d in shape)
    if dt == DataType.TYPE_STRING:
        return 4 * count
    return DTYPE_SIZE.get(dt, 0) * count


# --------------------------------------------------------------------------
# JSON


def config_to_json(cfg: ModelConfig) -> dict[str, Any]:
    """The config as the HTTP model-config endpoint returns it.

    Like Triton: snake_case field names, every field without presence
    printed (defaults included), enums by name, and 64-bit integers as JSON
    numbers rather than the strings protobuf's JSON mapping uses.
    """
    out = json_format.MessageToDict(
        cfg,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _unquote_int64(out, cast(Descriptor, cfg.DESCRIPTOR))
    return out


_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _unquote_int64(obj: dict[str, Any], desc: Descriptor) -> None:
    for key, value in obj.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for map_key, item in value.items():
                value[map_key] = _unquote_value(item, value_field)
        elif _is_repeated(field):
            obj[key] = [_unquote_value(item, field) for item in value]
        else:
            obj[key] = _unquote_value(value, field)


def _unquote_value(value: Any, field: FieldDescriptor) -> Any:
    if field.message_type is not None:
        _unquote_int64(value, field.message_type)
        return value
    if field.type in _INT64_TYPES and isinstance(value, str):
        return int(value)
    return value


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf 7 removed FieldDescriptor.label; is_repeated replaces it.
    return bool(field.is_repeated)
