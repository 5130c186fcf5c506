"""Server.shutdown and unload with a model that never returns from execute, in process: both
are bounded, the hung instance is left behind and named, and its requests fail."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from seqserve.engine import SERVER_STOPPING, Code, Server
from tests.support.checks import expect_error
from tests.support.models import in_x_config, model_module, write_model

CFG = in_x_config(name="h")
# Blocks in execute until the test releases it (so no thread outlives the test).
HANG_PY = """
import threading
ENTERED = threading.Event()
RELEASE = threading.Event()

class Model:
    def execute(self, batch):
        ENTERED.set()
        RELEASE.wait(60)
        return {"OUT_X": batch.inputs["IN_X"].copy()}
"""
HUNG = "model 'h' instance 'h_0_0' did not return from execute within the exit timeout"


def _x(v: int) -> dict[str, np.ndarray]:
    return {"IN_X": np.array([[v]], np.int32)}


async def test_shutdown_leaves_a_hung_instance_behind(repo, serve) -> None:
    write_model(repo, "h", CFG, HANG_PY)
    s: Server = await serve()
    mod = model_module("h")
    try:
        running = s.submit("h", _x(1))
        assert await asyncio.to_thread(mod.ENTERED.wait, 10)
        queued = s.submit("h", _x(2))  # behind the hung batch: one instance
        assert s.open_work()[:2] == (0, 2)
        t0 = time.monotonic()
        await s.shutdown(timeout_s=0.5)
        assert time.monotonic() - t0 < 5
        assert s.hung_instances == [("h", "h_0_0")]
        await expect_error(running, Code.UNAVAILABLE, HUNG)
        await expect_error(queued, Code.UNAVAILABLE, "model 'h' was unloaded before the request ran")
        await expect_error(s.infer("h", _x(3)), Code.UNAVAILABLE, SERVER_STOPPING)  # not NOT_FOUND
        await expect_error(s.infer("nope", _x(3)), Code.UNAVAILABLE, SERVER_STOPPING)
        assert s.open_work()[:2] == (0, 0)
    finally:
        mod.RELEASE.set()


async def test_unload_of_a_hung_model_is_bounded(repo, serve, caplog) -> None:
    write_model(repo, "h", CFG, HANG_PY)
    s: Server = await serve(exit_timeout_s=0.5)
    mod = model_module("h")
    try:
        running = s.submit("h", _x(1))
        assert await asyncio.to_thread(mod.ENTERED.wait, 10)
        t0 = time.monotonic()
        await s.unload_model("h")
        assert time.monotonic() - t0 < 5
        assert s.hung_instances == [("h", "h_0_0")]
        assert f"{HUNG}; unloading anyway" in caplog.text
        await expect_error(running, Code.UNAVAILABLE, HUNG)
        await expect_error(s.infer("h", _x(3)), Code.NOT_FOUND)  # unloaded, not shutting down
    finally:
        mod.RELEASE.set()
    # the left-behind execute returns: its result goes nowhere, the server is unaffected
    write_model(
        repo,
        "h",
        CFG,
        "class Model:\n    def execute(self, batch):\n        return {'OUT_X': batch.inputs['IN_X'] + 1}\n",
    )
    await s.load_model("h")
    assert (await s.infer("h", _x(4))).outputs["OUT_X"].tolist() == [[5]]
