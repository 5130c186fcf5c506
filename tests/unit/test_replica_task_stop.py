"""The replica machinery's background tasks stop at the shutdown even when a cancellation is
lost on the way (``seqserve.engine.replicas.tasks.stop_tasks``). On Python 3.11 redis-py loses
one now and then: it writes every command under ``asyncio.wait_for``, which returns the
write's result instead of raising when the cancellation arrives with it. A heartbeat that
lost its cancellation so beat on, and the drain waited for it until the exit timeout's
backstop ended the process with status 1 (a CI flake of
tests/integration/test_stream_drain.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from seqserve.engine import Server
from seqserve.engine.replicas.coordinator import ReplicaCoordinator
from seqserve.engine.replicas.store import HandoverHandler
from seqserve.engine.replicas.store.dir_store import DirStore
from seqserve.engine.replicas.tasks import stop_tasks
from tests.support.paths import DEMO_REPO

#: a hang guard, not a measure: each test takes milliseconds
HANG_S = 60.0


async def _ends(call: Coroutine[Any, Any, None]) -> bool:
    """Whether ``call`` returns (within HANG_S), judged without cancelling it: the code under
    test may swallow a cancellation, and then a timeout that cancels would look like a return."""
    task = asyncio.create_task(call)
    done, _ = await asyncio.wait([task], timeout=HANG_S)
    if done:
        task.result()
    return bool(done)


async def _loses_its_first_cancellation(started: asyncio.Event) -> None:
    """A loop whose first cancellation is lost, as in a redis-py write on Python 3.11."""
    lost = False
    started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if lost:
                raise
            lost = True


async def _fails() -> None:
    raise RuntimeError("a failed background write")


async def test_a_task_that_loses_its_cancellation_is_stopped_all_the_same() -> None:
    started = asyncio.Event()
    task = asyncio.create_task(_loses_its_first_cancellation(started))
    failed = asyncio.create_task(_fails())
    await started.wait()
    assert await _ends(stop_tasks([task, failed]))
    assert task.cancelled()
    assert failed.done() and isinstance(failed.exception(), RuntimeError)


async def test_stopping_nothing_or_finished_tasks_returns_at_once() -> None:
    await stop_tasks([])
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    assert await _ends(stop_tasks([done]))


class _HeartbeatLosingACancellation(DirStore):
    """A directory store whose heartbeat, once the store is open, is a slow round trip that
    loses the first cancellation reaching it (returns as if answered)."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path), "A", heartbeat_ttl_s=3.0)
        self.opened = False
        self.beating = asyncio.Event()
        self.lost = 0

    async def open(self, on_handover: HandoverHandler | None = None) -> None:
        await super().open(on_handover)
        self.created_epoch = False  # no wait for other replicas to notice a new store
        self.opened = True

    async def heartbeat(self) -> bool:
        if not self.opened:
            return await super().heartbeat()
        self.beating.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if self.lost:
                raise
            self.lost += 1
        return True


async def test_the_shutdown_ends_although_the_heartbeat_lost_its_cancellation(tmp_path: Path) -> None:
    server = Server(DEMO_REPO)  # not started: its model table and session policy only
    store = _HeartbeatLosingACancellation(tmp_path / "store")
    replicas = ReplicaCoordinator(server.models, server.sessions, store)
    await replicas.start()
    await store.beating.wait()  # the heartbeat task is inside a round trip
    assert await _ends(replicas.finish(time.monotonic() + 5.0)), "the shutdown still waits for the heartbeat"
    assert store.lost == 1  # the first cancellation was lost, and the heartbeat stopped anyway
