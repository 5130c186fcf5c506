"""config.pbtxt parsing, defaults, validation messages, JSON, initial state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format

from seqserve._proto.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInstanceGroup,
    ModelSequenceBatching,
    ModelTransactionPolicy,
    SeqserveTimeoutAction,
)
from seqserve.engine.config import (
    config_to_json,
    load_model_config,
    normalize_config,
    read_initial_state,
    state_input_name,
    state_output_name,
    validate_config,
)
from seqserve.engine.errors import Code, InferenceError, ModelConfigError
from seqserve.engine.tensors import (
    BY_CONFIG,
    DATA_TYPES,
    from_wire_dtype_name,
    numpy_wire_name,
    to_numpy_dtype,
    wire_dtype_name,
)
from tests.support.paths import BRIEF

BASE = 'name: "m"\nbackend: "python"\nmax_batch_size: 4\n'
IO = 'input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }]\noutput [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }]\n'


def write_model(root: Path, text: str, name: str = "m") -> Path:
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir


def load(root: Path, text: str) -> ModelConfig:
    return load_model_config(write_model(root, text))


def control(name: str, body: str) -> str:
    return f'{{ name: "{name}" control [{{ {body} }}] }}'


def seq(*control_inputs: str, extra: str = "") -> str:
    return f"sequence_batching {{ {extra} control_input [ {', '.join(control_inputs)} ] }}\n"


START_OK = "kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]"
BOTH_LISTS = "int32_false_true: [0, 1] fp32_false_true: [0, 1]"


def state(initial: str = "", dims: str = "[-1, 2]", names: str = 'input_name: "IN_S" output_name: "OUT_S"') -> str:
    return f"{{ {names} data_type: TYPE_INT32 dims: {dims} {initial} }}"


def init(body: str) -> str:
    return f"initial_state [{{ {body} }}]"


INIT_OK = 'data_type: TYPE_INT32 dims: [1, 2] name: "init"'


def states(*entries: str) -> str:
    return f"sequence_batching {{ state [ {', '.join(entries)} ] }}\n"


# --------------------------------------------------------------------------
# Validation messages (Triton's wording where it has one)

CONTROL_CASES = [
    (
        seq(control("", START_OK)),
        "sequence batching control tensor must have a name for m",
    ),
    (
        seq(
            control("A", START_OK),
            control("A", "kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true]"),
        ),
        "sequence batching control tensor 'A' is specified for multiple control kinds for m",
    ),
    (
        seq(control("A", START_OK), control("B", START_OK)),
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
    ),
    (
        seq(control("A", "kind: CONTROL_SEQUENCE_START")),
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
        "'bool_false_true' for CONTROL_SEQUENCE_START for m",
    ),
    (
        seq(control("A", f"kind: CONTROL_SEQUENCE_END {BOTH_LISTS}")),
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
        "'bool_false_true' for CONTROL_SEQUENCE_END for m",
    ),
    (
        seq(control("A", "kind: CONTROL_SEQUENCE_READY fp32_false_true: [0, 1, 2]")),
        "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_READY for m",
    ),
    (
        seq(control("A", "kind: CONTROL_SEQUENCE_START bool_false_true: [true]")),
        "sequence batching control 'bool_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m",
    ),
    (
        seq(control("A", "kind: CONTROL_SEQUENCE_END int32_false_true: [1]")),
        "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_END for m",
    ),
    (
        seq(control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 int32_false_true: [0, 1]")),
        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
        "'bool_false_true' for CONTROL_SEQUENCE_CORRID for m",
    ),
    (
        seq(control("C", "kind: CONTROL_SEQUENCE_CORRID")),
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are "
        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
    (
        seq(control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32")),
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are "
        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
]

INITIAL_STATE_CASES = [
    (
        states(state(f"initial_state [{{ {INIT_OK} zero_data: true }}, {{ {INIT_OK} zero_data: true }}]")),
        "initial_state field for state input 'IN_S' must contain exactly one or zero element. Found '2' elements.",
    ),
    (
        states(state(init('data_type: TYPE_FP32 dims: [1, 2] name: "init" zero_data: true'))),
        "The data type used for 'initial_state' field of state 'IN_S' does not match the state data type.",
    ),
    (
        states(state(init("data_type: TYPE_INT32 dims: [1, 2] zero_data: true"))),
        "Field 'name' must be set when using initial_state for state input 'IN_S'.",
    ),
    (
        states(
            state(init(f"{INIT_OK} zero_data: true")),
            state(init(f"{INIT_OK} zero_data: true"), names='input_name: "IN_S" output_name: "OUT_2"'),
        ),
        "State input name 'IN_S' specified more than once.",
    ),
    (
        states(state(init('data_type: TYPE_INT32 dims: [2] name: "init" zero_data: true'))),
        "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for "
        "state input 'IN_S'. 1 != 2",
    ),
    (
        states(state(init('data_type: TYPE_INT32 dims: [-1, 2] name: "init" zero_data: true'))),
        "'initial_state' field for state input name 'IN_S' contains variable dimensions.",
    ),
    (
        states(state(init('data_type: TYPE_INT32 dims: [1, 3] name: "init" zero_data: true'))),
        "'initial_state' dim for input name 'IN_S' doesn't match 'state' dim description. 3 != 2",
    ),
    (
        states(state(init(INIT_OK))),
        "initial_state setting expects state'IN_S' to have state_data set",
    ),
    (
        # The extension `name` stands in for input_name in the messages.
        states(state(init(INIT_OK), names='name: "S"')),
        "initial_state setting expects state'S' to have state_data set",
    ),
]

DYNAMIC_CASES = [
    (
        "dynamic_batching { preferred_batch_size: [0] }",
        "dynamic batching preferred size must be positive for m",
    ),
    (
        "dynamic_batching { preferred_batch_size: [2, 5] }",
        "dynamic batching preferred size must be <= max batch size for m",
    ),
    (
        "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true for m",
    ),
    (
        "dynamic_batching { preserve_ordering: true "
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100 } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
    ),
    (
        "dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
        "priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 5 } } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
    ),
    (
        "dynamic_batching { priority_levels: 2 }",
        "default priority level must be in range [1, 2] for m",
    ),
    (
        "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
        "default priority level must be in range [1, 2] for m",
    ),
    (
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 3 value { max_queue_size: 1 } } }",
        "priority queue policy must have priority level in range [1, 2] for m",
    ),
    (
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 0 value { max_queue_size: 1 } } }",
        "priority queue policy must have priority level in range [1, 2] for m",
    ),
]

SEQUENCE_STRATEGY_CASES = [
    (
        "sequence_batching { oldest { preferred_batch_size: [0] } }",
        "sequence batching preferred batch size must be positive for m",
    ),
    (
        "sequence_batching { oldest { preferred_batch_size: [2, 9] } }",
        "sequence batching preferred batch size must be <= max batch size for m",
    ),
    (
        "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
    ),
]

IO_CASES = [
    ("max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
    ("input [{ data_type: TYPE_FP32 dims: [1] }]", "model input must specify 'name' for m"),
    ('input [{ name: "I" dims: [1] }]', "model input 'I' must specify 'data_type' for m"),
    ('input [{ name: "I" data_type: TYPE_FP32 }]', "model input 'I' must specify 'dims' for m"),
    (
        'input [{ name: "I" data_type: TYPE_FP32 dims: [0] }]',
        "model input 'I' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m",
    ),
    (
        'input [{ name: "I" data_type: TYPE_FP32 dims: [-2] }]',
        "model input 'I' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m",
    ),
    (
        'input [{ name: "I" data_type: TYPE_FP32 dims: [1] }, { name: "I" data_type: TYPE_FP32 dims: [2] }]',
        "model input 'I' is specified more than once for m",
    ),
    (
        'input [{ name: "I" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, 4] }]',
        "model input 'I' NHWC/NCHW require 3 dims for m",
    ),
    ("output [{ data_type: TYPE_FP32 dims: [1] }]", "model output must specify 'name' for m"),
    ('output [{ name: "O" dims: [1] }]', "model output 'O' must specify 'data_type' for m"),
    ('output [{ name: "O" data_type: TYPE_FP32 }]', "model output 'O' must specify 'dims' for m"),
    (
        'output [{ name: "O" data_type: TYPE_FP32 dims: [1] }, { name: "O" data_type: TYPE_FP32 dims: [1] }]',
        "model output 'O' is specified more than once for m",
    ),
    (
        'max_batch_size: 0 output [{ name: "O" data_type: TYPE_FP32 dims: [1] reshape { } }]',
        "model output 'O' cannot have empty reshape for non-batching model m",
    ),
]

STATE_CASES = [
    (
        states('{ output_name: "OUT_S" data_type: TYPE_FP32 dims: [1] }'),
        "sequence batching state must specify 'input_name' (or 'name') for m",
    ),
    (
        states('{ input_name: "IN_S" data_type: TYPE_FP32 dims: [1] }'),
        "sequence batching state 'IN_S' must specify 'output_name' (or 'name') for m",
    ),
    (
        states('{ input_name: "IN_S" output_name: "OUT_S" dims: [1] }'),
        "sequence batching state 'IN_S' must specify 'data_type' for m",
    ),
    (
        states('{ name: "S" data_type: TYPE_FP32 dims: [0] }'),
        "sequence batching state 'S' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m",
    ),
    (
        states('{ name: "S" input_name: "X" data_type: TYPE_FP32 dims: [1] }'),
        "sequence batching state 'S' sets both 'name' and a different 'input_name' ('X') for m",
    ),
]


@pytest.mark.parametrize(
    ("snippet", "message"),
    CONTROL_CASES + INITIAL_STATE_CASES + DYNAMIC_CASES + SEQUENCE_STRATEGY_CASES + IO_CASES + STATE_CASES,
)
def test_validation_message(tmp_path: Path, snippet: str, message: str) -> None:
    base = BASE.replace("max_batch_size: 4\n", "") if "max_batch_size" in snippet else BASE
    with pytest.raises(ModelConfigError) as info:
        load(tmp_path, base + snippet)
    assert str(info.value) == message
    assert info.value.code == Code.INVALID_ARG


def test_initial_state_data_file_too_short(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, BASE + states(state(init(f'{INIT_OK} data_file: "init.bin"'))))
    (model_dir / "initial_state").mkdir()
    (model_dir / "initial_state" / "init.bin").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ModelConfigError) as info:
        load_model_config(model_dir)
    # Triton's text, including the missing space before "only".
    assert str(info.value) == (
        "initial_state setting expects 8 bytes, but the data provided from init.binonly has 4 bytes."
    )


def test_initial_state_data_file_missing(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, BASE + states(state(init(f'{INIT_OK} data_file: "nope.bin"'))))
    with pytest.raises(ModelConfigError, match=r"failed to read initial state from .*nope\.bin"):
        load_model_config(model_dir)


@pytest.mark.parametrize("data_file", ["../config.pbtxt", "/etc/hostname"])
def test_initial_state_data_file_must_stay_inside(tmp_path: Path, data_file: str) -> None:
    model_dir = write_model(tmp_path, BASE + states(state(init(f'{INIT_OK} data_file: "{data_file}"'))))
    (model_dir / "initial_state").mkdir()
    with pytest.raises(ModelConfigError, match="must be a file inside"):
        load_model_config(model_dir)


VALID_SNIPPETS = [
    # CORRID may be any of the allowed types, STRING included.
    seq(control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING")),
    seq(control("C", "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32")),
    # data_type is ignored for boolean controls.
    seq(control("S", f"{START_OK} data_type: TYPE_STRING")),
    # Triton's quirk: several kinds in one control_input pass validation.
    seq(
        '{ name: "X" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }, '
        "{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] }"
    ),
    # Minimum slot utilization 0.0 is accepted despite the "(0.0, 1.0]" text.
    "sequence_batching { direct { minimum_slot_utilization: 0.0 } }",
    "sequence_batching { direct { minimum_slot_utilization: 1.0 } }",
    # DELAY without a timeout never reorders, so preserve_ordering allows it.
    "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY } }",
    "dynamic_batching { priority_levels: 3 default_priority_level: 3 priority_queue_policy { key: 1 value { } } }",
    # A -1 state dim accepts any fixed initial dim; zero_data's value is not checked.
    states(state(init(f"{INIT_OK} zero_data: false"))),
    # State and control tensors may be listed as inputs/outputs without dims.
    seq(control("START", START_OK)) + 'input [{ name: "START" data_type: TYPE_INT32 }]',
    states(state()) + 'input [{ name: "IN_S" data_type: TYPE_INT32 }] output [{ name: "OUT_S" data_type: TYPE_INT32 }]',
    states(state(names='name: "S" input_name: "S" output_name: "S"')),
    # Duplicate state names only warn, like Triton.
    states(state(), state()),
    # Both batchers in one config (Triton makes them a oneof; seqserve does not).
    "dynamic_batching { } sequence_batching { }",
]


@pytest.mark.parametrize("snippet", VALID_SNIPPETS)
def test_valid_configs(tmp_path: Path, snippet: str) -> None:
    load(tmp_path, BASE + IO + snippet)


def test_initial_state_data_file_long_enough(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, BASE + states(state(init(f'{INIT_OK} data_file: "init.bin"'))))
    (model_dir / "initial_state").mkdir()
    (model_dir / "initial_state" / "init.bin").write_bytes(bytes(range(12)))
    cfg = load_model_config(model_dir)
    data, shape = read_initial_state(model_dir, cfg.sequence_batching.state[0], cfg.max_batch_size)
    assert data == bytes(range(8))  # extra bytes are ignored
    assert shape == (1, 2)


# --------------------------------------------------------------------------
# Parsing and names


def test_unknown_field_names_field_file_and_line(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, 'name: "m"\nmax_batch_size: 2\nfoo: 1\n')
    with pytest.raises(ModelConfigError) as info:
        load_model_config(model_dir)
    path = model_dir / "config.pbtxt"
    assert str(info.value) == (
        f'failed to read text proto from {path}: 3:1 : Message type "inference.ModelConfig" has no field named "foo".'
    )
    assert info.value.code == Code.INTERNAL


def test_unknown_nested_field(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError) as info:
        load(tmp_path, 'name: "m"\nsequence_batching {\n  max_idle: 5\n}\n')
    message = str(info.value)
    assert "config.pbtxt: 3:" in message
    assert '"inference.ModelSequenceBatching" has no field named "max_idle"' in message


def test_syntax_error(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"failed to read text proto from .*config\.pbtxt: 2:"):
        load(tmp_path, 'name: "m"\nmax_batch_size: "eight"\n')


def test_direct_and_oldest_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="another member of oneof"):
        load(tmp_path, BASE + "sequence_batching { direct { } oldest { } }")


def test_text_format_flexibility(tmp_path: Path) -> None:
    # Repeated fields both ways, optional ':' before '{', comments, map entries.
    cfg = load(
        tmp_path,
        """
        name: "m"  # comment
        max_batch_size: 2
        input { name: "A" data_type: TYPE_INT64 dims: 1 dims: 2 }
        input: { name: "B" data_type: TYPE_STRING dims: [ -1 ] }
        parameters { key: "k" value { string_value: "v" } }
        """,
    )
    assert [list(i.dims) for i in cfg.input] == [[1, 2], [-1]]
    assert cfg.parameters["k"].string_value == "v"


def test_name_defaults_to_directory(tmp_path: Path) -> None:
    cfg = load_model_config(write_model(tmp_path, "max_batch_size: 1", name="dirname"))
    assert cfg.name == "dirname"


def test_name_mismatch_is_an_error(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, 'name: "other"', name="dirname")
    with pytest.raises(ModelConfigError) as info:
        load_model_config(model_dir)
    assert str(info.value) == (
        f"model name 'other' in {model_dir / 'config.pbtxt'} does not match the model directory name 'dirname'"
    )
    assert info.value.code == Code.INVALID_ARG


def test_explicit_name(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, 'name: "other"', name="dirname")
    assert load_model_config(model_dir, name="other").name == "other"
    with pytest.raises(ModelConfigError, match="does not match the expected model name 'third'"):
        load_model_config(model_dir, name="third")


def test_missing_config_file_gives_named_default_config(tmp_path: Path) -> None:
    (tmp_path / "bare" / "1").mkdir(parents=True)
    cfg = load_model_config(tmp_path / "bare")
    assert cfg.name == "bare"
    assert cfg.max_batch_size == 0
    assert [g.name for g in cfg.instance_group] == ["bare_0"]


def test_errors_are_inference_errors() -> None:
    err = ModelConfigError("bad")
    assert isinstance(err, InferenceError)
    assert (err.code, err.message, str(err)) == (Code.INVALID_ARG, "bad", "bad")
    base = InferenceError(Code.NOT_FOUND, "gone")
    assert str(base) == "gone"
    assert base.code is Code.NOT_FOUND
    assert ModelConfigError("x", Code.INTERNAL).code is Code.INTERNAL


# --------------------------------------------------------------------------
# Brief configs: must parse unchanged


@pytest.mark.parametrize("dirname", ["lstm_from_brief_a", "rnn_from_brief_b"])
def test_brief_configs_parse_unchanged(dirname: str) -> None:
    text = (BRIEF / dirname / "config.pbtxt").read_text()
    text_format.Parse(text, ModelConfig())


def test_brief_a_extensions(tmp_path: Path) -> None:
    cfg = load_model_config(BRIEF / "lstm_from_brief_a", name="my_lstm_model")
    assert cfg.HasField("dynamic_batching") and cfg.HasField("sequence_batching")
    dyn = cfg.dynamic_batching
    assert dyn.preserve_ordering and dyn.default_batch_size == 4
    assert dyn.max_queue_delay_microseconds == 10000
    assert dyn.timeout_action == SeqserveTimeoutAction.TIMEOUT_REJECT
    sb = cfg.sequence_batching
    assert sb.max_sequence_idle_microseconds == 600_000_000
    assert sb.timeout_action == SeqserveTimeoutAction.TIMEOUT_REJECT
    # reusable_batch is a strategy: normalization must not add direct.
    assert sb.WhichOneof("strategy_choice") == "reusable_batch"
    assert sb.reusable_batch.max_size == 8
    assert list(sb.reusable_batch.candidate_batch_size) == [4, 8]
    (st,) = sb.state
    assert (st.name, st.data_type, list(st.dims)) == ("lstm_state", DataType.TYPE_FP32, [2, 1024])
    assert state_input_name(st) == state_output_name(st) == "lstm_state"
    assert cfg.instance_group[0].kind == ModelInstanceGroup.KIND_CPU


def test_brief_b_extensions() -> None:
    cfg = load_model_config(BRIEF / "rnn_from_brief_b", name="rnn_model")
    policy = cfg.model_transaction_policy.stateful_model_policy
    assert policy.timeout_action == ModelTransactionPolicy.StatefulModelPolicy.DESCRIBE
    assert not cfg.dynamic_batching.preserve_ordering
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8]


def test_timeout_complete_value(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE + "sequence_batching { timeout_action: TIMEOUT_COMPLETE }")
    assert cfg.sequence_batching.timeout_action == SeqserveTimeoutAction.TIMEOUT_COMPLETE


# --------------------------------------------------------------------------
# Defaults


def test_defaults_for_minimal_config(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'name: "m"')
    assert cfg.version_policy.WhichOneof("policy_choice") == "latest"
    assert cfg.version_policy.latest.num_versions == 1
    (group,) = cfg.instance_group
    assert (group.name, group.count, group.kind) == ("m_0", 1, ModelInstanceGroup.KIND_AUTO)
    assert cfg.optimization.input_pinned_memory.enable
    assert cfg.optimization.output_pinned_memory.enable
    assert not cfg.HasField("sequence_batching")
    assert not cfg.HasField("dynamic_batching")


def test_explicit_values_are_kept(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        BASE + "version_policy { all { } } optimization { input_pinned_memory { enable: false } }",
    )
    assert cfg.version_policy.WhichOneof("policy_choice") == "all"
    assert not cfg.optimization.input_pinned_memory.enable
    assert cfg.optimization.output_pinned_memory.enable


def test_instance_group_defaults(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        BASE + 'instance_group [{ count: 0 }, { name: "g" count: 3 kind: KIND_GPU }, { kind: KIND_CPU }]',
    )
    assert [g.name for g in cfg.instance_group] == ["m_0", "g", "m_2"]
    assert [g.count for g in cfg.instance_group] == [1, 3, 1]
    assert [g.kind for g in cfg.instance_group] == [
        ModelInstanceGroup.KIND_AUTO,
        ModelInstanceGroup.KIND_GPU,
        ModelInstanceGroup.KIND_CPU,
    ]


def test_sequence_batching_defaults(tmp_path: Path) -> None:
    sb = load(tmp_path, BASE + "sequence_batching { }").sequence_batching
    assert sb.max_sequence_idle_microseconds == 1_000_000
    assert sb.WhichOneof("strategy_choice") == "direct"
    assert sb.direct.max_queue_delay_microseconds == 0


def test_sequence_idle_is_kept(tmp_path: Path) -> None:
    sb = load(tmp_path, BASE + "sequence_batching { max_sequence_idle_microseconds: 5 }").sequence_batching
    assert sb.max_sequence_idle_microseconds == 5


@pytest.mark.parametrize(
    ("max_batch_size", "candidates", "preferred"),
    [(4, 4, [4]), (0, 1, []), (1, 1, [1])],
)
def test_oldest_defaults(tmp_path: Path, max_batch_size: int, candidates: int, preferred: list[int]) -> None:
    sb = load(
        tmp_path, f'name: "m" max_batch_size: {max_batch_size} sequence_batching {{ oldest {{ }} }}'
    ).sequence_batching
    assert sb.oldest.max_candidate_sequences == candidates
    assert list(sb.oldest.preferred_batch_size) == preferred


def test_oldest_explicit_values_are_kept(tmp_path: Path) -> None:
    sb = load(
        tmp_path,
        BASE + "sequence_batching { oldest { max_candidate_sequences: 16 preferred_batch_size: [2] } }",
    ).sequence_batching
    assert sb.oldest.max_candidate_sequences == 16
    assert list(sb.oldest.preferred_batch_size) == [2]


@pytest.mark.parametrize(("max_batch_size", "preferred"), [(8, [8]), (0, [])])
def test_dynamic_batching_defaults(tmp_path: Path, max_batch_size: int, preferred: list[int]) -> None:
    cfg = load(tmp_path, f'name: "m" max_batch_size: {max_batch_size} dynamic_batching {{ }}')
    assert list(cfg.dynamic_batching.preferred_batch_size) == preferred


def test_normalize_is_idempotent(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE + "dynamic_batching { } sequence_batching { oldest { } } instance_group [{}]")
    again = ModelConfig()
    again.CopyFrom(cfg)
    normalize_config(again)
    validate_config(again, tmp_path / "m")
    assert again == cfg


# --------------------------------------------------------------------------
# Data types


def test_dtype_helpers() -> None:
    assert wire_dtype_name(DataType.TYPE_STRING) == "BYTES"
    assert wire_dtype_name(DataType.TYPE_FP32) == "FP32"
    assert wire_dtype_name(DataType.TYPE_BF16) == "BF16"
    assert from_wire_dtype_name("BYTES") == DataType.TYPE_STRING
    assert from_wire_dtype_name("UINT64") == DataType.TYPE_UINT64
    assert from_wire_dtype_name("STRING") == DataType.TYPE_INVALID
    assert from_wire_dtype_name("nope") == DataType.TYPE_INVALID
    assert to_numpy_dtype(DataType.TYPE_FP16) == np.float16
    assert to_numpy_dtype(DataType.TYPE_STRING) == np.dtype(object)
    assert to_numpy_dtype(DataType.TYPE_BF16) is None
    with pytest.raises(ValueError):
        to_numpy_dtype(DataType.TYPE_INVALID)


def test_dtype_table_covers_every_config_type() -> None:
    # One table: every tensor datatype of the config enum has one entry, and each layer's
    # name for it round-trips.
    assert {d.config for d in DATA_TYPES} == {v for _, v in DataType.items() if v != DataType.TYPE_INVALID}
    for name, value in DataType.items():
        if value == DataType.TYPE_INVALID:
            assert value not in BY_CONFIG
            continue
        d = BY_CONFIG[value]
        assert d.config_name == name
        assert from_wire_dtype_name(wire_dtype_name(value)) == value, name
        np_dtype = to_numpy_dtype(value)
        if np_dtype is not None and not d.is_bytes:
            assert np_dtype.itemsize == d.itemsize, name
            assert numpy_wire_name(np_dtype) == d.wire, name
    assert numpy_wire_name(np.dtype("S3")) == "BYTES"


# --------------------------------------------------------------------------
# Initial state data


def _state(text: str) -> ModelSequenceBatching.State:
    return text_format.Parse(text, ModelSequenceBatching.State())


def test_read_initial_state_zero_data(tmp_path: Path) -> None:
    st = _state(state(init(f"{INIT_OK} zero_data: true"), names="input_name: 'I' output_name: 'O'")[1:-1])
    assert read_initial_state(tmp_path, st, 4) == (bytes(8), (1, 2))


def test_read_initial_state_string(tmp_path: Path) -> None:
    st = _state(
        "input_name: 'I' output_name: 'O' data_type: TYPE_STRING dims: [3] "
        "initial_state { data_type: TYPE_STRING dims: [3] name: 'z' zero_data: true }"
    )
    # Three empty strings: a 4-byte zero length each.
    assert read_initial_state(tmp_path, st, 0) == (bytes(12), (3,))
    (tmp_path / "initial_state").mkdir()
    blob = b"\x01\x00\x00\x00a\x00\x00\x00\x00\x02\x00\x00\x00bc"
    (tmp_path / "initial_state" / "s.bin").write_bytes(blob)
    st.initial_state[0].data_file = "s.bin"
    assert read_initial_state(tmp_path, st, 0) == (blob, (3,))


def test_read_initial_state_without_initial_state(tmp_path: Path) -> None:
    st = _state("name: 'S' data_type: TYPE_FP64 dims: [-1, 3]")
    assert read_initial_state(tmp_path, st, 2) == (bytes(24), (1, 3))


def test_read_initial_state_short_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "f.bin").write_bytes(b"abc")
    st = _state(state(init(f'{INIT_OK} data_file: "f.bin"'), names="name: 'S'")[1:-1])
    with pytest.raises(ModelConfigError, match=r"expects 8 bytes, but the data provided from f\.binonly has 3"):
        read_initial_state(tmp_path, st, 1)


# --------------------------------------------------------------------------
# JSON


def test_config_to_json(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        BASE
        + IO
        + "sequence_batching { max_sequence_idle_microseconds: 9007199254740993 }"
        + "dynamic_batching { priority_levels: 1 default_priority_level: 1 "
        + "priority_queue_policy { key: 1 value { default_timeout_microseconds: 7 } } }",
    )
    out = config_to_json(cfg)
    json.dumps(out)  # plain JSON types only
    assert out["name"] == "m"
    assert out["platform"] == ""  # defaults are printed
    assert out["max_batch_size"] == 4
    assert out["input"][0]["dims"] == [1]  # numbers, not strings
    assert out["input"][0]["data_type"] == "TYPE_FP32"
    assert out["input"][0]["format"] == "FORMAT_NONE"
    assert out["version_policy"] == {"latest": {"num_versions": 1}}
    assert out["sequence_batching"]["max_sequence_idle_microseconds"] == 9007199254740993
    assert out["sequence_batching"]["direct"]["max_queue_delay_microseconds"] == 0
    dyn = out["dynamic_batching"]
    assert dyn["priority_levels"] == 1
    assert dyn["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7
    assert out["instance_group"][0]["kind"] == "KIND_AUTO"
    # It reads back as the same config.
    assert json_format.ParseDict(out, ModelConfig()) == cfg
