"""The model repository API (load with and without config=, with files=, unload, index)
through all four tritonclient flavours, on servers with their own tmp repositories, started
with --model-control-mode=explicit (the default mode refuses load and unload: see
test_model_control.py)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.clients import FLAVOURS, Client, expect_error, http_request, new_int_id
from tests.support.models import copy_demo_models, model_source, write_model
from tests.support.process import ServerProcess, serving

EXPLICIT_ALL = ("--model-control-mode", "explicit", "--load-model", "*")

PLUS_ONE_PY = model_source("plus_one")  # Y = X + 1


def _plus_one_config(name: str, max_batch_size: int = 4) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [2]}],
        }
    )


@pytest.fixture(scope="module")
def repo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = copy_demo_models(tmp_path_factory.mktemp("repo") / "models")
    with serving(repo, *EXPLICIT_ALL, log_dir=repo.parent) as srv:
        yield srv


@pytest.fixture(params=FLAVOURS)
async def rclient(request: pytest.FixtureRequest, repo_server: ServerProcess) -> AsyncIterator[Client]:
    cl = Client(request.param, repo_server)
    yield cl
    await cl.close()


async def _index(cl: Client) -> dict[str, dict[str, Any]]:
    index = await cl("get_model_repository_index")
    return {e["name"]: e for e in (index if cl.is_http else index["models"])}


async def _add_sub(cl: Client, batch: int = 1) -> Any:
    a = np.ones((batch, 4), dtype=np.float32)
    return await cl("infer", "add_sub", [cl.input("INPUT0", a), cl.input("INPUT1", a)])


async def test_unload_and_load(rclient: Client) -> None:
    cl = rclient
    assert (await _add_sub(cl)).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    await cl("unload_model", "add_sub")
    assert await cl("is_model_ready", "add_sub") is False
    entry = (await _index(cl))["add_sub"]
    assert entry["state"] == "UNAVAILABLE" and entry.get("version", "") == ""
    await expect_error(_add_sub(cl), cl.code("NOT_FOUND"), "add_sub")
    await expect_error(cl("get_model_metadata", "add_sub"), cl.code("NOT_FOUND"))
    # the other models are untouched
    assert await cl("is_model_ready", "accumulator") is True

    await cl("load_model", "add_sub")  # no config: the repository's config.pbtxt
    assert await cl("is_model_ready", "add_sub") is True
    assert (await _index(cl))["add_sub"]["state"] == "READY"
    assert (await _add_sub(cl)).as_numpy("OUTPUT1").tolist() == [[0.0] * 4]


async def test_load_with_config(rclient: Client, repo_server: ServerProcess) -> None:
    cl = rclient
    cfg = http_request(repo_server, "GET", "/v2/models/add_sub/config").json()
    cfg["max_batch_size"] = 2
    await cl("load_model", "add_sub", config=json.dumps(cfg))
    got = await cl("get_model_config", "add_sub")
    assert int((got if cl.is_http else got["config"])["max_batch_size"]) == 2
    await expect_error(_add_sub(cl, batch=3), cl.code("INVALID_ARG"), "batch-size must be <= 2")
    assert (await _add_sub(cl, batch=2)).as_numpy("OUTPUT0").shape == (2, 4)
    # a reload without config goes back to config.pbtxt
    await cl("load_model", "add_sub")
    got = await cl("get_model_config", "add_sub")
    assert int((got if cl.is_http else got["config"])["max_batch_size"]) == 8


async def test_load_new_model_with_files(rclient: Client) -> None:
    cl = rclient
    name = f"plus_one_{cl.flavour}"
    assert await cl("is_model_ready", name) is False
    await cl("load_model", name, config=_plus_one_config(name), files={"file:1/model.py": PLUS_ONE_PY.encode()})
    assert await cl("is_model_ready", name) is True
    assert await cl("is_model_ready", name, "1") is True
    assert (await _index(cl))[name]["state"] == "READY"
    meta = await cl("get_model_metadata", name)
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("X", "INT32")]
    x = np.array([[1, 2], [3, 4]], dtype=np.int32)
    result = await cl("infer", name, [cl.input("X", x)])
    assert result.as_numpy("Y").tolist() == [[2, 3], [4, 5]]
    await cl("unload_model", name)
    assert await cl("is_model_ready", name) is False


async def test_load_errors(rclient: Client) -> None:
    cl = rclient
    await expect_error(cl("unload_model", f"never_loaded_{cl.flavour}"), cl.code("INVALID_ARG"), "never_loaded")
    await expect_error(cl("load_model", "no_such_model"), cl.code("INVALID_ARG"), "no_such_model")
    if not cl.is_http:  # over HTTP such names do not reach the route
        for bad_name in ("bad/name", "..", "a\\b"):
            await expect_error(cl("load_model", bad_name), cl.code("INVALID_ARG"), "path traversal characters")
    # files without a config
    await expect_error(
        cl("load_model", "orphan", files={"file:1/model.py": PLUS_ONE_PY.encode()}), cl.code("INVALID_ARG"), "config"
    )
    # a config that does not parse
    await expect_error(cl("load_model", "add_sub", config="{not json"), cl.code("INVALID_ARG"))


async def test_failed_reload_keeps_serving(repo_server: ServerProcess) -> None:
    """Triton (model_management.md): "if the reload fails for any reason the already loaded model
    will be unchanged and remain loaded". A failed reload must not take a working model down."""
    cl = Client("grpc", repo_server)
    try:
        bad = json.dumps({"name": "add_sub", "backend": "no_such_backend", "max_batch_size": 8})
        await expect_error(cl("load_model", "add_sub", config=bad), cl.code("INVALID_ARG"), "no_such_backend")
        ready = await cl("is_model_ready", "add_sub")
        if not ready:  # put it back for the tests that follow before failing
            await cl("load_model", "add_sub")
        assert ready, "a failed reload unloaded the previously loaded model"
        assert (await _add_sub(cl)).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    finally:
        await cl.close()


