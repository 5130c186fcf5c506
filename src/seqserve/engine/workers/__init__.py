"""The engine's side of ``seqserve serve --workers N``: the records front-end worker processes
send through the shared-memory rings, and the slow path that runs them on the ``Server``.

What the front-end workers (``seqserve.api.workers``) may use of the engine besides
``seqserve.engine`` itself is exported here: the transport of the compiled core (``ShmRegion``,
``RingFeeder``, the reply flags), the record codec, the engine's slow path, and what a worker
needs to validate a request and answer it as the engine would."""

from __future__ import annotations

from seqserve.engine._core import (
    REPLY_BACKLOG_FULL,
    REPLY_ERROR,
    REPLY_FINAL,
    REPLY_RELEASED,
    REPLY_RETRY_SHIFT,
    RequestHeader,
    RingFeeder,
    ShmRegion,
)
from seqserve.engine.model.loaded import BACKLOG_RETRY_AFTER_S, LoadedModel
from seqserve.engine.model.spec import build_core_spec
from seqserve.engine.model.validation import CheckedRequest, RequestValidator
from seqserve.engine.replicas.checkpoint import SequenceReleasedError
from seqserve.engine.workers import records
from seqserve.engine.workers.records import (
    BY_NAME,
    META_INDEX,
    RING_MAX_BYTES,
    SLAB_CLASSES,
    ReplyMeta,
    RequestMeta,
)
from seqserve.engine.workers.slow_path import SlowPath

__all__ = [
    "BACKLOG_RETRY_AFTER_S",
    "BY_NAME",
    "META_INDEX",
    "REPLY_BACKLOG_FULL",
    "REPLY_ERROR",
    "REPLY_FINAL",
    "REPLY_RELEASED",
    "REPLY_RETRY_SHIFT",
    "RING_MAX_BYTES",
    "SLAB_CLASSES",
    "CheckedRequest",
    "LoadedModel",
    "ReplyMeta",
    "RequestHeader",
    "RequestMeta",
    "RequestValidator",
    "RingFeeder",
    "SequenceReleasedError",
    "ShmRegion",
    "SlowPath",
    "build_core_spec",
    "records",
]
