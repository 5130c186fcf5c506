"""The log of real `seqserve serve` processes (docs/observability.md, "Logs"): Triton's line
shapes and JSON lines; verbose request lines; no secret at any verbosity and no library at
DEBUG; a failed request logged with its request id, which its client's one-line error
names; the logging extension on HTTP and gRPC; startup failures that end with their one line."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.support.checks import wait_until_sync
from tests.support.clients import acc_input, http_request
from tests.support.models import copy_demo_models, write_model
from tests.support.process import ServerProcess, run_serve, serving

SECRET = "S3cr3tValue"
BEARER = "Bearer tok-9f8e7d6c5b4a"

FAILING_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{ direct {{ }} }}
"""
FAILING_MODEL = '''
"""Fails every batch."""


class Model:
    def execute(self, batch):
        raise ValueError("the model broke\\nsecond line of its message")
'''

#: Triton's default line: I1128 06:52:44.000863 8420 file.py:12] "message"
DEFAULT_LINE = re.compile(r'^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+:\d+\] ".*"$')
#: Triton's ISO8601 line: 2026-11-28T06:52:44Z I 8420 file.py:12] "message"
ISO8601_LINE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ [\w.]+:\d+\] ".*"$')


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_demo_models(tmp_path_factory.mktemp("logging") / "repo", "accumulator")
    write_model(repo, "failing", FAILING_CONFIG.format(name="failing"), FAILING_MODEL)
    return repo