def test_load_http_raw(repo_server: ServerProcess) -> None:
    """The load body as Triton documents it, sent by hand: base64 file contents, config string."""
    name = "plus_one_raw"
    body = {"parameters": {"config": _plus_one_config(name, 0).replace("[2]", "[-1]"),
                           "file:1/model.py": base64.b64encode(PLUS_ONE_PY.encode()).decode()}}  # fmt: skip
    r = http_request(repo_server, "POST", f"/v2/repository/models/{name}/load", body)
    assert r.status == 200, r.body
    doc = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]}]}
    r = http_request(repo_server, "POST", f"/v2/models/{name}/infer", doc)
    assert r.status == 200 and r.json()["outputs"][0]["data"] == [2, 3, 4]
    for bad, fragment in (
        ({"parameters": {"config": {"name": name}}}, "must be a string"),
        ({"parameters": {"config": "{}", "file:1/model.py": "%%% not base64"}}, "not valid base64"),
        ({"parameters": {"config": "{}", "file:../escape.py": "AAAA"}}, "must stay within model directory"),
    ):
        r = http_request(repo_server, "POST", f"/v2/repository/models/{name}/load", bad)
        assert r.status == 400, (bad, r.body)
        assert fragment in r.error()
    r = http_request(repo_server, "POST", f"/v2/repository/models/{name}/unload",
                     {"parameters": {"unload_dependents": False}})  # fmt: skip
    assert (r.status, r.body) == (200, b"")


async def test_versions_and_new_model_on_disk(custom_repo: Path, launch: Callable[..., ServerProcess]) -> None:
    """A function-scoped server on its own repository: a model added to the directory after
    startup is loaded through the API, then a second version with version_policy all."""
    custom_server = launch(custom_repo, *EXPLICIT_ALL)
    cfg = """
        name: "twice"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
        """
    model_py = 'class Model:\n    def execute(self, b):\n        return {"Y": b.inputs["X"] * %d}\n'
    write_model(custom_repo, "twice", cfg, model_py % 1)
    unversioned_stats: dict[str, list[str]] = {}
    for flavour in FLAVOURS:
        cl = Client(flavour, custom_server)
        try:
            assert await cl("is_model_ready", "identity") is True  # the custom repo's extra model
            if flavour == "http":
                assert await cl("is_model_ready", "twice") is False
                await cl("load_model", "twice")
                # version 2 multiplies by 2; serve both versions
                write_model(custom_repo, "twice", cfg + "version_policy { all { } }\n", model_py % 2, version=2)
                await cl("load_model", "twice")
            meta = await cl("get_model_metadata", "twice")
            assert meta["versions"] == ["1", "2"]
            assert (await cl("get_model_metadata", "twice", "1"))["versions"] == ["1"]
            for v, factor in (("1", 1), ("2", 2), ("", 2)):  # no version: the latest
                assert await cl("is_model_ready", "twice", v) is True
                x = np.array([3, 4], dtype=np.int32)
                res = await cl("infer", "twice", [cl.input("X", x)], model_version=v)
                assert res.as_numpy("Y").tolist() == [3 * factor, 4 * factor]
                resp = res.get_response()
                assert (resp["model_version"] if cl.is_http else resp.model_version) == (v or "2")
            assert await cl("is_model_ready", "twice", "3") is False
            stats = (await cl("get_inference_statistics", "twice"))["model_stats"]
            unversioned_stats[flavour] = sorted(s["version"] for s in stats)
            (one,) = (await cl("get_inference_statistics", "twice", "1"))["model_stats"]
            assert one["version"] == "1" and int(one["inference_count"]) >= 1
            index = await _index(cl)
            assert index["twice"]["state"] == "READY"
            # sequences still work on this server
            sid = new_int_id()
            assert await cl.step("accumulator", sid, 1, sequence_start=True) == 1
            assert await cl.step("accumulator", sid, 1, sequence_end=True) == 2
        finally:
            await cl.close()
    # statistics without a version cover every version of the model (Triton's
    # extension_statistics.md: "if not provided Triton will return statistics for all versions")
    assert unversioned_stats == {f: ["1", "2"] for f in FLAVOURS}


async def test_broken_model_does_not_stop_the_server(custom_repo: Path, launch: Callable[..., ServerProcess]) -> None:
    """Server.start: "A model that fails to load is reported with its reason and does not stop
    the others" (the CLI logs every model's state and reason at startup). The CLI exits on it
    unless --exit-on-error=false (tests/integration/test_startup.py)."""
    write_model(custom_repo, "broken", 'name: "broken"\nbackend: "python"\nmax_batch_size: 0\n',
                "raise RuntimeError('boom')\n")  # fmt: skip
    srv = launch(custom_repo, "--exit-on-error=false", "--strict-readiness=false")
    cl = Client("http", srv)
    try:
        assert await cl("is_model_ready", "accumulator") is True
        assert await cl("is_model_ready", "broken") is False
        entry = (await _index(cl))["broken"]
        assert entry["state"] == "UNAVAILABLE" and "boom" in entry.get("reason", "")
    finally:
        await cl.close()
