"""Inline execution of cheap in-process Python models (docs/architecture.md, "Inline execution").

The core runs such a model's batches on the event loop's thread, which already holds the GIL,
instead of waking the instance's executor thread and handing the GIL over (and the replies
back) for every batch. The loop reaches the core through one callback per loop iteration and
model, scheduled after a submit, so requests submitted in the same iteration batch together.
The core decides whether the model runs inline at all: only once its batches have proved
cheap, and not after a few that were not (until they prove cheap again: csrc/inline_policy.h).
"""

from __future__ import annotations

import asyncio

from seqserve.engine._core import Scheduler

#: cheap batches in a row (on the executor) before a model runs inline
PROMOTE_AFTER = 8


def inline_eligible(*, python_backend: bool, process: bool, decoupled: bool, watchdog: bool, max_batch_us: int) -> bool:
    """Only Python models, which hold the GIL through ``execute`` anyway (ONNX Runtime and torch
    release it: they keep their threads), in this process, answering once per request
    (decoupled ones stream through responders), and without an execute timeout (its watchdog
    cannot answer clients while the loop itself is stuck in ``execute``)."""
    return python_backend and not process and not decoupled and not watchdog and max_batch_us > 0


class InlineExecution:
    """The loop side of one model's inline execution."""

    __slots__ = ("_core", "_loop", "_scheduled")

    def __init__(self, core: Scheduler, loop: asyncio.AbstractEventLoop, max_batch_us: int) -> None:
        core.configure_inline(max_batch_us, PROMOTE_AFTER)  # before the core starts
        self._core = core
        self._loop = loop
        self._scheduled = False

    def schedule(self) -> None:
        """After a submit (event loop): at most one pending callback per model. Should it never
        run (the loop stopped), the core's executors take the work after a short wait."""
        if self._scheduled:
            return
        try:
            self._loop.call_soon(self._run)
        except RuntimeError:  # the loop is closed: the executors serve the request
            return
        self._scheduled = True

    def _run(self) -> None:
        self._scheduled = False
        _, more = self._core.run_ready_inline()
        if more:  # it gave the loop back for its other work: the rest after that
            self.schedule()
