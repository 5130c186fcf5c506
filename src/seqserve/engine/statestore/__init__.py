"""Where sequences go between replicas: the state store (see docs/state-store.md)."""

from seqserve.engine.statestore.base import (
    Claim,
    Entry,
    HandoverHandler,
    SequenceKey,
    StateStore,
    Status,
    StoreError,
    default_replica_id,
    open_store,
    redact_url,
)

__all__ = [
    "Claim",
    "Entry",
    "HandoverHandler",
    "SequenceKey",
    "StateStore",
    "Status",
    "StoreError",
    "default_replica_id",
    "open_store",
    "redact_url",
]
