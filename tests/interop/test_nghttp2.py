"""nghttp2 (the HTTP/2 library of curl, Apache httpd and many proxies) against the builtin gRPC
server: h2load's load generator and nghttp's client, with nghttp2's default settings and with a
header table size of 0 (SETTINGS_HEADER_TABLE_SIZE below 4096 obliges the server to start its
next header block with a dynamic table size update, RFC 7541 §4.2; issue 25, row 1)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import grpc
import pytest

from seqserve._proto import grpc_service_pb2 as pb
from tests.support.interop import GRPC_HEADERS, add_sub_request, grpc_frame, method_path
from tests.support.process import ServerProcess
from tests.support.tools import require_programs

REQUESTS = 4000
CONNECTIONS = 4
STREAMS_PER_CONNECTION = 10
RUN_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def _nghttp2() -> None:
    require_programs("h2load", "nghttp", install="apt-get install nghttp2-client")


def header_flags() -> list[str]:
    return [arg for header in GRPC_HEADERS for arg in ("-H", header)]


def request_message(method: str) -> bytes:
    message = add_sub_request([1, 2, 3, 4], [1, 1, 1, 1]) if method == "ModelInfer" else pb.ServerLiveRequest()
    return message.SerializeToString()


def request_body(tmp_path: Path, method: str) -> Path:
    """A framed request of `method` in a file (h2load and nghttp send a file as the body)."""
    path = tmp_path / f"{method}.bin"
    path.write_bytes(grpc_frame(request_message(method)))
    return path


def framed_reply_bytes(interop: ServerProcess, method: str) -> int:
    """The size of a framed reply of `method` to `request_message(method)`, as grpcio receives it:
    h2load counts the DATA bytes of all replies, so each call must have brought exactly this."""
    with grpc.insecure_channel(interop.grpc_url) as channel:
        reply = channel.unary_unary(method_path(method))(request_message(method), timeout=30)
    return 5 + len(reply)


def h2load_summary(output: str) -> dict[str, int]:
    """h2load's request counts: 'requests: 4000 total, 4000 started, 4000 done, 4000 succeeded,
    0 failed, 0 errored, 0 timeout' and 'status codes: 4000 2xx, ...'."""
    counts = re.search(r"^requests: (.*)$", output, re.M)
    codes = re.search(r"^status codes: (.*)$", output, re.M)
    assert counts and codes, f"no summary in h2load's output:\n{output}"
    out = {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", counts.group(1))}
    out.update({name: int(n) for n, name in re.findall(r"(\d+) (\dxx)", codes.group(1))})
    data = re.search(r"^traffic: .*\((\d+)\) data$", output, re.M)
    assert data, f"no traffic line in h2load's output:\n{output}"
    out["data_bytes"] = int(data.group(1))
    return out


@pytest.mark.parametrize("method", ["ModelInfer", "ServerLive"])
@pytest.mark.parametrize(
    "table_size",
    [
        None,
        pytest.param(0, marks=pytest.mark.xfail(strict=True, reason="fixed on s25h2: row 1")),
    ],
    ids=["default-table", "table-size-0"],
)
def test_h2load_every_request_succeeds(
    interop: ServerProcess, tmp_path: Path, method: str, table_size: int | None
) -> None:
    cmd = [
        "h2load",
        f"-n{REQUESTS}",
        f"-c{CONNECTIONS}",
        f"-m{STREAMS_PER_CONNECTION}",
        "-d",
        str(request_body(tmp_path, method)),
        *header_flags(),
        *([f"--header-table-size={table_size}"] if table_size is not None else []),
        f"http://{interop.grpc_url}{method_path(method)}",
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    summary = h2load_summary(run.stdout)
    report = f"{' '.join(cmd)}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    assert summary["total"] == REQUESTS, report
    assert summary["succeeded"] == REQUESTS, report
    assert summary["failed"] == summary["errored"] == summary["timeout"] == 0, report
    assert summary["2xx"] == REQUESTS, report
    # a gRPC error is a 200 too, but without a message: every call brought its reply message
    assert summary["data_bytes"] == REQUESTS * framed_reply_bytes(interop, method), report
    assert interop.alive(), interop.log()


# Methods whose request decodes from add_sub's ModelInferRequest (model_name and model_version
# are fields 1 and 2 of each, the other fields are unknown to them and skipped): nghttp sends one
# body to every URL and fetches a URL once, so several calls on a connection need several methods.
SAME_BODY_METHODS = ("ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig", "ServerLive", "ServerMetadata")


def nghttp(interop: ServerProcess, body: Path, *flags: str) -> str:
    """nghttp's verbose trace of a call of each of SAME_BODY_METHODS, all on one connection."""
    urls = [f"http://{interop.grpc_url}{method_path(method)}" for method in SAME_BODY_METHODS]
    cmd = ["nghttp", "-v", "-n", "-d", str(body), *header_flags(), *flags, *urls]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    return f"$ {' '.join(cmd)}\n{run.stdout}{run.stderr}"


@pytest.mark.parametrize(
    "flags",
    [
        (),
        pytest.param(("-c", "0"), marks=pytest.mark.xfail(strict=True, reason="fixed on s25h2: row 1")),
        pytest.param(("-c", "512"), marks=pytest.mark.xfail(strict=True, reason="fixed on s25h2: row 1")),
    ],
    ids=["default-table", "table-size-0", "table-size-512"],
)
def test_nghttp_calls_end_with_grpc_status_ok(interop: ServerProcess, tmp_path: Path, flags: tuple[str, ...]) -> None:
    """Several calls on one connection (so that later header blocks lean on the dynamic table):
    each gets :status 200 and the trailer grpc-status 0, and the server never sends GOAWAY."""
    calls = len(SAME_BODY_METHODS)
    trace = nghttp(interop, request_body(tmp_path, "ModelInfer"), *flags)
    assert len(re.findall(r"recv \(stream_id=\d+\) :status: 200$", trace, re.M)) == calls, trace
    assert len(re.findall(r"recv \(stream_id=\d+\) grpc-status: 0$", trace, re.M)) == calls, trace
    assert "recv GOAWAY" not in trace, trace
    assert not re.search(r"error_code=(?!NO_ERROR)", trace), trace
    assert "Some requests were not processed" not in trace, trace
