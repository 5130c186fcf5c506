"""The sequence API over HTTP: list, show and end live and backlogged sequences, uint64 and
string ids (digits as a string with ?id_type=string, any string percent-encoded), versioned
paths, errors; ending runs the final END step of a TIMEOUT_COMPLETE model, cancels a
backlogged sequence's requests, and its next request gets the START error (sequence_id) or
410 (session)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.clients import RawResponse, acc_input, http_request, new_int_id, new_str_id, raw_output
from tests.support.models import copy_demo_models, write_model
from tests.support.process import ServerProcess, serving

START_MSG = "must specify the START flag on the first request of the sequence"
INFER = "/v2/models/accumulator/infer"

# Records END steps in a file next to its config: the final step of TIMEOUT_COMPLETE shows there.
FINAL_MODEL = """
import numpy as np

class Model:
    def initialize(self, ctx):
        self.log = ctx.model.model_dir / "ends.txt"

    def execute(self, batch):
        x = batch.inputs["INPUT"]
        for row in range(batch.size):
            if batch.ready[row] and batch.end[row]:
                with open(self.log, "a") as f:
                    f.write(f"{batch.corrid[row]} {float(x[row, 0])}\\n")
        return {"OUTPUT": x.copy()}
"""
FINAL_CONFIG = """
name: "final"
backend: "python"
max_batch_size: 1
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  timeout_action: TIMEOUT_COMPLETE
  control_input [
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Any:

    repo = tmp_path_factory.mktemp("seq-api-repo")
    copy_demo_models(repo, "accumulator", "add_sub")
    write_model(repo, "final", FINAL_CONFIG, FINAL_MODEL)
    with serving(repo, log_dir=repo) as srv:
        yield srv


def step(srv: ServerProcess, sid: int | str, value: float, **params: Any) -> RawResponse:
    doc = {"inputs": [acc_input(value)], "parameters": {"sequence_id": sid, **params}}
    return http_request(srv, "POST", INFER, doc)


def seqs(srv: ServerProcess, path: str, method: str = "GET") -> RawResponse:
    return http_request(srv, method, "/v2/models/" + path)


def test_list_and_show(api_server: ServerProcess) -> None:
    a, b, c, d = new_int_id(), new_str_id(), str(new_int_id()), "a/b c%"
    assert step(api_server, a, 1.0, sequence_start=True).status == 200
    assert step(api_server, a, 2.0).status == 200
    for sid in (b, c, d):
        assert step(api_server, sid, 5.0, sequence_start=True).status == 200
    r = seqs(api_server, "accumulator/sequences")
    assert r.status == 200, r.body
    doc = r.json()
    assert (doc["model"], doc["version"]) == ("accumulator", "1")
    by_id = {(s["id_type"], s["id"]): s for s in doc["sequences"]}
    assert doc["total"] >= 4
    ages = [s["age_s"] for s in doc["sequences"]]
    assert ages == sorted(ages, reverse=True)  # the oldest first
    sa = by_id[("uint64", a)]
    assert sa["steps"] == 2 and sa["state_bytes"] == 4 and sa["backlogged"] is False
    assert sa["instance"].startswith("accumulator") and isinstance(sa["slot"], int)
    assert sa["session"] is False and sa["queued_requests"] == 0
    assert sa["age_s"] >= sa["idle_s"] >= 0
    assert ("string", c) in by_id and ("uint64", int(c)) not in by_id  # "123" is a string id

    # one sequence: a digit segment is a uint64, unless ?id_type=string
    r = seqs(api_server, f"accumulator/sequences/{a}")
    assert r.status == 200 and r.json()["id"] == a and r.json()["steps"] == 2
    assert seqs(api_server, f"accumulator/sequences/{c}").status == 404
    r = seqs(api_server, f"accumulator/sequences/{c}?id_type=string")
    assert r.status == 200 and r.json()["id"] == c
    r = seqs(api_server, f"accumulator/versions/1/sequences/{quote(d, safe='')}")
    assert r.status == 200 and r.json()["id"] == d
    r = seqs(api_server, f"accumulator/versions/1/sequences/{b}")
    assert r.status == 200 and r.json()["id_type"] == "string"
    # limit
    r = seqs(api_server, "accumulator/versions/1/sequences?limit=1")
    assert r.status == 200 and len(r.json()["sequences"]) == 1 and r.json()["total"] >= 4
    for sid in (a, b, c, d):
        assert step(api_server, sid, 0.0, sequence_end=True).status == 200


@pytest.mark.parametrize(
    ("path", "status", "fragment"),
    [
        ("nope/sequences", 404, "Request for unknown model: 'nope' is not found"),
        ("accumulator/versions/7/sequences", 404, "version 7 is not found"),
        ("add_sub/sequences", 400, "model 'add_sub' is not a sequence model"),
        ("accumulator/sequences?limit=x", 400, "limit must be an integer"),
        ("accumulator/sequences/12?id_type=int", 400, "id_type must be 'uint64' or 'string'"),
        ("accumulator/sequences/abc?id_type=uint64", 400, "'abc' is not a uint64 sequence id"),
        ("accumulator/sequences/0", 400, "is not a uint64 sequence id"),
        ("accumulator/sequences/18446744073709551616", 400, "is not a uint64 sequence id"),
        ("accumulator/sequences/999", 404, "sequence 999 of model 'accumulator' version 1 is not live"),
    ],
)
def test_errors(api_server: ServerProcess, path: str, status: int, fragment: str) -> None:
    r = seqs(api_server, path)
    assert r.status == status, r.body
    assert fragment in r.error()


def test_end(api_server: ServerProcess) -> None:
    sid = new_int_id()
    assert step(api_server, sid, 4.0, sequence_start=True).status == 200
    r = seqs(api_server, f"accumulator/sequences/{sid}", "DELETE")
    assert r.status == 200 and r.json()["ended"]["id"] == sid
    r = step(api_server, sid, 1.0)
    assert r.status == 400 and START_MSG in r.error()
    # a string id (the one a session header names on this model)
    sid = new_str_id()
    assert step(api_server, sid, 4.0, sequence_start=True).status == 200
    r = seqs(api_server, f"accumulator/sequences/{sid}", "DELETE")
    assert r.status == 200, r.body
    doc = r.json()
    assert doc["ended"]["id"] == sid and doc["ended"]["steps"] == 1
    assert (doc["final_step"], doc["cancelled_requests"]) == (False, 0)
    assert seqs(api_server, f"accumulator/sequences/{sid}").status == 404
    # Triton's rule for sequence_id requests: the next one needs START...
    r = step(api_server, sid, 1.0)
    assert r.status == 400 and START_MSG in r.error()
    # ... and a session request for that id is told why
    r = http_request(api_server, "POST", INFER, {"inputs": [acc_input()]}, {"Inference-Session-Id": sid})
    assert r.status == 410
    assert r.error() == f"session '{sid}' was ended through the sequence API; start a new session with a new id"
    r = seqs(api_server, f"accumulator/sequences/{sid}", "DELETE")
    assert r.status == 404 and "was ended through the sequence API" in r.error()
    # START again: a fresh sequence
    r = step(api_server, sid, 2.0, sequence_start=True, sequence_end=True)
    assert r.status == 200 and raw_output(r) == [2.0]


def test_end_runs_the_final_step(api_server: ServerProcess) -> None:
    ends = api_server.repo / "final" / "ends.txt"
    sid = new_str_id()
    doc = {"inputs": [acc_input(3.0)], "parameters": {"sequence_id": sid, "sequence_start": True}}
    assert http_request(api_server, "POST", "/v2/models/final/infer", doc).status == 200
    r = seqs(api_server, f"final/sequences/{sid}", "DELETE")
    assert r.status == 200 and r.json()["final_step"] is True
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (ends.exists() and sid in ends.read_text()):
        time.sleep(0.05)
    # one END step, CORRID set, zero-filled input (as at idle expiry)
    assert f"b'{sid}' 0.0" in ends.read_text() or f"{sid} 0.0" in ends.read_text()
    # the slot is free again
    r = seqs(api_server, "final/sequences")
    assert r.json()["total"] == 0


def test_end_of_a_backlogged_sequence(api_server: ServerProcess) -> None:
    """`final` has one slot: a second sequence waits in the backlog; ending it cancels its
    waiting request."""
    holder, waiting = new_str_id(), new_str_id()
    path = "/v2/models/final/infer"

    def infer(sid: str, **params: Any) -> RawResponse:
        doc = {"inputs": [acc_input(1.0)], "parameters": {"sequence_id": sid, **params}}
        return http_request(api_server, "POST", path, doc)

    assert infer(holder, sequence_start=True).status == 200
    got: list[RawResponse] = []
    t = threading.Thread(target=lambda: got.append(infer(waiting, sequence_start=True)))
    t.start()
    try:
        deadline = time.monotonic() + 10
        info: dict[str, Any] = {}
        while time.monotonic() < deadline:
            r = seqs(api_server, f"final/sequences/{waiting}")
            if r.status == 200:
                info = r.json()
                break
            time.sleep(0.05)
        assert info["backlogged"] is True and info["slot"] is None and info["instance"] is None
        assert info["queued_requests"] == 1
        r = seqs(api_server, f"final/sequences/{waiting}", "DELETE")
        assert r.status == 200, r.body
        assert (r.json()["final_step"], r.json()["cancelled_requests"]) == (False, 1)
    finally:
        t.join(10)
    (answer,) = got
    assert answer.status == 400
    assert answer.error() == f"sequence {waiting} was ended through the sequence API before it got a slot"
    assert infer(holder, sequence_end=True).status == 200


def test_version_path_and_live_model(launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """Versioned paths address that version's sequences only."""
    import shutil

    repo = tmp_path / "repo"
    copy_demo_models(repo, "accumulator")
    shutil.copytree(repo / "accumulator" / "1", repo / "accumulator" / "2")
    cfg = repo / "accumulator" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "\nversion_policy { all { } }\n")
    srv = launch(repo)
    sid = new_int_id()
    doc = {"inputs": [acc_input()], "parameters": {"sequence_id": sid, "sequence_start": True}}
    assert http_request(srv, "POST", "/v2/models/accumulator/versions/1/infer", doc).status == 200
    assert seqs(srv, f"accumulator/versions/1/sequences/{sid}").status == 200
    assert seqs(srv, f"accumulator/versions/2/sequences/{sid}").status == 404
    assert seqs(srv, "accumulator/sequences").json()["version"] == "2"  # no version: the latest
