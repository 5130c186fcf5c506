"""Shared fixtures: build throw-away model repositories and run an in-process Server."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from seqserve.engine import Code, InferenceError, Server

# A batch-level Python model that records what it saw, for scheduler tests. Each execute
# call appends one dict per batch to the module-level list RECORD, keyed by model name.
RECORDING_MODEL = """
import numpy as np
RECORD = []

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        RECORD.append({
            "instance": self.instance,
            "size": batch.size,
            "inputs": {k: v.copy() for k, v in batch.inputs.items()},
            "controls": {k: v.copy() for k, v in batch.controls.items()},
            "states": {k: v.copy() for k, v in batch.states.items()},
            "start": batch.start.copy(), "end": batch.end.copy(), "ready": batch.ready.copy(),
            "corrid": batch.corrid.copy(),
        })
        out = {}
        for name, value in batch.inputs.items():
            out["OUT_" + name[3:] if name.startswith("IN_") else "OUTPUT"] = value.copy()
        return out
"""


def write_model(
    repo: Path, name: str, config: str, model_py: str = RECORDING_MODEL, version: int = 1
) -> Path:
    """Write <repo>/<name>/config.pbtxt and <repo>/<name>/<version>/model.py."""
    d = repo / name
    (d / str(version)).mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(config))
    (d / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    return d


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "models"
    r.mkdir()
    return r


@pytest.fixture
async def serve(repo: Path) -> AsyncIterator[Callable[..., object]]:
    """`server = await serve()` starts a Server on `repo`; it is shut down after the test."""
    servers: list[Server] = []

    async def start(**kwargs: object) -> Server:
        s = Server(repo, **kwargs)  # type: ignore[arg-type]
        await s.start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        await s.shutdown(timeout_s=0)


def recorded(server: Server, model: str) -> list[dict]:
    """The RECORD list of a loaded recording model (version 1)."""
    import sys

    return sys.modules[f"seqserve_models.{model}.v1"].RECORD  # type: ignore[no-any-return]


async def expect_error(coro: object, code: Code, message: str | None = None) -> InferenceError:
    """Await `coro` and check it fails with `code` (and exactly `message`, when given)."""
    with pytest.raises(InferenceError) as ei:
        await coro  # type: ignore[misc]
    assert ei.value.code == code, repr(ei.value)
    if message is not None:
        assert str(ei.value) == message
    return ei.value
