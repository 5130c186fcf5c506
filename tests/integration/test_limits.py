"""Every limit of docs/security.md ("Bounded input") and its flag, on real servers, for both HTTP
servers where the HTTP server enforces it: body size before and after decompression (413),
body and header timeouts (408, closed connections), keep-alive, the connection cap; the gRPC
message limits (RESOURCE_EXHAUSTED), idle connections, undecodable messages (INVALID_ARGUMENT,
an error reply on a stream); Triton's unimplemented HTTP extensions (501); flag checks."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.clients import acc_input, grpc_server_for, http_request, new_int_id
from tests.support.models import IDENTITY_DTYPES, copy_demo_models, copy_model
from tests.support.process import ServerProcess, run_serve, serving, under_workers

HTTP_SERVERS = ["builtin", "hypercorn", "granian"]
SEQ = {"sequence_start": True, "sequence_end": True}
ACC = "/v2/models/accumulator/infer"


def _doc(value: float = 1.0) -> bytes:
    return json.dumps({"inputs": [acc_input(value)], "parameters": {"sequence_id": new_int_id(), **SEQ}}).encode()


def _head(path: str = ACC, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_all(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or `timeout`), and when it closed."""
    sock.settimeout(timeout)
    t0 = time.monotonic()
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except TimeoutError:
        out += b"<still open>"
    return out, time.monotonic() - t0


def _status_and_error(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body.split(b"<still open>")[0])["error"]


