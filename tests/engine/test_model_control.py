"""Model control in the engine: the model control API refused unless explicit, the in-process
API always open, upload folders removed, poll mode's scans, loads off the event loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from seqserve.engine import Code, Server
from seqserve.engine.server.model_control import MODEL_CONTROL_DISABLED
from tests.support.checks import expect_error
from tests.support.models import write_model

CFG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

PLUS = """
class Model:
    def execute(self, batch):
        return {{"Y": batch.inputs["X"] + {n}}}
"""


def add_model(repo: Path, name: str, n: int = 1, mbs: int = 4) -> Path:
    return write_model(repo, name, CFG.format(name=name, mbs=mbs), PLUS.format(n=n))


def config_json(name: str, mbs: int = 4) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": mbs,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
        }
    )


async def y(server: Server, name: str) -> int:
    r = await server.infer(name, {"X": np.array([[1]], np.int32)})
    return int(r.outputs["Y"][0, 0])


# ------------------------------------------------------------------- the policy


async def test_default_mode_refuses_the_model_control_api(repo, serve):
    add_model(repo, "a")
    s = await serve()
    assert s.model_control.value == "none"
    await expect_error(s.request_load_model("a"), Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)
    await expect_error(
        s.request_load_model("pwn", config_json=config_json("pwn"), files={"1/model.py": PLUS.format(n=1).encode()}),
        Code.UNAVAILABLE,
        MODEL_CONTROL_DISABLED,
    )
    await expect_error(s.request_unload_model("a"), Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)
    assert await y(s, "a") == 2
    assert "pwn" not in {e["name"] for e in s.repository_index()}
    # the embedding application keeps full control
    await s.unload_model("a")
    assert not s.is_model_ready("a")
    await s.load_model("a")
    assert await y(s, "a") == 2


async def test_poll_mode_refuses_the_model_control_api(repo, serve):
    add_model(repo, "a")
    s = await serve(model_control="poll", repository_poll_secs=0)
    await expect_error(s.request_load_model("a"), Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)
    await expect_error(s.request_unload_model("a"), Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)


async def test_explicit_mode_and_uploads(repo, serve, tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    add_model(repo, "a")
    s = Server(repo, model_control="explicit")
    await s.start([])  # explicit mode with no --load-model: nothing loaded
    try:
        assert not s.is_model_ready("a")
        await s.request_load_model("a")
        assert await y(s, "a") == 2
        files = {"1/model.py": PLUS.format(n=10).encode()}
        await s.request_load_model("up", config_json=config_json("up"), files=files)
        assert await y(s, "up") == 11
        (root,) = (tmp_path / "tmp").glob("seqserve-uploads-*")
        (first,) = root.iterdir()
        # a reload with new files replaces the folder; a failed one keeps the model and its folder
        files20 = {"1/model.py": PLUS.format(n=20).encode()}
        await s.request_load_model("up", config_json=config_json("up"), files=files20)
        assert await y(s, "up") == 21
        (second,) = root.iterdir()
        assert second != first and not first.exists()
        await expect_error(
            s.request_load_model("up", config_json=config_json("up"), files={"1/model.py": b"raise SystemError"}),
            Code.INVALID_ARG,
        )
        assert await y(s, "up") == 21 and list(root.iterdir()) == [second]
        await s.request_unload_model("up")
        assert list(root.iterdir()) == []
        await s.request_load_model("up2", config_json=config_json("up2"), files=files)
    finally:
        await s.shutdown(timeout_s=0)
    assert not root.exists()
    await expect_error(s.request_load_model("a"), Code.UNAVAILABLE, "Server not ready")
    await expect_error(s.load_model("a"), Code.UNAVAILABLE, "Server not ready")


async def test_uploaded_config_cannot_reach_outside(repo, serve, tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\n" + PLUS.format(n=1))
    add_model(repo, "a")
    s = await serve(model_control="explicit")
    for filename, fragment in ((str(evil), "is an absolute path"), ("../../evil.py", "contains '..'")):
        cfg = json.loads(config_json("a")) | {"default_model_filename": filename}
        err = await expect_error(s.request_load_model("a", config_json=json.dumps(cfg)), Code.INVALID_ARG)
        assert "default_model_filename" in err.message and fragment in err.message, err.message
    assert not marker.exists()
    assert await y(s, "a") == 2  # the failed reloads left the model serving


# ---------------------------------------------------------------------------- poll


async def test_poll_repository(repo, serve):
    add_model(repo, "a", n=1)
    s = await serve(model_control="poll", repository_poll_secs=0)
    assert await y(s, "a") == 2
    # python wrote its bytecode cache into a/1 at import: not a change
    assert await s.poll_repository() == {"added": [], "removed": [], "modified": []}

    add_model(repo, "b", n=5)
    assert await s.poll_repository() == {"added": ["b"], "removed": [], "modified": []}
    assert await y(s, "b") == 6

    (repo / "a" / "config.pbtxt").write_text(CFG.format(name="a", mbs=2))
    assert await s.poll_repository() == {"added": [], "removed": [], "modified": ["a"]}
    assert s.model_config("a").max_batch_size == 2

    # a broken change keeps the loaded model serving; fixing it reloads
    (repo / "a" / "config.pbtxt").write_text('name: "a"\nbackend: "no_such_backend"\n')
    assert (await s.poll_repository())["modified"] == ["a"]
    assert await y(s, "a") == 2
    (repo / "a" / "config.pbtxt").write_text(CFG.format(name="a", mbs=3))
    assert (await s.poll_repository())["modified"] == ["a"]
    assert s.model_config("a").max_batch_size == 3

    shutil.rmtree(repo / "b")
    assert await s.poll_repository() == {"added": [], "removed": ["b"], "modified": []}
    assert not s.is_model_ready("b")
    assert "b" not in {e["name"] for e in s.repository_index()}


async def test_poll_retries_a_model_that_failed_once_it_changes(repo, serve):
    d = write_model(repo, "late", CFG.format(name="late", mbs=4), "raise RuntimeError('half written')\n")
    s = await serve(model_control="poll", repository_poll_secs=0)
    assert not s.is_model_ready("late")
    assert await s.poll_repository() == {"added": [], "removed": [], "modified": []}  # not tried again as is
    (d / "1" / "model.py").write_text(PLUS.format(n=3) + "\n")
    assert (await s.poll_repository())["modified"] == ["late"]
    assert await y(s, "late") == 4


async def test_poll_periodically(repo, serve):
    s = await serve(model_control="poll", repository_poll_secs=0.05)
    add_model(repo, "new")
    deadline = time.monotonic() + 10
    while not s.is_model_ready("new"):
        assert time.monotonic() < deadline, "the new model was not picked up"
        await asyncio.sleep(0.02)
    assert await y(s, "new") == 2


def test_poll_start_takes_no_model_list(repo):
    s = Server(repo, model_control="poll")
    with pytest.raises(ValueError, match="takes no model list"):
        asyncio.run(s.start(["a"]))
    with pytest.raises(ValueError, match="repository_poll_secs"):
        Server(repo, repository_poll_secs=-1)


# ---------------------------------------------------------------- off the event loop

# Loads for 2 s: a loop blocked by the load stalls that long, far beyond a loaded machine's hiccups.
SLOW_INIT = """
import time

class Model:
    def initialize(self, ctx):
        time.sleep(2)

    def execute(self, batch):
        return {"Y": batch.inputs["X"] + 1}
"""


async def test_load_runs_off_the_event_loop(repo, serve):
    s = await serve()
    write_model(repo, "slow", CFG.format(name="slow", mbs=4), SLOW_INIT)
    load = asyncio.create_task(s.load_model("slow"))
    gaps = []
    last = time.monotonic()
    while not load.done():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    await load
    assert len(gaps) > 10 and max(gaps) < 1.0, max(gaps)


async def test_a_cancelled_load_still_completes(repo, serve):
    s = await serve()
    write_model(repo, "slow", CFG.format(name="slow", mbs=4), SLOW_INIT)
    load = asyncio.create_task(s.load_model("slow"))
    await asyncio.sleep(0.1)  # well inside the 2 s load
    load.cancel()
    with pytest.raises(asyncio.CancelledError):
        await load
    deadline = time.monotonic() + 10
    while not s.is_model_ready("slow"):  # nothing half loaded: it finishes, and shutdown retires it
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert await y(s, "slow") == 2
