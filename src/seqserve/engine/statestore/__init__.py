"""Where sequences go between replicas: the state store (see docs/state-store.md)."""

from seqserve.engine.statestore.base import (
    Claim,
    Entry,
    HandoverHandler,
    SequenceKey,
    StateStore,
    Status,
    StoreError,
    open_store,
    redact,
)

__all__ = [
    "Claim",
    "Entry",
    "HandoverHandler",
    "SequenceKey",
    "StateStore",
    "Status",
    "StoreError",
    "open_store",
    "redact",
]