@pytest.fixture(scope="module", params=HTTP_SERVERS)
def limited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Small limits on both front-ends; the demo models plus `identity`."""
    if request.param == "granian":
        pytest.importorskip("granian")
    root = tmp_path_factory.mktemp(f"limits-{request.param}")
    repo = copy_demo_models(root / "models")
    copy_model(repo, "identity")
    with serving(
        repo,
        "--http-server", request.param,
        "--grpc-server", grpc_server_for(request.param),
        "--http-max-body-bytes", "4096",
        "--http-body-timeout-secs", "1",
        "--http-header-timeout-secs", "1.5",
        "--grpc-max-receive-message-bytes", "100000",
        "--grpc-max-send-message-bytes", "20000",
        "--grpc-max-connection-idle-secs", "1",
        log_dir=root,
    ) as srv:  # fmt: skip
        assert f"HTTP ({request.param})" in srv.log() and f"gRPC ({grpc_server_for(request.param)})" in srv.log()
        yield srv


# ---------------------------------------------------------------------------- HTTP


def test_body_limit_before_and_after_decompression(limited: ServerProcess) -> None:
    small = _doc()
    r = http_request(limited, "POST", ACC, small)
    assert r.status == 200, r.body
    r = http_request(limited, "POST", ACC, small + b" " * 5000)  # Content-Length says too much
    assert r.status == 413 and "exceeds the server's limit of 4096 bytes" in r.error()
    bomb = gzip.compress(small[:-1] + b" " * 100_000 + b"}")  # ~300 bytes that inflate past 4096
    assert len(bomb) < 4096
    r = http_request(limited, "POST", ACC, bomb, {"Content-Encoding": "gzip"})
    assert r.status == 413 and "decompressed request body" in r.error(), r.body
    liar = bomb[:-4] + (100).to_bytes(4, "little")  # a trailer that understates: inflated up to the limit
    r = http_request(limited, "POST", ACC, liar, {"Content-Encoding": "gzip"})
    assert r.status == 413 and "decompressed request body exceeds" in r.error(), r.body
    r = http_request(limited, "POST", ACC, gzip.compress(small), {"Content-Encoding": "gzip"})
    assert r.status == 200, r.body


def test_stalled_body_gets_408(limited: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", limited.http_port)) as s:
        s.sendall(_head(**{"Content-Length": "1000"}) + b'{"inputs":')
        raw, elapsed = _read_all(s, 10)
    status, error = _status_and_error(raw)
    assert status == 408 and error == "request body timed out: no data arrived for 1 s"
    assert elapsed < 5 and not raw.endswith(b"<still open>"), (elapsed, raw)  # and the connection closes


def test_slow_body_that_keeps_coming_is_read(limited: ServerProcess) -> None:
    """The body deadline is for progress: a body that trickles in faster than it is read."""
    body = _doc()
    with socket.create_connection(("127.0.0.1", limited.http_port)) as s:
        s.sendall(_head(**{"Content-Length": str(len(body)), "Connection": "close"}))
        for i in range(0, len(body), len(body) // 4 + 1):
            time.sleep(0.5)
            s.sendall(body[i : i + len(body) // 4 + 1])
        raw, _ = _read_all(s, 10)
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]


@pytest.mark.parametrize("sent", [b"", b"POST /v2/models/accumulator/infer HTTP/1.1\r\nHost: x\r\n"])
def test_header_timeout_closes_the_connection(limited: ServerProcess, sent: bytes) -> None:
    """A connection that sends nothing, or never finishes its headers, is closed."""
    with socket.create_connection(("127.0.0.1", limited.http_port)) as s:
        s.sendall(sent)
        raw, elapsed = _read_all(s, 10)
    assert not raw.endswith(b"<still open>") and elapsed < 5, (elapsed, raw)


def test_idle_keepalive_connection_is_closed(limited: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", limited.http_port, timeout=10)
    try:
        r = http_request(limited, "POST", ACC, _doc(), conn=conn)
        assert r.status == 200
        r = http_request(limited, "POST", ACC, _doc(), conn=conn)  # kept alive while in use
        assert r.status == 200
        assert conn.sock is not None
        raw, elapsed = _read_all(conn.sock, 10)  # then closed once idle for the header timeout
        assert raw == b"" and elapsed < 5
    finally:
        conn.close()


def test_errors_keep_json_bodies_on_both_servers(limited: ServerProcess) -> None:
    # malformed chunked framing: granian reports it as a disconnect, hypercorn's parser refuses it
    with socket.create_connection(("127.0.0.1", limited.http_port)) as s:
        s.sendall(_head(**{"Transfer-Encoding": "chunked"}) + b"zz\r\n{}\r\n0\r\n\r\n")
        raw, _ = _read_all(s, 10)
    status, error = _status_and_error(raw)
    assert status == 400 and error
    # a chunk size past 64 bits: refused at once, not read (on hypercorn by the request filter in
    # front of h11, which takes any chunk size)
    with socket.create_connection(("127.0.0.1", limited.http_port)) as s:
        s.sendall(_head(**{"Transfer-Encoding": "chunked"}) + b"10000000000000000\r\n{}")
        raw, elapsed = _read_all(s, 10)
    status, error = _status_and_error(raw)
    assert status in (400, 413) and error and elapsed < 5
    r = http_request(limited, "POST", ACC, _doc(), {"Content-Encoding": "br"})
    assert r.status == 415 and r.error() == "Unsupported compression type"
    assert r.headers["accept-encoding"] == "gzip, deflate"


def _connection_server(launch: Callable[..., ServerProcess], http_server: str, *flags: str) -> ServerProcess:
    if http_server == "granian":
        pytest.importorskip("granian")
    return launch(None, "--http-server", http_server, "--http-header-timeout-secs", "30", *flags)


@pytest.mark.skipif(
    under_workers(), reason="the connection caps apply per worker process (docs/architecture.md, Worker processes)"
)
@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_connection_cap(launch: Callable[..., ServerProcess], http_server: str) -> None:
    """Two connections at most: granian leaves a third waiting to be accepted until one
    closes, the builtin server and hypercorn answer it 503 with a JSON error."""
    srv = _connection_server(launch, http_server, "--http-max-connections", "2")
    held = [socket.create_connection(("127.0.0.1", srv.http_port)) for _ in range(2)]
    try:
        time.sleep(0.3)
        third = socket.create_connection(("127.0.0.1", srv.http_port))
        body = _doc()
        third.sendall(_head(**{"Content-Length": str(len(body)), "Connection": "close"}) + body)
        raw, _ = _read_all(third, 2)
        if http_server in ("builtin", "hypercorn"):
            status, error = _status_and_error(raw)
            assert status == 503 and "too many connections" in error
        else:
            assert raw == b"<still open>", raw[:200]  # not served while two are held
            held.pop().close()
            raw, _ = _read_all(third, 10)
            assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        third.close()
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert http_request(srv, "POST", ACC, _doc()).status == 200  # slots come back


@pytest.mark.parametrize("http_server", HTTP_SERVERS)
def test_keepalive_off(launch: Callable[..., ServerProcess], http_server: str) -> None:
    srv = _connection_server(launch, http_server, "--http-keepalive-secs", "0")
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
    try:
        r = http_request(srv, "POST", ACC, _doc(), conn=conn)
        assert r.status == 200
        assert conn.sock is None or _read_all(conn.sock, 5)[0] == b""  # one request per connection
    finally:
        conn.close()


def test_generate_routes_answer_bad_json_with_400(server: ServerProcess) -> None:
    """The generate routes (501 before they were built) answer like the others: JSON errors."""
    for path in ("/v2/models/accumulator/generate", "/v2/models/accumulator/versions/1/generate_stream"):
        r = http_request(server, "POST", path, b"{")
        assert r.status == 400 and "failed to parse the request JSON" in r.error(), (path, r.status, r.body)
        assert r.headers["content-type"] == "application/json"


def test_http_bad_values_are_400(server: ServerProcess) -> None:
    x = acc_input()
    for doc, fragment in (
        ({"inputs": [x, x], "parameters": {"sequence_id": new_int_id(), **SEQ}}, "already exists in request"),
        ({"inputs": [acc_input(shape=[1] * 65)], "parameters": {"sequence_id": 5, **SEQ}}, "at most 64"),
        ({"inputs": [x], "parameters": {"sequence_id": new_int_id(), "priority": 2**64, **SEQ}}, "'priority'"),
        ({"inputs": [x], "parameters": {"sequence_id": new_int_id(), "custom": {"a": 1}, **SEQ}}, "'custom'"),
        ({"inputs": [x], "id": 5, "parameters": {"sequence_id": new_int_id(), **SEQ}}, "'id'"),
    ):
        r = http_request(server, "POST", ACC, doc)
        assert r.status == 400 and fragment in r.error(), (doc, r.body)
    # priority 2^31 is a valid uint64 (ignored by a sequence model, as in Triton): no 500, no leak
    doc = {"inputs": [acc_input(3.0)], "parameters": {"sequence_id": new_int_id(), "priority": 2**31, **SEQ}}
    r = http_request(server, "POST", ACC, doc)
    assert r.status == 200, r.body


# ---------------------------------------------------------------------------- gRPC


def _identity_request(n: int) -> service_pb2.ModelInferRequest:
    """Every input of `identity`: IN_FP32 with n elements, the others with one."""
    r = service_pb2.ModelInferRequest(model_name="identity", id="big")
    for t in IDENTITY_DTYPES:
        if t == "BYTES":
            r.inputs.add(name=f"IN_{t}", datatype=t, shape=[1])
            r.raw_input_contents.append(b"\x01\x00\x00\x00a")
            continue
        dtype = {"BOOL": np.bool_, "FP16": np.float16}.get(t) or np.dtype(t.lower().replace("fp", "float"))
        count = n if t == "FP32" else 1
        r.inputs.add(name=f"IN_{t}", datatype=t, shape=[count])
        r.raw_input_contents.append(np.zeros(count, dtype).tobytes())
    return r


def test_grpc_message_limits(limited: ServerProcess) -> None:
    if "granian" in limited.log():
        pytest.skip("gRPC does not depend on the HTTP server: checked once")
    with grpc.insecure_channel(limited.grpc_url, options=[("grpc.max_send_message_length", -1)]) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        big = _acc_request()
        big.raw_input_contents[0] = bytes(200_000)  # over the receive limit: refused before decoding
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(big, timeout=20)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.RpcError) as e:  # a reply over the send limit
            stub.ModelInfer(_identity_request(10_000), timeout=20)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # but the identity model itself would have answered: no other input is missing
        assert stub.ModelInfer(_identity_request(10), timeout=20).outputs


def _acc_request(sid: int | None = None, value: float = 1.0, rid: str = "") -> service_pb2.ModelInferRequest:
    r = service_pb2.ModelInferRequest(model_name="accumulator", id=rid)
    r.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
    r.raw_input_contents.append(np.float32(value).tobytes())
    r.parameters["sequence_id"].int64_param = sid or new_int_id()
    r.parameters["sequence_start"].bool_param = True
    r.parameters["sequence_end"].bool_param = True
    return r


def test_grpc_idle_connections_close_and_clients_reconnect(limited: ServerProcess) -> None:
    if "granian" in limited.log():
        pytest.skip("gRPC does not depend on the HTTP server: checked once")
    cl = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        assert cl.is_server_live()
        time.sleep(2.5)  # past --grpc-max-connection-idle-secs: the server sent a GOAWAY
        assert cl.is_server_live()
    finally:
        cl.close()


def _raw_unary(ch: grpc.Channel, method: str, payload: bytes) -> grpc.RpcError:
    call = ch.unary_unary(f"/inference.GRPCInferenceService/{method}")
    with pytest.raises(grpc.RpcError) as e:
        call(payload, timeout=10)
    return e.value


def test_grpc_undecodable_messages(server: ServerProcess) -> None:
    garbage = b"\xff" * 16
    with grpc.insecure_channel(server.grpc_url) as ch:
        for method in ("ModelInfer", "ModelMetadata", "ModelConfig", "RepositoryIndex"):
            err = _raw_unary(ch, method, garbage)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.details())
            assert "failed to parse the" in (err.details() or ""), err.details()


def test_grpc_stream_answers_garbage_and_goes_on(server: ServerProcess) -> None:
    sid = new_int_id()
    first = _acc_request(sid, 2.0, "first")
    first.parameters["sequence_end"].bool_param = False
    second = _acc_request(sid, 3.0, "second")
    second.parameters["sequence_start"].bool_param = False
    payloads = [first.SerializeToString(), b"\xff" * 16, second.SerializeToString()]
    with grpc.insecure_channel(server.grpc_url) as ch:
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        replies = [service_pb2.ModelStreamInferResponse.FromString(r) for r in call(iter(payloads), timeout=20)]
    assert [r.infer_response.id for r in replies] == ["first", "", "second"]
    assert "failed to parse the ModelInferRequest message" in replies[1].error_message
    assert not replies[2].error_message
    assert np.frombuffer(replies[2].infer_response.raw_output_contents[0], np.float32).tolist() == [5.0]


def test_grpc_stream_garbage_ends_the_stream_with_triton_grpc_error(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as ch:
        call = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as e:
            list(call(iter([b"\xff" * 16]), timeout=20, metadata=[("triton_grpc_error", "true")]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to parse" in (e.value.details() or "")


def test_grpc_huge_names_are_clipped_in_errors(server: ServerProcess) -> None:
    """An error quoting a 1 MiB model name would exceed the client's 16 KiB trailer limit."""
    with grpc.insecure_channel(server.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="m" * (1 << 20)), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    details = e.value.details() or ""
    assert details.startswith("Request for unknown model: 'mmm") and details.endswith("characters)")
    assert len(details) < 5000


