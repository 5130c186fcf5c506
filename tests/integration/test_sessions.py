"""Sessions as the users' brief writes them: brief config B served with its Triton-style Python
model, and the brief's two curl requests (totals 55, then 120). A session id the server does
not know starts a session; Inference-Session-End (or DELETE) ends it; a session that ended or
expired is refused (410 / gRPC NOT_FOUND) instead of silently starting over; sequence_id keeps
Triton's START rule; the tombstone flags; gRPC unary metadata."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.clients import RawResponse, http_request, new_str_id
from tests.support.models import copy_demo_models, write_model
from tests.support.paths import BRIEF
from tests.support.process import ServerProcess, serving

BRIEF_B = BRIEF / "rnn_from_brief_b"
INFER = "/v2/models/rnn_model/versions/1/infer"
START_MSG = "must specify the START flag on the first request of the sequence"
NEW_ID = "; start a new session with a new id"


def brief_repo(repo: Path, idle_us: int | None = None) -> Path:
    """Brief B's config as given (platform swapped for the python backend; its inputs and
    outputs added), with the brief's model."""
    text = (BRIEF_B / "config.pbtxt").read_text()
    text, n = re.subn(r'^platform: "[^"]*".*$', 'backend: "python"', text, flags=re.M)
    assert n == 1
    text += (BRIEF_B / "brief_io.pbtxt").read_text()
    if idle_us is not None:  # brief B's sessions idle out after 300 s; tests need less
        text += f"sequence_batching {{ max_sequence_idle_microseconds: {idle_us} }}\n"
    write_model(repo, "rnn_model", text, (BRIEF_B / "brief_model.py").read_text())
    return repo


@pytest.fixture(scope="module")
def brief_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = brief_repo(tmp_path_factory.mktemp("brief-b"))
    copy_demo_models(repo, "accumulator_corrid")
    with serving(repo, log_dir=repo) as srv:
        yield srv


def brief_request(srv: ServerProcess, session: str, data: list[int], **headers: str) -> RawResponse:
    """The brief's curl: `curl -X POST .../infer -H "Inference-Session-Id: <session>" -d '{...}'`
    (curl sends Content-Type: application/x-www-form-urlencoded)."""
    doc = {"inputs": [{"name": "sequence", "shape": [1, len(data)], "datatype": "INT32", "data": data}]}
    hdr = {"Inference-Session-Id": session, "Content-Type": "application/x-www-form-urlencoded", **headers}
    return http_request(srv, "POST", INFER, doc, hdr)


def total(r: RawResponse) -> int:
    assert r.status == 200, r.body
    (out,) = r.json()["outputs"]
    assert out["name"] == "total"
    return int(out["data"][0])


def test_the_briefs_two_requests(brief_server: ServerProcess) -> None:
    r = brief_request(brief_server, "session_abc", list(range(1, 11)))
    assert total(r) == 55
    assert r.headers["inference-session-id"] == "session_abc"
    assert total(brief_request(brief_server, "session_abc", list(range(11, 16)))) == 120
    # other sessions are their own
    assert total(brief_request(brief_server, "session_xyz", [7])) == 7
    assert total(brief_request(brief_server, "session_abc", [1])) == 121
    r = http_request(brief_server, "GET", "/v2/models/rnn_model/sequences/session_abc")
    assert r.status == 200 and r.json()["session"] is True and r.json()["steps"] == 3
    # the session ends with the header; its next request is refused, not started afresh
    assert total(brief_request(brief_server, "session_abc", [4], **{"Inference-Session-End": "true"})) == 125
    r = brief_request(brief_server, "session_abc", [1])
    assert r.status == 410
    assert r.error() == "session 'session_abc' was ended by its END request" + NEW_ID
    # the sequence API ends a session too
    assert http_request(brief_server, "DELETE", "/v2/models/rnn_model/sequences/session_xyz").status == 200
    r = brief_request(brief_server, "session_xyz", [1])
    assert r.status == 410 and r.error() == "session 'session_xyz' was ended through the sequence API" + NEW_ID


