"""Stopping the replica machinery's background tasks (heartbeat, flusher, spill, handover
listener, loss recovery) at the shutdown, even when a cancellation is lost on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

#: how long a cancelled task gets to end before it is cancelled again (a pace, not a bound:
#: a task that ends at its first cancellation is never waited for longer than it takes)
RECANCEL_AFTER_S = 0.05


async def stop_tasks(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and return once every one has ended, cancelling again those that go on.

    A cancellation can be lost inside a library: on Python 3.11, ``asyncio.wait_for`` returns
    the result instead of raising CancelledError when the cancellation arrives as the result
    does, and redis-py writes every command under ``wait_for`` (its socket timeout). A loop
    whose cancellation was lost so runs on as if nobody had asked, and a plain ``await`` of it
    never returns; its next await takes the next cancellation. Their exceptions are retrieved
    (and dropped: the replica is stopping)."""
    tasks = list(tasks)
    running = {t for t in tasks if not t.done()}
    while running:
        for t in running:
            t.cancel()
        _, running = await asyncio.wait(running, timeout=RECANCEL_AFTER_S)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" at exit
