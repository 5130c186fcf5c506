"""--model-control-mode, --load-model and --repository-poll-secs on real `seqserve serve`
processes, through tritonclient and raw HTTP/gRPC, looked at as an attacker would: by default
no client can load, replace or unload a model, and uploaded code never reaches the disk."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import grpc_service_pb2_grpc as pb_grpc
from tests.support.clients import FLAVOURS, Client, expect_error, http_request
from tests.support.models import model_source, write_model
from tests.support.process import ServerProcess, run_serve

# Triton's message, for mode none and poll alike (core model_repository_manager.cc)
REFUSED = "explicit model load / unload is not allowed if polling is enabled"
NEEDS_EXPLICIT = "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
EXPLICIT = ("--model-control-mode", "explicit")
WAIT_S = 20.0  # a bound, not a pause: the waits below poll until it passes

PLUS_ONE_CFG = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 2 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 2 ] }} ]
"""
PLUS_ONE_PY = model_source("plus_one")  # Y = X + 1


def _plus_one_json(name: str, **extra: Any) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": 4,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [2]}],
            "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [2]}],
            **extra,
        }
    )


def _marker_model(marker: Path) -> bytes:
    """A model.py that leaves a file behind if it is ever imported."""
    return (f"open({str(marker)!r}, 'w').write('ran')\n" + PLUS_ONE_PY).encode()


def _load_body(name: str, model_py: bytes) -> dict[str, Any]:
    b64 = base64.b64encode(model_py).decode()
    return {"parameters": {"config": _plus_one_json(name), "file:1/model.py": b64}}


def _grpc_load(srv: ServerProcess, name: str, model_py: bytes) -> grpc.RpcError | None:
    req = pb.RepositoryModelLoadRequest(model_name=name)
    req.parameters["config"].string_param = _plus_one_json(name)
    req.parameters["file:1/model.py"].bytes_param = model_py
    with grpc.insecure_channel(srv.grpc_url) as ch:
        try:
            pb_grpc.GRPCInferenceServiceStub(ch).RepositoryModelLoad(req, timeout=30)
        except grpc.RpcError as e:
            return e
    return None


def _index(srv: ServerProcess) -> dict[str, dict[str, str]]:
    r = http_request(srv, "POST", "/v2/repository/index")
    assert r.status == 200, r.body
    return {e["name"]: e for e in r.json()}


def _ready(srv: ServerProcess, name: str) -> bool:
    return http_request(srv, "GET", f"/v2/models/{name}/ready").status == 200


def _wait_until(what: str, check: Callable[[], bool], srv: ServerProcess) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S} s\n{srv.log()}")
        time.sleep(0.05)


def _uploads(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("seqserve-uploads-*"))


# ----------------------------------------------------------------- default: none


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_default_mode_refuses_load_and_unload(flavour: str, server: ServerProcess) -> None:
    """The shared server runs with no model control flag: every tritonclient flavour gets
    HTTP 503 / gRPC UNAVAILABLE with Triton's message, and nothing changes."""
    cl = Client(flavour, server)
    try:
        status = cl.code("UNAVAILABLE")
        await expect_error(cl("load_model", "add_sub"), status, REFUSED)
        await expect_error(cl("load_model", "add_sub", config=_plus_one_json("add_sub")), status, REFUSED)
        await expect_error(
            cl("load_model", "pwn", config=_plus_one_json("pwn"), files={"file:1/model.py": PLUS_ONE_PY.encode()}),
            status,
            REFUSED,
        )
        await expect_error(cl("unload_model", "add_sub"), status, REFUSED)
        await expect_error(cl("unload_model", "no_such_model"), status, REFUSED)
        assert await cl("is_model_ready", "add_sub") is True
        assert await cl("is_model_ready", "pwn") is False
        # the index stays readable
        index = await cl("get_model_repository_index")
        names = {e["name"]: e for e in (index if cl.is_http else index["models"])}
        assert names["add_sub"]["state"] == "READY" and "pwn" not in names
    finally:
        await cl.close()


