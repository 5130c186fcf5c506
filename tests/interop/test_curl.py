"""curl (libcurl over nghttp2 for HTTP/2, its own HTTP/1.1 code) against both builtin servers:
gRPC calls sent as raw framed bodies with `--http2-prior-knowledge` (the reply's messages and
its grpc-status trailer checked), and KServe JSON requests over HTTP/1.1."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from seqserve._proto import grpc_service_pb2 as pb
from tests.support.clients import new_int_id
from tests.support.interop import (
    GRPC_HEADERS,
    add_sub_request,
    first_output,
    grpc_frame,
    grpc_messages,
    method_path,
    step_request,
)
from tests.support.process import ServerProcess
from tests.support.tools import require_programs

CURL_TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def _curl() -> None:
    require_programs("curl", install="apt-get install curl")


class CurlReply:
    """What curl got: its status line and headers (trailers follow them for HTTP/2), the body."""

    def __init__(self, head: str, body: bytes, http_version: str) -> None:
        self.head = head
        self.body = body
        self.http_version = http_version

    def header(self, name: str) -> list[str]:
        """Every value of `name` among the headers and trailers."""
        return [m.strip() for m in re.findall(rf"^{re.escape(name)}:(.*)$", self.head, re.M | re.I)]

    @property
    def status(self) -> int:
        match = re.match(r"HTTP/[\d.]+ (\d{3})", self.head)
        assert match, self.head
        return int(match.group(1))


def curl(tmp_path: Path, url: str, *flags: str, body: bytes | None = None) -> CurlReply:
    head, out = tmp_path / "head.txt", tmp_path / "body.bin"
    cmd = ["curl", "-sS", "--max-time", str(CURL_TIMEOUT_S), "-D", str(head), "-o", str(out)]
    cmd += ["-w", "%{http_version}", *flags]
    if body is not None:
        request = tmp_path / "request.bin"
        request.write_bytes(body)
        cmd += ["--data-binary", f"@{request}"]
    run = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=CURL_TIMEOUT_S + 10)
    assert run.returncode == 0, f"{' '.join(cmd)} {url}: exit {run.returncode}\n{run.stderr}"
    return CurlReply(head.read_text(), out.read_bytes(), run.stdout.strip())


def grpc_call(interop: ServerProcess, tmp_path: Path, method: str, message: bytes, *extra: str) -> CurlReply:
    flags = ["--http2-prior-knowledge", *(arg for h in GRPC_HEADERS for arg in ("-H", h)), *extra]
    return curl(tmp_path, f"http://{interop.grpc_url}{method_path(method)}", *flags, body=grpc_frame(message))


def test_grpc_unary_call_over_curl(interop: ServerProcess, tmp_path: Path) -> None:
    reply = grpc_call(interop, tmp_path, "ModelInfer", add_sub_request([1, 2, 3, 4], [1, 1, 1, 1]).SerializeToString())
    assert reply.http_version == "2" and reply.status == 200, reply.head
    assert reply.header("content-type") == ["application/grpc"], reply.head
    assert reply.header("grpc-status") == ["0"], reply.head
    (message,) = grpc_messages(reply.body)
    resp = pb.ModelInferResponse.FromString(message)
    assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert first_output(resp) == [2, 3, 4, 5]


def test_grpc_sequence_over_curl(interop: ServerProcess, tmp_path: Path) -> None:
    """A running sum over separate connections: the state lives in the server, not the connection."""
    seq, total = new_int_id(), 0.0
    for i, value in enumerate([1.5, 2.0, 4.0]):
        total += value
        message = step_request(seq, value, start=i == 0, end=i == 2).SerializeToString()
        reply = grpc_call(interop, tmp_path, "ModelInfer", message)
        assert reply.header("grpc-status") == ["0"], reply.head
        (out,) = grpc_messages(reply.body)
        assert first_output(pb.ModelInferResponse.FromString(out)) == [total]


def test_grpc_error_status_over_curl(interop: ServerProcess, tmp_path: Path) -> None:
    """A call the server refuses: a trailers-only reply with grpc-status and grpc-message, no message."""
    reply = grpc_call(interop, tmp_path, "ModelInfer", pb.ModelInferRequest(model_name="nope").SerializeToString())
    assert reply.status == 200 and reply.body == b"", reply.head
    assert reply.header("grpc-status") == ["5"], reply.head  # NOT_FOUND
    assert reply.header("grpc-message"), reply.head


def test_unknown_grpc_encoding_over_curl(interop: ServerProcess, tmp_path: Path) -> None:
    """gRPC's PROTOCOL-HTTP2.md: an encoding the server lacks is UNIMPLEMENTED, and the reply
    says which it accepts (grpc-accept-encoding)."""
    # no body (HEADERS with END_STREAM): the refusal comes from the headers alone, and a reply
    # before the body would end the stream with RST_STREAM NO_ERROR (RFC 9113 §8.1), which
    # Debian's curl 7.88 reports as a failure (exit 92) when it races its own upload
    flags = ["--http2-prior-knowledge", "-X", "POST", *(arg for h in GRPC_HEADERS for arg in ("-H", h))]
    url = f"http://{interop.grpc_url}{method_path('ServerLive')}"
    reply = curl(tmp_path, url, *flags, "-H", "grpc-encoding: snappy")
    assert reply.header("grpc-status") == ["12"], reply.head
    assert reply.header("grpc-accept-encoding"), reply.head


def http1_step(interop: ServerProcess, tmp_path: Path, seq: int, value: float, start: bool, end: bool) -> CurlReply:
    doc = {
        "parameters": {"sequence_id": seq, "sequence_start": start, "sequence_end": end},
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
    }
    url = f"{interop.base_url}/v2/models/accumulator/infer"
    return curl(tmp_path, url, "--http1.1", "-H", "content-type: application/json", body=json.dumps(doc).encode())


def test_http1_sequence_over_curl(interop: ServerProcess, tmp_path: Path) -> None:
    seq, total = new_int_id(), 0.0
    for i, value in enumerate([3.0, 0.5, 1.0, 4.5]):
        total += value
        reply = http1_step(interop, tmp_path, seq, value, i == 0, i == 3)
        assert reply.http_version == "1.1" and reply.status == 200, reply.head
        doc = json.loads(reply.body)
        assert doc["model_name"] == "accumulator"
        assert doc["outputs"] == [{"name": "OUTPUT", "datatype": "FP32", "shape": [1, 1], "data": [total]}]


def test_http1_reply_has_a_date(interop: ServerProcess, tmp_path: Path) -> None:
    """RFC 9110 §6.6.1: an origin server with a clock sends Date."""
    reply = curl(tmp_path, f"{interop.base_url}/v2/health/ready", "--http1.1")
    assert reply.status == 200
    (date,) = reply.header("date")
    assert re.fullmatch(r"\w{3}, \d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2} GMT", date), date


def test_http1_request_without_host_is_refused(interop: ServerProcess, tmp_path: Path) -> None:
    """RFC 9112 §3.2: a request without Host gets 400 (curl drops its Host with `-H 'Host:'`)."""
    reply = curl(tmp_path, f"{interop.base_url}/v2/health/ready", "--http1.1", "-H", "Host:")
    assert reply.status == 400, reply.head