# ---------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    "flag",
    [
        ["--http-max-body-bytes", "0"],
        ["--http-body-timeout-secs", "0"],
        ["--http-header-timeout-secs", "-1"],
        ["--http-keepalive-secs", "-1"],
        ["--http-max-connections", "0"],
        ["--grpc-max-receive-message-bytes", "3000000000"],
        ["--grpc-max-concurrent-streams", "x"],
        ["--grpc-keepalive-secs", "0"],
    ],
)
def test_bad_limit_values_are_usage_errors(flag: list[str], tmp_path: Path) -> None:
    p = run_serve(*flag)
    assert p.returncode == 2 and flag[0] in p.stderr, p.stderr


def test_grpc_options_follow_the_flags(launch: Callable[..., ServerProcess]) -> None:
    """The gRPC limits follow --http-max-body-bytes unless set, and every option starts."""
    srv = launch(
        None,
        "--http-max-body-bytes", "2000",
        "--grpc-max-concurrent-streams", "4",
        "--grpc-keepalive-secs", "30",
        "--grpc-keepalive-timeout-secs", "5",
        "--grpc-max-connection-idle-secs", "0",
    )  # fmt: skip
    with grpc.insecure_channel(srv.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        assert stub.ModelInfer(_acc_request(), timeout=10).outputs
        big = _acc_request()
        big.parameters["pad"].string_param = "x" * 3000
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelInfer(big, timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_grpc_restriction_comes_before_decoding(launch: Callable[..., ServerProcess]) -> None:
    """A restricted rpc refuses an unauthorized caller before it looks at the message."""
    srv = launch(None, "--grpc-restricted-protocol", "metadata,inference:admin=s3cret")
    garbage = b"\xff" * 16
    with grpc.insecure_channel(srv.grpc_url) as ch:
        for method in ("ModelMetadata", "ModelInfer"):
            call = ch.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as e:
                call(garbage, timeout=10)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, (method, e.value.details())
            with pytest.raises(grpc.RpcError) as e:
                call(garbage, timeout=10, metadata=[("triton-grpc-protocol-admin", "s3cret")])
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, e.value.details())
