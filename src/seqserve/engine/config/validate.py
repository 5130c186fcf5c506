"""Config validation, with Triton's error messages (users and tools compare against them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from seqserve._proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
    ModelQueuePolicy,
    ModelSequenceBatching,
)
from seqserve.engine.config.ensemble import is_ensemble, validate_ensemble_scheduling
from seqserve.engine.config.initial_state import (
    check_initial_data_size,
    file_size,
    initial_state_path,
)
from seqserve.engine.config.names import WILDCARD_DIM, Control, State
from seqserve.engine.errors import ModelConfigError
from seqserve.engine.paths import check_relative_path


def validate_config(cfg: ModelConfig, model_dir: Path) -> None:
    """Raise ModelConfigError for the first invalid setting found.

    Backend-specific checks (platform, devices, whether the backend supports
    a feature) are the backend's and the server's business, not this one.
    """
    m = cfg.name
    validate_paths(cfg)
    if cfg.max_batch_size < 0:
        raise ModelConfigError(f"'max_batch_size' must be non-negative value for {m}")
    seq = cfg.sequence_batching if cfg.HasField("sequence_batching") else None
    _validate_io(cfg, seq)
    if is_ensemble(cfg):  # its steps are checked once they are loaded (engine/ensemble)
        validate_ensemble_scheduling(cfg)
        return
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg)
    if seq is not None:
        _validate_control_inputs(seq, m)
        _validate_strategy(seq, cfg.max_batch_size, m)
        _validate_states(seq, m)
        _validate_initial_states(seq, Path(model_dir), m)


def validate_paths(cfg: ModelConfig) -> None:
    """Every file name the config gives must stay inside the model's directory (see
    ``seqserve.engine.paths``). Checked before anything reads a file, the backend's
    autocomplete included. ``initial_state`` data files are checked with the states."""
    version_dir = f"the version folder of model '{cfg.name}'"
    if cfg.default_model_filename:
        check_relative_path(cfg.default_model_filename, "default_model_filename", version_dir)
    for cc, filename in cfg.cc_model_filenames.items():
        check_relative_path(filename, f"cc_model_filenames['{cc}']", version_dir)
    for out in cfg.output:
        if out.label_filename:
            check_relative_path(
                out.label_filename, f"label_filename of output '{out.name}'", f"the folder of model '{cfg.name}'"
            )
    for warmup in cfg.model_warmup:
        for name, data in warmup.inputs.items():
            if data.WhichOneof("input_data_type") == "input_data_file":
                check_relative_path(
                    data.input_data_file,
                    f"model_warmup '{warmup.name}' input '{name}' input_data_file",
                    f"the 'warmup' folder of model '{cfg.name}'",
                )


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
    if seq.max_backlog_sequences < -1:
        raise ModelConfigError(
            "sequence batching max_backlog_sequences must be -1 (no bound), 0 (the server's default) or a "
            f"positive number of sequences for {m}"
        )


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
        path = initial_state_path(model_dir, init.data_file)
        check_initial_data_size(init, file_size(path))