def test_sequence_end_parameter_and_explicit_start(brief_server: ServerProcess) -> None:
    sid = new_str_id()
    assert total(brief_request(brief_server, sid, [2, 3])) == 5
    # sequence_end in the body ends a session as well
    doc = {
        "inputs": [{"name": "sequence", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "parameters": {"sequence_end": True},
    }
    r = http_request(brief_server, "POST", INFER, doc, {"Inference-Session-Id": sid})
    assert total(r) == 6
    assert brief_request(brief_server, sid, [1]).status == 410
    # an explicit START begins the id afresh
    doc["parameters"] = {"sequence_start": True}
    assert total(http_request(brief_server, "POST", INFER, doc, {"Inference-Session-Id": sid})) == 1
    assert total(brief_request(brief_server, sid, [1])) == 2


def test_sequence_id_keeps_tritons_start_rule(brief_server: ServerProcess) -> None:
    sid = new_str_id()
    doc = {
        "inputs": [{"name": "sequence", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}],
        "parameters": {"sequence_id": sid},
    }
    r = http_request(brief_server, "POST", INFER, doc)
    assert r.status == 400 and START_MSG in r.error()
    # with the session header too: the parameter names the sequence, the header is ignored
    r = http_request(brief_server, "POST", INFER, doc, {"Inference-Session-Id": sid})
    assert r.status == 400 and START_MSG in r.error()
    # tritonclient, which always sends sequence_start/sequence_end with a sequence id
    cl = httpclient.InferenceServerClient(brief_server.http_url)
    try:
        inp = httpclient.InferInput("sequence", [1, 3], "INT32")
        inp.set_data_from_numpy(np.array([[1, 2, 3]], np.int32))
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            cl.infer("rnn_model", [inp], sequence_id=sid)
        res = cl.infer("rnn_model", [inp], sequence_id=sid, sequence_start=True)
        assert int(res.as_numpy("total")[0, 0]) == 6
        # the header names the same sequence: a string id
        res = cl.infer("rnn_model", [inp], headers={"Inference-Session-Id": sid})
        assert int(res.as_numpy("total")[0, 0]) == 12
        res = cl.infer("rnn_model", [inp], sequence_id=sid, sequence_end=True)
        assert int(res.as_numpy("total")[0, 0]) == 18
    finally:
        cl.close()


def test_bad_session_headers(brief_server: ServerProcess) -> None:
    r = brief_request(brief_server, new_str_id(), [1], **{"Inference-Session-End": "maybe"})
    assert r.status == 400 and "Inference-Session-End must be 'true' or 'false'" in r.error()
    doc = {"inputs": [{"name": "sequence", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
    r = http_request(brief_server, "POST", INFER, doc, {"Inference-Session-End": "true"})
    assert r.status == 400 and "Inference-Session-End needs an Inference-Session-Id" in r.error()


def test_integer_corrid_session(brief_server: ServerProcess) -> None:
    """On a model whose CORRID is an integer, a decimal session id is the uint64 id."""
    path = "/v2/models/accumulator_corrid/infer"
    doc = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [2.0]}]}
    hdr = {"Inference-Session-Id": "424242"}
    r = http_request(brief_server, "POST", path, doc, hdr)
    assert r.status == 200 and r.json()["outputs"][0]["data"] == [2.0]
    r = http_request(brief_server, "POST", path, {**doc, "parameters": {"sequence_id": 424242, "sequence_end": True}})
    assert r.status == 200 and r.json()["outputs"][0]["data"] == [4.0]
    r = http_request(brief_server, "POST", path, doc, hdr)
    assert r.status == 410 and r.error() == "session '424242' was ended by its END request" + NEW_ID


def test_expired_session_is_refused(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    srv = launch(brief_repo(tmp_path / "repo", idle_us=300_000))
    assert total(brief_request(srv, "s-idle", [1, 2])) == 3
    deadline = time.monotonic() + 10
    while http_request(srv, "GET", "/v2/models/rnn_model/sequences/s-idle").status == 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = brief_request(srv, "s-idle", [1])
    assert r.status == 410
    m = re.fullmatch(r"session 's-idle' expired after ([0-9.]+) s idle; start a new session with a new id", r.error())
    assert m is not None, r.error()
    assert 0.3 <= float(m.group(1)) < 5
    # DESCRIBE (brief B's stateful_model_policy) logged the expiry
    assert re.search(r"sequence_id\W+s-idle", srv.log())  # escaped as Triton's log lines escape messages
    # over gRPC: NOT_FOUND with the same words
    cl = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            cl.infer("rnn_model", [_grpc_seq([1])], headers={"inference-session-id": "s-idle"})
        assert e.value.status() == "StatusCode.NOT_FOUND"
        assert "session 's-idle' expired after" in (e.value.message() or "")
    finally:
        cl.close()


def _grpc_seq(data: list[int]) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("sequence", [1, len(data)], "INT32")
    inp.set_data_from_numpy(np.array([data], np.int32))
    return inp


def test_grpc_session_metadata(brief_server: ServerProcess) -> None:
    cl = grpcclient.InferenceServerClient(brief_server.grpc_url)
    sid = new_str_id()
    md = {"inference-session-id": sid}
    try:

        def infer(data: list[int], **headers: str) -> Any:
            res = cl.infer("rnn_model", [_grpc_seq(data)], headers={**md, **headers})
            return int(res.as_numpy("total")[0, 0])

        assert infer(list(range(1, 11))) == 55
        assert infer(list(range(11, 16))) == 120
        assert infer([5], **{"inference-session-end": "true"}) == 125
        with pytest.raises(InferenceServerException) as e:
            infer([1])
        assert e.value.status() == "StatusCode.NOT_FOUND"
        assert e.value.message() == f"session '{sid}' was ended by its END request" + NEW_ID
    finally:
        cl.close()


def test_tombstone_flags(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    srv = launch(brief_repo(tmp_path / "repo"), "--session-tombstone-max", "1")
    for sid in ("one", "two"):
        assert total(brief_request(srv, sid, [1], **{"Inference-Session-End": "true"})) == 1
    # one remembered at most: "two" is refused as ended; "one" was dropped by the bound, and is
    # refused too (never started afresh: it may have ended)
    assert brief_request(srv, "two", [5]).status == 410
    dropped = brief_request(srv, "one", [5])
    assert dropped.status == 410 and b"--session-tombstone-max" in dropped.body, dropped.body
    assert total(brief_request(srv, "three", [5])) == 5  # a new id starts

    srv = launch(brief_repo(tmp_path / "repo2"), "--session-tombstone-secs", "0")
    assert total(brief_request(srv, "s", [1], **{"Inference-Session-End": "true"})) == 1
    assert total(brief_request(srv, "s", [2])) == 2  # nothing remembered: a new session
