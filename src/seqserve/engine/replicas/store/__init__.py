"""Where sequences wait between replicas: the shared store (docs/state-store.md). ``base`` is the
contract every backend keeps; ``open_store`` picks the backend from a URL."""

from __future__ import annotations

import urllib.parse

from seqserve.engine.replicas.store.base import (
    Claim,
    Entry,
    HandoverHandler,
    SequenceKey,
    StateStore,
    Status,
    StoreError,
    StoreLostError,
    default_replica_id,
    redact_url,
)
from seqserve.engine.replicas.store.measured import MeasuredStore

__all__ = [
    "Claim",
    "Entry",
    "HandoverHandler",
    "SequenceKey",
    "StateStore",
    "Status",
    "StoreError",
    "StoreLostError",
    "default_replica_id",
    "open_store",
    "redact_url",
]


def open_store(url: str, replica_id: str, *, heartbeat_ttl_s: float = 10.0) -> StateStore:
    """A store from its URL: ``redis://host:port/db`` (also ``rediss://``, ``unix://``) or
    ``dir:///path``, its operations timed and their failures counted for ``/metrics``
    (``MeasuredStore``). Raises ValueError for anything else."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    # each backend is imported when it is used: redis-py is optional, fcntl POSIX-only
    if scheme in ("redis", "rediss", "unix"):
        from seqserve.engine.replicas.store.redis_store import RedisStore

        return MeasuredStore(RedisStore(url, replica_id, heartbeat_ttl_s=heartbeat_ttl_s))
    if scheme == "dir":
        from seqserve.engine.replicas.store.dir_store import DirStore

        path = urllib.parse.urlsplit(url).path
        if not path or not path.startswith("/"):
            raise ValueError(f"a dir:// state store needs an absolute path (dir:///var/lib/seqserve), got '{url}'")
        return MeasuredStore(DirStore(path, replica_id, heartbeat_ttl_s=heartbeat_ttl_s))
    raise ValueError(f"unknown state store '{url}': use redis://host:port/db or dir:///path")
