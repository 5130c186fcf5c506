"""The engine's side of ``seqserve serve --workers N``: the records front-end worker processes
send through the shared-memory rings, and the slow path that runs them on the ``Server``.

What the front-end workers (``seqserve.api.workers``) may use of the transport is exported here:
the region and record header of the compiled core, the record codec, and the engine's side."""

from __future__ import annotations

from seqserve.engine._core import RequestHeader, ShmRegion
from seqserve.engine.workers import records
from seqserve.engine.workers.records import (
    BY_NAME,
    META_INDEX,
    RING_MAX_BYTES,
    SLAB_CLASSES,
    ReplyMeta,
    RequestMeta,
)
from seqserve.engine.workers.slow_path import RingDrain, SlowPath

__all__ = [
    "BY_NAME",
    "META_INDEX",
    "RING_MAX_BYTES",
    "SLAB_CLASSES",
    "ReplyMeta",
    "RequestHeader",
    "RequestMeta",
    "RingDrain",
    "ShmRegion",
    "SlowPath",
    "records",
]
