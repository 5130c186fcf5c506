"""The engine's side of ``seqserve serve --workers N``: the records front-end worker processes
send through the shared-memory rings, and the slow path that runs them on the ``Server``.

This package is also what the api's worker processes (api/workers/) may use of the engine
besides ``seqserve.engine`` itself: the transport (``ShmRegion``, ``RingFeeder``, the reply
flags), and what a worker needs to validate a request and answer it as the engine would."""

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

__all__ = [
    "BACKLOG_RETRY_AFTER_S",
    "REPLY_BACKLOG_FULL",
    "REPLY_ERROR",
    "REPLY_FINAL",
    "REPLY_RELEASED",
    "REPLY_RETRY_SHIFT",
    "CheckedRequest",
    "LoadedModel",
    "RequestHeader",
    "RequestValidator",
    "RingFeeder",
    "SequenceReleasedError",
    "ShmRegion",
    "build_core_spec",
]
