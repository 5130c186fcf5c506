"""The seqserve engine: model repository, schedulers over the compiled core, backends and
the in-process API. Nothing here knows about HTTP, gRPC or wire formats.

What the front-ends (``seqserve.api``) use comes from here and from ``seqserve.engine.tensors``
(the datatype table and the BYTES codec); nothing else of the engine is theirs to import.
"""

from __future__ import annotations

from seqserve.engine.batch import ExecuteBatch, RaggedInput
from seqserve.engine.checkpoint import (
    CheckpointError,
    CheckpointUnsupportedError,
    SequenceBusyError,
    SequenceCheckpoint,
    SequenceReleasedError,
)
from seqserve.engine.counters import ModelCounters
from seqserve.engine.errors import Code, DecoupledModelError, InferenceError, ModelConfigError
from seqserve.engine.model.execution import DEFAULT_INLINE_MAX_BATCH_US
from seqserve.engine.model.loaded import DEFAULT_MAX_BACKLOG_SEQUENCES
from seqserve.engine.model_control import (
    DEFAULT_REPOSITORY_POLL_SECS,
    SERVER_NOT_READY,
    ModelControlMode,
    startup_models,
)
from seqserve.engine.ordering import OrderedRelease
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.scope import SequenceScope
from seqserve.engine.server import Server
from seqserve.engine.server_state import SERVER_EXITING, SERVER_STOPPING
from seqserve.engine.sessions import (
    DEFAULT_TOMBSTONE_MAX,
    DEFAULT_TOMBSTONE_S,
    EndedSequence,
    SequenceInfo,
    SequenceList,
    SessionGoneError,
    SessionPolicy,
    parse_sequence_id,
)
from seqserve.engine.statestore import StateStore, default_replica_id, open_store, redact_url

__all__ = [
    "DEFAULT_INLINE_MAX_BATCH_US",
    "DEFAULT_MAX_BACKLOG_SEQUENCES",
    "DEFAULT_REPOSITORY_POLL_SECS",
    "DEFAULT_TOMBSTONE_MAX",
    "DEFAULT_TOMBSTONE_S",
    "SERVER_EXITING",
    "SERVER_NOT_READY",
    "SERVER_STOPPING",
    "CheckpointError",
    "CheckpointUnsupportedError",
    "Code",
    "DecoupledModelError",
    "EndedSequence",
    "ExecuteBatch",
    "InferRequest",
    "InferResult",
    "InferenceError",
    "ModelConfigError",
    "ModelControlMode",
    "ModelCounters",
    "OrderedRelease",
    "RaggedInput",
    "ResponseCallback",
    "SequenceBusyError",
    "SequenceCheckpoint",
    "SequenceId",
    "SequenceInfo",
    "SequenceList",
    "SequenceReleasedError",
    "SequenceScope",
    "Server",
    "SessionGoneError",
    "SessionPolicy",
    "StateStore",
    "default_replica_id",
    "open_store",
    "parse_sequence_id",
    "redact_url",
    "startup_models",
]
