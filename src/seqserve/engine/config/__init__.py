"""Model configuration: read ``config.pbtxt``, apply defaults, validate.

The file is protobuf text format of ``protos/model_config.proto`` (Triton's
``inference.ModelConfig`` plus seqserve extensions). Defaults and error
messages follow Triton's, because users and tools compare against them.

- ``parse``: config.pbtxt or JSON in, JSON out; the load pipeline;
- ``defaults``: Triton's defaults; ``extensions``: our extension fields, in standard terms;
- ``validate``: every check, with Triton's messages;
- ``initial_state``: the bytes an implicit state starts from.
Datatypes are not here: see ``seqserve.engine.tensors``.
"""

from __future__ import annotations

from seqserve.engine.config.defaults import normalize_config
from seqserve.engine.config.initial_state import read_initial_state
from seqserve.engine.config.names import CONFIG_FILENAME, DEFAULT_MAX_SEQUENCE_IDLE_US, INITIAL_STATE_DIR
from seqserve.engine.config.parse import (
    config_from_json,
    config_to_json,
    finish_model_config,
    load_model_config,
    parse_config_json,
    parse_model_config,
)
from seqserve.engine.config.validate import state_input_name, state_output_name, validate_config, validate_paths

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_MAX_SEQUENCE_IDLE_US",
    "INITIAL_STATE_DIR",
    "config_from_json",
    "config_to_json",
    "finish_model_config",
    "load_model_config",
    "normalize_config",
    "parse_config_json",
    "parse_model_config",
    "read_initial_state",
    "state_input_name",
    "state_output_name",
    "validate_config",
    "validate_paths",
]
