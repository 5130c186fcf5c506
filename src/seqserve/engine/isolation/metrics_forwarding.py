"""Custom metrics of a model in an isolated process reach the server's ``/metrics``: the child
sends a JSON snapshot of its own metric registry over the event channel (``METRICS``) whenever
it changed, at most every ``FORWARD_INTERVAL_S`` and once more before it finalizes; the server
checks it (it comes from a model's process) and shows it under its instance's name."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import orjson

from seqserve.engine.custom_metrics import REGISTRY, check_snapshot
from seqserve.engine.isolation.protocol import METRICS, ProtocolError

log = logging.getLogger("seqserve.isolation")

FORWARD_INTERVAL_S = 0.25
#: a snapshot larger than this is not sent (child) and not accepted (server)
MAX_SNAPSHOT_BYTES = 4 << 20


class MetricsForwarder:
    """Child side: sends the registry's snapshot through ``send`` (the event client) when it
    changed; a thread of its own flushes every FORWARD_INTERVAL_S."""

    def __init__(self, send: Callable[[bytes], bool]) -> None:
        self._send = send
        self._sent = REGISTRY.changes()  # nothing defined yet: nothing to send
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = False
        threading.Thread(target=self._run, name="seqserve-metrics-forward", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(FORWARD_INTERVAL_S):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            changes = REGISTRY.changes()
            if changes == self._sent:
                return
            payload = orjson.dumps(REGISTRY.snapshot(local=True))
            if len(payload) > MAX_SNAPSHOT_BYTES:
                if not self._warned:
                    log.warning("custom metrics snapshot of %d bytes is over %d: not forwarded", len(payload),
                                MAX_SNAPSHOT_BYTES)  # fmt: skip
                    self._warned = True
                return
            if self._send(bytes((METRICS,)) + payload):
                self._sent = changes

    def close(self) -> None:
        """Stop the thread after a last flush."""
        self._stop.set()
        self.flush()


def receive_snapshot(body: memoryview, source: str) -> None:
    """Server side: a ``METRICS`` event from instance ``source``; ProtocolError if malformed."""
    if len(body) - 1 > MAX_SNAPSHOT_BYTES:
        raise ProtocolError(f"metrics snapshot of {len(body) - 1} bytes (at most {MAX_SNAPSHOT_BYTES})")
    try:
        families = check_snapshot(orjson.loads(body[1:]))
    except (orjson.JSONDecodeError, ValueError) as e:
        raise ProtocolError(f"bad metrics snapshot: {e}") from None
    REGISTRY.merge_remote(source, families)


def forget_source(source: str) -> None:
    """Server side: the instance is gone (unloaded); its forwarded metrics go with it."""
    REGISTRY.merge_remote(source, None)
