"""Several model repositories served as one (Triton's repeated --model-repository), and strict
readiness, through the in-process Server."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, Server
from tests.support.models import copy_model

PY = """
class Model:
    def execute(self, batch):
        return {{"Y": batch.inputs["X"] + {add}}}
"""
DUPLICATE = "model appears in two or more repositories"


def model(repo, name, add=1):
    """tests/models/plus_one as `name`, adding `add`."""
    copy_model(repo, "plus_one", name, model_py=PY.format(add=add))


async def infer(s: Server, name: str) -> int:
    r = await s.infer(name, {"X": np.array([1], np.int32)})
    return int(r.outputs["Y"][0])


async def test_models_of_every_repository(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    model(a, "one", 1)
    model(b, "two", 2)
    s = Server([a, b])
    await s.start()
    try:
        assert (await infer(s, "one"), await infer(s, "two")) == (2, 3)
        assert [(e["name"], e["state"]) for e in s.repository_index()] == [("one", "READY"), ("two", "READY")]
        assert s.is_ready() and s.failed_models() == {}
    finally:
        await s.shutdown(timeout_s=0)


async def test_a_name_in_two_repositories_loads_from_neither(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    model(a, "one")
    model(a, "twice", 1)
    model(b, "twice", 2)
    s = Server([a, b])
    await s.start()
    try:
        index = {e["name"]: e for e in s.repository_index()}
        assert (index["twice"]["state"], index["twice"]["reason"]) == ("UNAVAILABLE", DUPLICATE)
        assert s.failed_models() == {"twice": DUPLICATE}
        assert not s.is_ready()  # strict readiness (the default)
        with pytest.raises(InferenceError) as ei:
            await s.load_model("twice")
        assert ei.value.code == Code.INVALID_ARG
        assert str(ei.value).startswith("failed to poll model 'twice': not unique across all model repositories")
        # once one of the two folders goes, the name loads
        shutil.rmtree(b / "twice")
        await s.load_model("twice")
        assert await infer(s, "twice") == 2
        assert s.is_ready()
    finally:
        await s.shutdown(timeout_s=0)


async def test_poll_mode_sees_a_duplicate_resolved(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    model(a, "twice", 1)
    model(b, "twice", 5)
    s = Server([a, b], model_control="poll", repository_poll_secs=0)
    await s.start()
    try:
        assert s.failed_models() == {"twice": DUPLICATE}
        shutil.rmtree(a / "twice")
        await s.poll_repository()
        assert await infer(s, "twice") == 6
        assert s.failed_models() == {}
    finally:
        await s.shutdown(timeout_s=0)


async def test_strict_readiness(tmp_path):
    repo = tmp_path / "models"
    model(repo, "good")
    copy_model(repo, "plus_one", "broken", model_py="raise RuntimeError('no')\n")
    strict, lax = Server(repo), Server(repo, strict_readiness=False)
    for s in (strict, lax):
        await s.start()
    try:
        assert strict.failed_models().keys() == {"broken"}
        assert not strict.is_ready() and strict.is_live()
        assert lax.is_ready()
        # fixed and loaded: ready; unloaded models do not count
        model(repo, "broken")
        await strict.load_model("broken")
        assert strict.is_ready()
        await strict.unload_model("broken")
        assert strict.is_ready() and strict.failed_models() == {}
    finally:
        for s in (strict, lax):
            await s.shutdown(timeout_s=0)


def test_no_repository_is_an_error():
    with pytest.raises(ValueError):
        Server([])
