"""The seqserve engine: model repository, schedulers over the compiled core, backends and
the in-process API. Nothing here knows about HTTP, gRPC or wire formats.

The façade (``__all__``) is what the front-ends (``seqserve.api``) and embedding applications
use, with ``seqserve.engine.tensors`` (the datatype table and the BYTES codec): ``Server`` and
the defaults of its options; the request, its result and its errors; sequences, sessions and
their checkpoints; a model's statistics and counters; the replica state store
(``open_store``, and ``redact_url`` for logging its URL); the model-control policy
(``ModelControlMode``, and ``startup_models``, Triton's rules for ``--load-model``); and what
Python models are handed (``ExecuteBatch``, ``RaggedInput``). Nothing else of the engine is
theirs to import.
"""

from __future__ import annotations

from seqserve.engine.batch import ExecuteBatch, RaggedInput
from seqserve.engine.counters import ModelCounters
from seqserve.engine.errors import Code, DecoupledModelError, InferenceError, ModelConfigError
from seqserve.engine.model.execution import DEFAULT_INLINE_MAX_BATCH_US, WORKERS_INLINE_MAX_BATCH_US
from seqserve.engine.model.loaded import DEFAULT_MAX_BACKLOG_SEQUENCES
from seqserve.engine.ordering import OrderedRelease
from seqserve.engine.replicas.checkpoint import (
    CheckpointError,
    CheckpointUnsupportedError,
    SequenceBusyError,
    SequenceCheckpoint,
    SequenceReleasedError,
)
from seqserve.engine.replicas.store import StateStore, default_replica_id, open_store, redact_url
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.scope import SequenceScope
from seqserve.engine.server.drain import SERVER_EXITING
from seqserve.engine.server.model_control import (
    DEFAULT_REPOSITORY_POLL_SECS,
    SERVER_NOT_READY,
    ModelControlMode,
    startup_models,
)
from seqserve.engine.server.models import SERVER_STOPPING
from seqserve.engine.server.server import Server
from seqserve.engine.sessions import (
    DEFAULT_PER_CLIENT_DIVISOR,
    DEFAULT_TOMBSTONE_MAX,
    DEFAULT_TOMBSTONE_S,
    EndedSequence,
    SequenceInfo,
    SequenceList,
    SessionGoneError,
    SessionPolicy,
    parse_sequence_id,
    peer_host,
)
from seqserve.engine.statistics import ModelStatistics

__all__ = [
    "DEFAULT_INLINE_MAX_BATCH_US",
    "DEFAULT_MAX_BACKLOG_SEQUENCES",
    "DEFAULT_PER_CLIENT_DIVISOR",
    "DEFAULT_REPOSITORY_POLL_SECS",
    "DEFAULT_TOMBSTONE_MAX",
    "DEFAULT_TOMBSTONE_S",
    "SERVER_EXITING",
    "SERVER_NOT_READY",
    "SERVER_STOPPING",
    "WORKERS_INLINE_MAX_BATCH_US",
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
    "ModelStatistics",
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
    "peer_host",
    "redact_url",
    "startup_models",
]
