"""Unexpected failures in the front-ends: the client gets a 500 / INTERNAL with a message and a
request id, never an empty body or a stack trace; the log gets one line per failure naming
that id, and at most one full traceback per site every ``TRACEBACK_INTERVAL_S`` seconds (the
failures in between are counted and the count is logged with the next traceback), so a
client that can trigger a bug cannot flood the log."""

from __future__ import annotations

import logging
import secrets
import time

from seqserve.engine import Code, InferenceError

log = logging.getLogger("seqserve.api")

TRACEBACK_INTERVAL_S = 60.0
#: one-line reports per site per interval; beyond, failures are only counted
LINES_PER_INTERVAL = 100


class _Site:
    __slots__ = ("lines", "since", "suppressed", "traceback_at", "window")

    def __init__(self) -> None:
        self.traceback_at = -float("inf")
        self.window = -float("inf")
        self.lines = 0
        self.suppressed = 0  # failures since the last traceback that logged none
        self.since = 0  # failures not logged at all in this window


_sites: dict[str, _Site] = {}


def internal_error(site: str, exc: BaseException) -> InferenceError:
    """Log an unexpected exception raised while serving ``site`` (an rpc or route name) and
    return the INTERNAL error the client gets: ``internal error (request id <id>)``."""
    rid = secrets.token_hex(6)
    now = time.monotonic()
    s = _sites.get(site)
    if s is None:
        s = _sites[site] = _Site()
    if now - s.window >= TRACEBACK_INTERVAL_S:
        if s.since:
            log.error("%s: %d more internal errors were not logged", site, s.since)
        s.window, s.lines, s.since = now, 0, 0
    if now - s.traceback_at >= TRACEBACK_INTERVAL_S:
        extra = f" ({s.suppressed} more since the last traceback)" if s.suppressed else ""
        log.error("internal error (request id %s) in %s%s", rid, site, extra, exc_info=exc)
        s.traceback_at, s.suppressed = now, 0
    else:
        s.suppressed += 1
        if s.lines < LINES_PER_INTERVAL:
            s.lines += 1
            log.error("internal error (request id %s) in %s: %s: %s", rid, site, type(exc).__name__, str(exc)[:300])
        else:
            s.since += 1
    return InferenceError(Code.INTERNAL, f"internal error (request id {rid})")