@pytest.fixture(scope="module")
def verbose_server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Verbose to the maximum, JSON lines, restricted APIs keyed by SECRET on both front-ends."""
    with serving(
        repo,
        "--log-verbose",
        "9",
        "--log-format",
        "json",
        "--grpc-restricted-protocol",
        f"model-repository:admin={SECRET}",
        "--http-restricted-api",
        f"model-repository,logging:admin={SECRET}",
        log_dir=tmp_path_factory.mktemp("verbose"),
    ) as srv:
        yield srv


def _json_lines(srv: ServerProcess) -> list[dict[str, object]]:
    return [json.loads(line) for line in srv.log().splitlines() if line.strip()]


@pytest.mark.timeout(180)
def test_no_secret_at_any_verbosity(verbose_server: ServerProcess) -> None:
    srv = verbose_server
    header = {"triton-grpc-protocol-admin": SECRET}
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert client.get_model_repository_index(headers=header).models
        with pytest.raises(Exception):  # noqa: B017 - a wrong key is refused; its value must not be logged either
            client.get_model_repository_index(headers={"triton-grpc-protocol-admin": SECRET + "x"})
    finally:
        client.close()
    assert http_request(srv, "POST", "/v2/repository/index", headers={"admin": SECRET}).status == 200
    assert http_request(srv, "POST", "/v2/repository/index", headers={"Authorization": BEARER}).status == 403
    body = {"inputs": [acc_input(1.0)], "parameters": {"sequence_id": 41, "sequence_start": True}}
    assert (
        http_request(srv, "POST", "/v2/models/accumulator/infer", body, headers={"Authorization": BEARER}).status == 200
    )
    wait_until_sync(lambda: "sequence 41" in srv.log(), "the log shows it")
    log = srv.log()
    assert SECRET not in log and "tok-9f8e7d6c5b4a" not in log
    lines = _json_lines(srv)  # every line is one JSON object
    loggers = {str(d["logger"]) for d in lines}
    assert all(name == "seqserve" or name.startswith("seqserve.") for name in loggers), loggers  # no hpack, h2...


@pytest.mark.timeout(180)
def test_verbose_request_lines(verbose_server: ServerProcess) -> None:
    srv = verbose_server
    for step, flags in enumerate(({"sequence_start": True}, {}, {"sequence_end": True})):
        body = {"id": f"req-{step}", "inputs": [acc_input(1.0)], "parameters": {"sequence_id": 77, **flags}}
        assert http_request(srv, "POST", "/v2/models/accumulator/infer", body).status == 200
    wait_until_sync(lambda: '"req-2"' in srv.log(), "the log shows it")
    requests = [d for d in _json_lines(srv) if d.get("request_id") in ("req-0", "req-1", "req-2")]
    assert [(d["sequence_id"], d["start"], d["end"], d["status"]) for d in requests] == [
        (77, True, False, "OK"),
        (77, False, False, "OK"),
        (77, False, True, "OK"),
    ]
    for d in requests:
        assert d["model"] == "accumulator" and d["version"] == "1" and d["level"] == "VERBOSE"
        assert isinstance(d["slot"], int) and isinstance(d["batch_size"], int) and isinstance(d["time_us"], int)
    assert any("batch of" in str(d["message"]) for d in _json_lines(srv))  # level 2: the batch lines


@pytest.mark.timeout(180)
def test_failed_request_logged_with_its_request_id(verbose_server: ServerProcess) -> None:
    srv = verbose_server
    body = {"inputs": [acc_input(1.0)], "parameters": {"sequence_id": 5150, "sequence_start": True}}
    resp = http_request(srv, "POST", "/v2/models/failing/infer", body)
    assert resp.status == 500
    message = resp.error()
    assert "\n" not in message and "Traceback" not in message and "second line" not in message
    found = re.match(r"model 'failing' failed: ValueError: the model broke \(request id (\w+)\)$", message)
    assert found, message
    rid = found.group(1)
    wait_until_sync(lambda: rid in srv.log(), "the log shows it")
    errors = [d for d in _json_lines(srv) if d.get("request_id") == rid and d["level"] == "ERROR"]
    assert len(errors) == 1, errors
    assert errors[0]["model"] == "failing" and errors[0]["sequence_id"] == 5150
    assert "traceback" not in errors[0]  # only with --log-tracebacks


@pytest.mark.timeout(180)
def test_logging_extension(verbose_server: ServerProcess) -> None:
    srv = verbose_server
    key = {"admin": SECRET}
    assert http_request(srv, "GET", "/v2/logging").status == 403  # restricted as Triton's "logging" group
    got = http_request(srv, "GET", "/v2/logging", headers=key).json()
    assert got == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 9,
        "log_format": "json",
    }
    changed = http_request(srv, "POST", "/v2/logging", {"log_verbose_level": 0}, headers=key)
    assert changed.status == 200 and changed.json()["log_verbose_level"] == 0
    refused = http_request(srv, "POST", "/v2/logging", {"log_file": "/tmp/elsewhere.log"}, headers=key)
    assert refused.status == 400 and "log file location can not be updated" in refused.error()
    assert http_request(srv, "POST", "/v2/logging", {"log_format": "glog"}, headers=key).status == 400
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        settings = client.update_log_settings({"log_verbose_level": 3, "log_info": True}, as_json=True)
        assert settings["settings"]["log_verbose_level"] == {"uint32_param": 3}
        assert client.get_log_settings(as_json=True)["settings"]["log_format"] == {"string_param": "json"}
    finally:
        client.close()
    assert http_request(srv, "GET", "/v2/logging", headers=key).json()["log_verbose_level"] == 3
    meta = http_request(srv, "GET", "/v2").json()
    assert "logging" in meta["extensions"]


@pytest.mark.timeout(180)
def test_triton_line_shapes_and_tracebacks(repo: Path, launch: Callable[..., ServerProcess]) -> None:
    srv = launch(repo, "--log-format", "ISO8601", "--log-tracebacks")
    body = {"inputs": [acc_input(1.0)], "parameters": {"sequence_id": 3, "sequence_start": True}}
    assert http_request(srv, "POST", "/v2/models/failing/infer", body).status == 500
    wait_until_sync(lambda: "Traceback" in srv.log(), "the log shows it")
    lines = srv.log().splitlines()
    entries = [line for line in lines if not line.startswith((" ", "Traceback", "ValueError", "second line"))]
    assert entries and all(ISO8601_LINE.match(line) for line in entries), entries
    assert any(" E " in line and "model 'failing'" in line for line in entries)


@pytest.mark.timeout(180)
def test_default_line_shape_and_log_file(repo: Path, launch: Callable[..., ServerProcess], tmp_path: Path) -> None:
    log_file = tmp_path / "seqserve.log"
    srv = launch(repo, "--log-file", str(log_file))
    assert http_request(srv, "GET", "/v2/health/ready").status == 200
    wait_until_sync(lambda: log_file.exists() and "ready" in log_file.read_text(), "the log shows it")
    lines = log_file.read_text().splitlines()
    assert lines and all(DEFAULT_LINE.match(line) for line in lines), lines
    assert srv.log().strip() == ""  # nothing on standard error


@pytest.fixture
def busy_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


@pytest.mark.timeout(120)
def test_startup_failures_end_with_their_line(repo: Path, busy_port: int, tmp_path: Path) -> None:
    proc = run_serve("--host", "127.0.0.1", "--model-repository", str(repo), "--http-port", str(busy_port))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "exit timeout" not in out and "still running" not in out, out
    assert "address already in use" in out.strip().splitlines()[-1], out
    broken = tmp_path / "broken"
    write_model(broken, "broken", FAILING_CONFIG.format(name="broken"), "raise RuntimeError('no load')\n")
    proc = run_serve("--host", "127.0.0.1", "--model-repository", str(broken))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "exit timeout" not in out and "still running" not in out, out
    assert "failed to load all models (broken)" in out.strip().splitlines()[-1], out