def test_default_mode_never_writes_or_runs_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: Callable[..., ServerProcess]
) -> None:
    """Issue 11's probe, raw on both transports: the upload is refused before it is decoded,
    so its code neither runs nor lands in a temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    marker = tmp_path / "pwned"
    srv = launch(None)
    r = http_request(srv, "POST", "/v2/repository/models/pwn/load", _load_body("pwn", _marker_model(marker)))
    assert (r.status, r.error()) == (503, REFUSED)
    err = _grpc_load(srv, "pwn", _marker_model(marker))
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE and err.details() == REFUSED
    # replacing or removing a served model is refused too
    r = http_request(srv, "POST", "/v2/repository/models/add_sub/load", _load_body("add_sub", _marker_model(marker)))
    assert (r.status, r.error()) == (503, REFUSED)
    r = http_request(srv, "POST", "/v2/repository/models/add_sub/unload", {"parameters": {"unload_dependents": False}})
    assert (r.status, r.error()) == (503, REFUSED)
    assert _ready(srv, "add_sub") and not _ready(srv, "pwn")
    assert not marker.exists()
    assert _uploads(tmp) == []
    assert "pwn" not in _index(srv)


# ------------------------------------------------------------------------- explicit


async def test_explicit_mode_load_model_selects(custom_repo: Path, launch: Callable[..., ServerProcess]) -> None:
    srv = launch(custom_repo, *EXPLICIT, "--load-model", "accumulator", "--load-model", "identity")
    index = _index(srv)
    assert {n for n, e in index.items() if e.get("state") == "READY"} == {"accumulator", "identity"}
    assert index["add_sub"]["state"] == "UNAVAILABLE"
    cl = Client("grpc", srv)
    try:
        await cl("load_model", "add_sub")
        assert await cl("is_model_ready", "add_sub") is True
        await cl("unload_model", "accumulator")
        assert await cl("is_model_ready", "accumulator") is False
    finally:
        await cl.close()


def test_explicit_mode_without_load_model_starts_empty(custom_repo: Path, launch: Callable[..., ServerProcess]) -> None:
    srv = launch(custom_repo, *EXPLICIT)
    index = _index(srv)
    assert {"accumulator", "add_sub", "identity"} <= set(index)
    assert all(e.get("state") != "READY" for e in index.values()), index
    r = http_request(srv, "POST", "/v2/repository/models/add_sub/load", {})
    assert (r.status, r.body) == (200, b"")
    assert _ready(srv, "add_sub")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--load-model", "add_sub"), NEEDS_EXPLICIT),
        (("--model-control-mode", "poll", "--load-model", "add_sub"), NEEDS_EXPLICIT),
        (
            (*EXPLICIT, "--load-model", "*", "--load-model", "add_sub"),
            "Wildcard model name '*' must be the ONLY startup model if specified at all.",
        ),
        (("--model-control-mode", "open"), "invalid choice: 'open'"),
        (("--model-control-mode", "poll", "--repository-poll-secs", "-1"), "not a number of seconds"),
    ],
)
def test_flag_errors(flags: tuple[str, ...], message: str) -> None:
    proc = run_serve("--http-port", "off", *flags)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_upload_folders_are_private_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: Callable[..., ServerProcess]
) -> None:
    """file: uploads go to a 0700 folder of their own; unload, a replacing reload and the
    server's exit remove them; names that could escape are refused before anything is written."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    srv = launch(None, *EXPLICIT)
    r = http_request(srv, "POST", "/v2/repository/models/up/load", _load_body("up", PLUS_ONE_PY.encode()))
    assert r.status == 200, r.body
    (root,) = _uploads(tmp)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    (first,) = root.iterdir()
    assert (first / "up" / "1" / "model.py").read_bytes() == PLUS_ONE_PY.encode()

    assert _grpc_load(srv, "up", PLUS_ONE_PY.encode()) is None  # a reload with new files
    (second,) = root.iterdir()
    assert second != first and not first.exists()

    r = http_request(srv, "POST", "/v2/repository/models/up/unload", {"parameters": {"unload_dependents": False}})
    assert r.status == 200, r.body
    assert list(root.iterdir()) == []

    for bad in ("/tmp/abs.py", "../escape.py", "1/../../escape.py", "1\\..\\..\\escape.py", "", "1//model.py"):
        body = _load_body("up", PLUS_ONE_PY.encode())
        body["parameters"][f"file:{bad}"] = base64.b64encode(b"pwned").decode()
        r = http_request(srv, "POST", "/v2/repository/models/up/load", body)
        assert r.status == 400, (bad, r.body)
        assert r.error().startswith(f"Invalid file parameter 'file:{bad}' must stay within model directory")
    assert list(root.iterdir()) == [] and not (tmp_path / "escape.py").exists() and not Path("/tmp/abs.py").exists()

    assert _grpc_load(srv, "up2", PLUS_ONE_PY.encode()) is None
    assert len(list(root.iterdir())) == 1
    assert srv.stop() == 0
    assert _uploads(tmp) == [], "the upload folder outlived the server"


