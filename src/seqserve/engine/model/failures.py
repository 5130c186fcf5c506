"""A model's failed batches, where operators and clients look: each failed request is logged
at ERROR (model, version, request id, sequence id, the exception attached: the log shows its
traceback only when the operator asks), and its client gets one line that names the same
request id, never a traceback. A model failing every request cannot flood the log: at most
LINES_PER_INTERVAL lines per model version per INTERVAL_S, then one line with the count.
The request id is the client's own when it gave one, else one made here."""

from __future__ import annotations

import logging
import secrets
import threading
import time

from seqserve.engine.errors import InferenceError
from seqserve.engine.model.delivery import Pending

log = logging.getLogger("seqserve.model")

INTERVAL_S = 60.0
LINES_PER_INTERVAL = 100


def one_line(text: str, limit: int = 500) -> str:
    """The first line of ``text``, cut to ``limit`` characters."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


class FailureReport:
    """One model version's failed requests (any thread)."""

    def __init__(self, name: str, version: str, *, is_sequence: bool) -> None:
        self.name = name
        self.version = version
        self.is_sequence = is_sequence
        self._lock = threading.Lock()
        self._window = -INTERVAL_S
        self._lines = 0
        self._unlogged = 0

    def failed(self, rec: Pending, err: InferenceError, cause: BaseException | None) -> InferenceError:
        """Log that ``rec`` failed with ``err`` (raised as ``cause``) and return what its
        client gets: ``<the error's first line> (request id <id>)``: the message a Triton
        client matches on comes first, unchanged."""
        request = rec.checked.request
        rid = request.id or secrets.token_hex(6)
        message = one_line(err.message)
        if self._may_log():
            sequence = f" sequence {rec.checked.corrid}" if self.is_sequence else ""
            log.error(
                "[request id: %s] model '%s' version %s%s: %s",
                rid,
                self.name,
                self.version,
                sequence,
                message,
                exc_info=cause,
                extra={
                    "fields": {
                        "model": self.name,
                        "version": self.version,
                        "request_id": rid,
                        "sequence_id": rec.checked.corrid if self.is_sequence else None,
                    }
                },
            )
        return InferenceError(err.code, f"{message} (request id {rid})")

    def _may_log(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._window >= INTERVAL_S:
                if self._unlogged:
                    log.error(
                        "model '%s' version %s: %d more failed requests were not logged",
                        self.name,
                        self.version,
                        self._unlogged,
                    )
                self._window, self._lines, self._unlogged = now, 0, 0
            if self._lines < LINES_PER_INTERVAL:
                self._lines += 1
                return True
            self._unlogged += 1
            return False
