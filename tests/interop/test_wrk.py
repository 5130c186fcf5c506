"""wrk (an HTTP/1.1 load generator with its own parser, keep-alive connections) against the
builtin HTTP/1.1 server for a couple of seconds, every reply checked by wrk/check_reply.lua:
status 200 and exactly the body that a single request got first."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.clients import http_request
from tests.support.paths import ROOT
from tests.support.process import ServerProcess
from tests.support.tools import require_programs

SCRIPT = ROOT / "tests" / "interop" / "wrk" / "check_reply.lua"
DURATION = "2s"
THREADS = 2
CONNECTIONS = 8
ADD_SUB = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]},
    ]
}


@pytest.fixture(autouse=True)
def _wrk() -> None:
    require_programs("wrk", install="apt-get install wrk")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v2/models/add_sub/infer", ADD_SUB),
        ("GET", "/v2/models/accumulator", None),
    ],
    ids=["infer", "metadata"],
)
def test_every_reply_under_load_is_right(
    interop: ServerProcess, tmp_path: Path, method: str, path: str, body: dict[str, object] | None
) -> None:
    request_file = tmp_path / "request.json"
    if body is not None:
        request_file.write_bytes(json.dumps(body).encode())
    headers = {"Content-Type": "application/json"} if body is not None else {}
    first = http_request(interop, method, path, body, headers)
    assert first.status == 200, first.body
    expected = tmp_path / "expected.body"
    expected.write_bytes(first.body)

    # wrk's 2 s default reply timeout would count a reply slowed by a busy machine as an error
    cmd = ["wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{DURATION}", "--timeout", "30s", "-s", str(SCRIPT)]
    cmd += [interop.base_url + path, "--", method, str(request_file) if body is not None else "-", str(expected)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    report = f"$ {' '.join(cmd)}\n{run.stdout}\n{run.stderr}"
    assert run.returncode == 0, report
    check = re.search(r"^interop-check: checked=(\d+) wrong=(\d+) errors=(\d+)$", run.stdout, re.M)
    done = re.search(r"^\s*(\d+) requests in", run.stdout, re.M)
    assert check and done, report
    checked, wrong, errors = (int(x) for x in check.groups())
    assert wrong == 0 and errors == 0, report
    assert "Non-2xx" not in run.stdout and "Socket errors" not in run.stdout, report
    assert checked == int(done.group(1)) and checked > 100, report
    assert interop.alive(), interop.log()