def test_config_paths_must_stay_inside(tmp_path: Path, custom_repo: Path, launch: Callable[..., ServerProcess]) -> None:
    """default_model_filename naming a file elsewhere on the server's disk: refused with a
    clear error naming the field, from the load API and from the repository alike; the file
    is never imported."""
    marker = tmp_path / "pwned"
    evil = tmp_path / "elsewhere" / "evil.py"
    evil.parent.mkdir()
    evil.write_bytes(_marker_model(marker))
    cfg = PLUS_ONE_CFG.format(name="sneaky", mbs=4) + f'default_model_filename: "{evil}"\n'
    write_model(custom_repo, "sneaky", cfg, PLUS_ONE_PY)
    srv = launch(custom_repo, *EXPLICIT, "--load-model", "*", "--exit-on-error=false", "--strict-readiness=false")
    reason = _index(srv)["sneaky"]["reason"]
    assert "default_model_filename" in reason and "is an absolute path" in reason, reason

    for filename, fragment in ((str(evil), "is an absolute path"), ("../../../elsewhere/evil.py", "contains '..'")):
        body = {"parameters": {"config": _plus_one_json("add_sub", default_model_filename=filename)}}
        r = http_request(srv, "POST", "/v2/repository/models/add_sub/load", body)
        assert r.status == 400, r.body
        assert "default_model_filename" in r.error() and fragment in r.error(), r.error()
    assert not marker.exists()
    assert _ready(srv, "add_sub")  # the failed reloads left it serving


# ----------------------------------------------------------------------------- poll


def test_poll_mode(tmp_path: Path, custom_repo: Path, launch: Callable[..., ServerProcess]) -> None:
    srv = launch(custom_repo, "--model-control-mode", "poll", "--repository-poll-secs", "1")
    # the model control API is refused, with the same message
    r = http_request(srv, "POST", "/v2/repository/models/add_sub/unload", {"parameters": {"unload_dependents": False}})
    assert (r.status, r.error()) == (503, REFUSED)
    err = _grpc_load(srv, "pwn", PLUS_ONE_PY.encode())
    assert err is not None and err.code() == grpc.StatusCode.UNAVAILABLE and err.details() == REFUSED

    # a new model folder, made beside the repository and moved in whole
    staging = tmp_path / "staging"
    write_model(staging, "plus_one", PLUS_ONE_CFG.format(name="plus_one", mbs=4), PLUS_ONE_PY)
    os.rename(staging / "plus_one", custom_repo / "plus_one")
    _wait_until("the new model loads", lambda: _ready(srv, "plus_one"), srv)
    doc = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
    r = http_request(srv, "POST", "/v2/models/plus_one/infer", doc)
    assert r.status == 200 and r.json()["outputs"][0]["data"] == [2, 3]

    # a changed config reloads it
    (custom_repo / "plus_one" / "config.pbtxt").write_text(PLUS_ONE_CFG.format(name="plus_one", mbs=2))

    def reloaded() -> bool:
        r = http_request(srv, "GET", "/v2/models/plus_one/config")
        return r.status == 200 and r.json()["max_batch_size"] == 2

    _wait_until("the changed model reloads", reloaded, srv)

    # a removed folder unloads the model, and it leaves the index
    shutil.rmtree(custom_repo / "identity")
    _wait_until("the removed model unloads", lambda: not _ready(srv, "identity") and "identity" not in _index(srv), srv)
    assert _ready(srv, "add_sub") and _ready(srv, "plus_one")
