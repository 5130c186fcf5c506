"""--http-restricted-api / --grpc-restricted-protocol, as Triton has them, against real servers
and the real tritonclient (its ``headers=`` argument, which gRPC sends as call metadata)."""

from __future__ import annotations

import http.client
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from seqserve._proto import health_pb2, health_pb2_grpc
from tests.support.clients import FLAVOURS, Client, http_request, new_int_id
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, run_serve, serving

# Every group restricted, in four groups with their own keys (as Triton's qa does it).
KEYS = {
    "health-key": ("h-value", ["health", "metadata"]),
    "infer-key": ("infer-value", ["inference", "sequence"]),
    "stats-key": ("st=value:2", ["model-config", "statistics"]),  # '=' and ':' belong to the value
    "admin-key": ("admin-value", ["model-repository", "shared-memory", "trace", "logging"]),
}
KEY_OF = {group: (key, value) for key, (value, groups) in KEYS.items() for group in groups}
GRPC_PREFIX = "triton-grpc-protocol-"


def _flags(option: str) -> list[str]:
    return [f"{option}={','.join(groups)}:{key}={value}" for key, (value, groups) in KEYS.items()]


def _ready_with(header: dict[str, str]) -> Any:
    def probe(srv: ServerProcess) -> bool:
        req = urllib.request.Request(srv.base_url + "/v2/health/ready", headers=header)
        try:
            with urllib.request.urlopen(req, timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    return probe


def _server(tmp: Any, *args: str, probe: Any = None) -> Iterator[ServerProcess]:
    with serving(DEMO_REPO, *args, log_dir=tmp, probe=probe) as srv:
        yield srv


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Every group of both front-ends restricted (HTTP: the default server, granian when installed)."""
    args = [*_flags("--http-restricted-api"), *_flags("--grpc-restricted-protocol")]
    yield from _server(tmp_path_factory.mktemp("locked"), *args, probe=_ready_with({"health-key": "h-value"}))


@pytest.fixture(scope="module")
def admin_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Only model-repository restricted (Triton's recommendation for model control), on hypercorn."""
    yield from _server(
        tmp_path_factory.mktemp("admin"),
        "--http-server",
        "hypercorn",
        "--http-restricted-api=model-repository:admin-key=admin-value",
        "--grpc-restricted-protocol=model-repository:admin-key=admin-value",
    )


@pytest.fixture(params=FLAVOURS)
async def locked_client(request: pytest.FixtureRequest, locked: ServerProcess) -> AsyncIterator[Client]:
    cl = Client(request.param, locked)
    yield cl
    await cl.close()


def headers_for(cl: Client, group: str, *, value: str | None = None) -> dict[str, str]:
    key, right = KEY_OF[group]
    return {(key if cl.is_http else GRPC_PREFIX + key): right if value is None else value}


def refusal(cl: Client, group: str) -> tuple[str, str]:
    """(status, message) of Triton's refusal."""
    key = KEY_OF[group][0]
    if cl.is_http:
        return "403", f"This API is restricted, expecting header '{key}'"
    return "StatusCode.PERMISSION_DENIED", f"This protocol is restricted, expecting header '{GRPC_PREFIX}{key}'"


def _add_sub_inputs(cl: Client) -> list[Any]:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    return [cl.input("INPUT0", x), cl.input("INPUT1", x)]


NOT_SERVED = object()  # the call passes the restriction and gets seqserve's usual answer: not implemented

# group, tritonclient method, arguments; with the right header: None (it works), NOT_SERVED,
# or (HTTP status, gRPC status, message fragment)
CALLS: list[tuple[str, str, tuple[Any, ...], Any]] = [
    ("health", "is_server_live", (), None),
    ("health", "is_server_ready", (), None),
    ("health", "is_model_ready", ("accumulator",), None),
    ("metadata", "get_server_metadata", (), None),
    ("metadata", "get_model_metadata", ("accumulator",), None),
    ("inference", "infer", ("add_sub",), None),
    ("model-config", "get_model_config", ("accumulator",), None),
    ("statistics", "get_inference_statistics", ("accumulator",), None),
    ("model-repository", "get_model_repository_index", (), None),
    ("model-repository", "unload_model", ("accumulator",),
     ("503", "StatusCode.UNAVAILABLE", "explicit model load / unload is not allowed")),
    ("shared-memory", "get_system_shared_memory_status", (), None),
    ("shared-memory", "get_cuda_shared_memory_status", (), None),
    ("trace", "get_trace_settings", (), None),
    ("logging", "get_log_settings", (), None),
]  # fmt: skip


async def _invoke(cl: Client, method: str, args: tuple[Any, ...], headers: dict[str, str]) -> Any:
    if method == "infer":
        return await cl("infer", *args, _add_sub_inputs(cl), headers=headers)
    return await cl(method, *args, headers=headers)


@pytest.mark.parametrize(("group", "method", "args", "granted"), CALLS, ids=[c[1] for c in CALLS])
async def test_each_group_needs_its_header(
    locked_client: Client, group: str, method: str, args: tuple[Any, ...], granted: Any
) -> None:
    cl = locked_client
    status, message = refusal(cl, group)
    other = "inference" if group != "inference" else "model-repository"
    refused_headers = [
        {},
        headers_for(cl, group, value="wrong"),
        headers_for(cl, group, value=KEY_OF[group][1] + "x"),
        headers_for(cl, other),  # another group's key and value
    ]
    for headers in refused_headers:
        try:
            result = await _invoke(cl, method, args, headers)
        except InferenceServerException as e:
            assert (e.status(), e.message()) == (status, message), headers
        else:  # tritonclient's HTTP health calls answer False for any non-200 status
            assert cl.is_http and method.startswith("is_") and result is False, (headers, result)

    headers = headers_for(cl, group)
    if granted is None:
        result = await _invoke(cl, method, args, headers)
        assert result is not False and result is not None
        if method == "infer":
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * np.arange(4, dtype=np.float32)[None])
        return
    with pytest.raises(InferenceServerException) as ei:
        await _invoke(cl, method, args, headers)
    if granted is NOT_SERVED:  # past the restriction: what an open server answers
        expect = ("501", "does not implement") if cl.is_http else ("StatusCode.UNIMPLEMENTED", "does not implement")
    else:
        expect = (granted[0], granted[2]) if cl.is_http else (granted[1], granted[2])
    assert ei.value.status() == expect[0] and expect[1] in (ei.value.message() or ""), ei.value


