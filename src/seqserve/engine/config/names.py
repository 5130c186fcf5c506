"""File names and constants of a model's config."""

from __future__ import annotations

from seqserve._proto.model_config_pb2 import (
    ModelSequenceBatching,
)

CONFIG_FILENAME = "config.pbtxt"
INITIAL_STATE_DIR = "initial_state"
DEFAULT_MAX_SEQUENCE_IDLE_US = 1_000_000
WILDCARD_DIM = -1

Control = ModelSequenceBatching.Control
State = ModelSequenceBatching.State