def test_http_refusals_on_the_wire(locked: ServerProcess) -> None:
    for path, method, group in [
        ("/v2/health/live", "GET", "health"),
        ("/v2/models/accumulator/ready", "GET", "health"),
        ("/v2", "GET", "metadata"),
        ("/v2/models/accumulator/versions/1/infer", "POST", "inference"),
        ("/v2/models/accumulator/sequences", "GET", "sequence"),
        ("/v2/models/accumulator/sequences/s1/end", "POST", "sequence"),
        ("/v2/models/stats", "GET", "statistics"),
        ("/v2/repository/index", "POST", "model-repository"),
        ("/v2/logging", "GET", "logging"),
        ("/v2/models/accumulator/trace/setting", "POST", "trace"),
        ("/v2/health/live", "POST", "health"),  # as Triton: the restriction before the method check
    ]:
        key, value = KEY_OF[group]
        r = http_request(locked, method, path)
        assert r.status == 403, (path, r.status)
        assert r.headers["content-type"] == "application/json"
        assert r.error() == f"This API is restricted, expecting header '{key}'"
        # header names are case-insensitive; the value is compared exactly
        assert http_request(locked, method, path, headers={key.upper(): value.upper()}).status == 403
        assert http_request(locked, method, path, headers={key.upper(): value}).status != 403
    # the sequence API, past its restriction
    r = http_request(locked, "GET", "/v2/models/accumulator/sequences", headers={"infer-key": "infer-value"})
    assert r.status == 200 and r.json()["model"] == "accumulator"
    assert http_request(locked, "GET", "/nothing/here").status == 404  # no group: not restricted


def test_sequences_with_headers(locked: ServerProcess) -> None:
    """A tritonclient user works against a restricted server by passing the header: a
    sequence over HTTP, gRPC unary and a gRPC stream (metadata given to start_stream)."""
    import tritonclient.http as httpclient

    def step(client: Any, mod: Any, seq: int, value: float, headers: dict[str, str], **kw: Any) -> float:
        inp = mod.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        result = client.infer("accumulator", [inp], sequence_id=seq, headers=headers, **kw)
        return float(result.as_numpy("OUTPUT")[0, 0])

    h = httpclient.InferenceServerClient(locked.http_url)
    g = grpcclient.InferenceServerClient(locked.grpc_url)
    for client, mod, headers in [
        (h, httpclient, {"infer-key": "infer-value"}),
        (g, grpcclient, {GRPC_PREFIX + "infer-key": "infer-value"}),
    ]:
        seq = new_int_id()
        assert step(client, mod, seq, 1.0, headers, sequence_start=True) == 1.0
        assert step(client, mod, seq, 2.0, headers) == 3.0
        with pytest.raises(InferenceServerException, match="is restricted, expecting header"):
            step(client, mod, seq, 4.0, {})
        assert step(client, mod, seq, 4.0, headers, sequence_end=True) == 7.0
    h.close()

    results: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        results.append((result, error))
        done.set()

    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[5.0]], dtype=np.float32))
    # without the header: the stream is refused as it opens, as in Triton
    g.start_stream(callback=callback, headers={"test": "1"})
    assert done.wait(10)
    (_, error), *_ = results
    assert error.status() == "StatusCode.PERMISSION_DENIED"
    assert error.message() == f"This protocol is restricted, expecting header '{GRPC_PREFIX}infer-key'"
    g.stop_stream()
    results.clear()
    done.clear()
    g.start_stream(callback=callback, headers={GRPC_PREFIX + "infer-key": "infer-value"})
    seq = new_int_id()
    g.async_stream_infer("accumulator", [inp], sequence_id=seq, sequence_start=True, sequence_end=True)
    assert done.wait(10)
    (result, error), *_ = results
    assert error is None and float(result.as_numpy("OUTPUT")[0, 0]) == 5.0
    g.stop_stream()
    g.close()


def test_grpc_health_check_is_health(locked: ServerProcess) -> None:
    with grpc.insecure_channel(locked.grpc_url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert ei.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "expecting header 'triton-grpc-protocol-health-key'" in (ei.value.details() or "")
        reply = stub.Check(
            health_pb2.HealthCheckRequest(), metadata=[(GRPC_PREFIX + "health-key", "h-value")], timeout=10
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_unrestricted_groups_stay_open(admin_only: ServerProcess, flavour: str) -> None:
    cl = Client(flavour, admin_only)
    try:
        assert await cl("is_server_live") is True
        assert await cl("is_model_ready", "accumulator") is True
        assert (await cl("get_server_metadata"))["name"] == "seqserve"
        assert (await cl("get_model_metadata", "accumulator"))["name"] == "accumulator"
        assert (await cl("get_model_config", "accumulator")) is not None
        assert (await cl("get_inference_statistics", "accumulator")) is not None
        result = await cl("infer", "add_sub", _add_sub_inputs(cl))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 4), dtype=np.float32))
        seq = new_int_id()
        assert await cl.step("accumulator", seq, 2.0, sequence_start=True) == 2.0
        assert await cl.step("accumulator", seq, 3.0, sequence_end=True) == 5.0
        # the one restricted group
        key = "admin-key" if cl.is_http else GRPC_PREFIX + "admin-key"
        with pytest.raises(InferenceServerException, match="is restricted, expecting header '" + key):
            await cl("get_model_repository_index")
        index = await cl("get_model_repository_index", headers={key: "admin-value"})
        assert index
    finally:
        await cl.close()


@pytest.mark.parametrize("which", ["locked", "admin_only"])
def test_a_refused_request_leaves_the_connection_usable(which: str, request: pytest.FixtureRequest) -> None:
    """The refusal is sent before the body is read; the next request on the same keep-alive
    connection is answered normally (granian on `locked`, hypercorn on `admin_only`)."""
    srv: ServerProcess = request.getfixturevalue(which)
    body = b'{"parameters": {"config": "' + b"x" * (1 << 20) + b'"}}'
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    ok_headers = {"health-key": "h-value"} if which == "locked" else {}
    for _ in range(3):
        r = http_request(srv, "POST", "/v2/repository/models/accumulator/load", body, conn=conn)
        assert r.status == 403 and "expecting header 'admin-key'" in r.error()
        r = http_request(srv, "GET", "/v2/health/ready", headers=ok_headers, conn=conn)
        assert r.status == 200
    r = http_request(
        srv, "POST", "/v2/repository/models/accumulator/load", body, headers={"admin-key": "admin-value"}, conn=conn
    )
    assert r.status == 503 and "explicit model load / unload is not allowed" in r.error()
    conn.close()


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--http-restricted-api=health", "seqserve: --http-restricted-api option format is "
         "'<config name>:<setting>=<value>'. Got health"),
        ("--grpc-restricted-protocol=health:key", "seqserve: --grpc-restricted-protocol option format is "
         "'<config name>:<setting>=<value>'. Got health:key"),
        ("--http-restricted-api=model-reposit:k=v", "seqserve: unknown restricted api 'model-reposit'"),
        ("--grpc-restricted-protocol=metrics:k=v", "seqserve: unknown restricted protocol 'metrics'"),
        ("--http-restricted-api=metadata,health,metadata:k=v",
         "seqserve: restricted api 'metadata' can not be specified in multiple config groups"),
    ],
)  # fmt: skip
def test_bad_flags_stop_the_server_at_startup(flag: str, message: str) -> None:
    proc = run_serve(flag)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == message + "\n"


def test_grpc_stream_refusal_with_partial_header(locked: ServerProcess) -> None:
    """The stream's metadata is checked once, when it opens; a wrong value ends it at once."""
    errors: list[Any] = []
    client = grpcclient.InferenceServerClient(locked.grpc_url)
    event = threading.Event()

    def callback(result: Any, error: Any) -> None:
        errors.append(error)
        event.set()

    client.start_stream(callback=callback, headers={GRPC_PREFIX + "infer-key": "infer-valu"})
    assert event.wait(10)
    assert "This protocol is restricted" in errors[0].message()
    client.stop_stream()
    client.close()
