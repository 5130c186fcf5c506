"""Triton's system shared-memory extension with tritonclient's own utilities
(``tritonclient.utils.shared_memory``), over HTTP and gRPC: regions registered, inputs read from
and outputs written into them, a sequence's state kept across steps whose tensors all travel
through shared memory, on unary calls and on a stream, and the refusals (an unknown key, sizes beyond a region)."""

from __future__ import annotations

import base64
import queue
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from seqserve.engine.device.probe import probe_gpus
from tests.support.clients import http_request
from tests.support.process import ServerProcess

CLIENTS: dict[str, Any] = {"http": httpclient, "grpc": grpcclient}
BAD_REQUEST = ("400", "StatusCode.INVALID_ARGUMENT")


def _client(protocol: str, srv: ServerProcess) -> Any:
    return CLIENTS[protocol].InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)


class Regions:
    """Shared-memory objects made with tritonclient's utilities, destroyed (and unregistered
    from the server) at the end of a test."""

    def __init__(self, srv: ServerProcess) -> None:
        self.srv = srv
        self.handles: list[tuple[str, Any]] = []

    def create(self, size: int) -> tuple[str, str, Any]:
        """A new object: (region name, key, handle)."""
        tag = uuid.uuid4().hex[:12]
        name, key = f"r-{tag}", f"/seqserve-it-{tag}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append((name, handle))
        return name, key, handle

    def close(self) -> None:
        client = _client("http", self.srv)
        for name, handle in self.handles:
            client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(server: ServerProcess) -> Iterator[Regions]:
    r = Regions(server)
    yield r
    r.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_through_shared_memory(server: ServerProcess, regions: Regions, protocol: str) -> None:
    mod, client = CLIENTS[protocol], _client(protocol, server)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10, dtype=np.float32)
    in_name, in_key, in_handle = regions.create(32)
    out_name, out_key, out_handle = regions.create(48)
    shm.set_shared_memory_region(in_handle, [a, b])
    client.register_system_shared_memory(in_name, in_key, 32)
    client.register_system_shared_memory(out_name, out_key, 48, offset=0)
    status = client.get_system_shared_memory_status(in_name)
    if protocol == "http":
        assert status == [{"name": in_name, "key": in_key, "offset": 0, "byte_size": 32}]
    else:
        assert status.regions[in_name].key == in_key and status.regions[in_name].byte_size == 32

    x, y = mod.InferInput("INPUT0", [1, 4], "FP32"), mod.InferInput("INPUT1", [1, 4], "FP32")
    x.set_shared_memory(in_name, 16)
    y.set_shared_memory(in_name, 16, offset=16)
    sum_out, diff_out = mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")
    sum_out.set_shared_memory(out_name, 16, offset=32)
    diff_out.set_shared_memory(out_name, 16)
    result = client.infer("add_sub", [x, y], outputs=[sum_out, diff_out])

    entry = result.get_output("OUTPUT0")
    shape = entry["shape"] if protocol == "http" else list(entry.shape)
    assert shape == [1, 4]
    got_sum = shm.get_contents_as_numpy(out_handle, np.float32, shape, offset=32)
    got_diff = shm.get_contents_as_numpy(out_handle, np.float32, shape)
    assert got_sum.tolist() == (a + b).tolist() and got_diff.tolist() == (a - b).tolist()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_sequence_keeps_its_state_while_its_tensors_travel_in_shared_memory(
    server: ServerProcess, regions: Regions, protocol: str
) -> None:
    """Registered over HTTP, used over either protocol: regions are the server's, as in Triton."""
    mod, client = CLIENTS[protocol], _client(protocol, server)
    in_name, in_key, in_handle = regions.create(4)
    out_name, out_key, out_handle = regions.create(4)
    _client("http", server).register_system_shared_memory(in_name, in_key, 4)
    _client("http", server).register_system_shared_memory(out_name, out_key, 4)
    seq = 8_800 + len(protocol) * 10 + uuid.uuid4().int % 10
    sums = []
    for step, value in enumerate([2.0, 5.0, -1.0]):
        shm.set_shared_memory_region(in_handle, [np.array([[value]], dtype=np.float32)])
        x = mod.InferInput("INPUT", [1, 1], "FP32")
        x.set_shared_memory(in_name, 4)
        out = mod.InferRequestedOutput("OUTPUT")
        out.set_shared_memory(out_name, 4)
        client.infer(
            "accumulator", [x], outputs=[out], sequence_id=seq, sequence_start=step == 0, sequence_end=step == 2
        )
        sums.append(float(shm.get_contents_as_numpy(out_handle, np.float32, [1, 1])[0, 0]))
    assert sums == [2.0, 7.0, 6.0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refusals(server: ServerProcess, regions: Regions, protocol: str) -> None:
    mod, client = CLIENTS[protocol], _client(protocol, server)
    with pytest.raises(InferenceServerException) as ei:
        client.register_system_shared_memory("nokey", "/seqserve-no-such-key", 8)
    assert ei.value.status() in BAD_REQUEST and "Unable to open shared memory region" in ei.value.message()

    name, key, _ = regions.create(16)
    with pytest.raises(InferenceServerException) as ei:
        client.register_system_shared_memory(name, key, 32)  # beyond the object
    assert "exceed the 16 bytes" in ei.value.message()
    client.register_system_shared_memory(name, key, 16)
    with pytest.raises(InferenceServerException) as ei:
        client.register_system_shared_memory(name, key, 16)
    assert "already in manager" in ei.value.message()

    x, y = mod.InferInput("INPUT0", [1, 4], "FP32"), mod.InferInput("INPUT1", [1, 4], "FP32")
    x.set_shared_memory(name, 16)
    y.set_shared_memory(name, 16, offset=8)  # [8, 24) of a 16-byte region
    with pytest.raises(InferenceServerException) as ei:
        client.infer("add_sub", [x, y])
    assert ei.value.status() in BAD_REQUEST and "exceed the 16 bytes" in ei.value.message()

    y.set_shared_memory("not-registered", 16)
    with pytest.raises(InferenceServerException) as ei:
        client.infer("add_sub", [x, y])
    assert "Unable to find shared memory region: 'not-registered'" in ei.value.message()
    assert client.is_server_live()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_output_region_too_small_is_refused_before_the_step_runs(
    server: ServerProcess, regions: Regions, protocol: str
) -> None:
    mod, client = CLIENTS[protocol], _client(protocol, server)
    name, key, handle = regions.create(8)
    client.register_system_shared_memory(name, key, 8)
    seq = 8_700 + len(protocol) * 10 + uuid.uuid4().int % 10

    def step(value: float, out_size: int, start: bool = False, end: bool = False) -> Any:
        x = mod.InferInput("INPUT", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        out = mod.InferRequestedOutput("OUTPUT")
        out.set_shared_memory(name, out_size, offset=4)
        return client.infer("accumulator", [x], outputs=[out], sequence_id=seq, sequence_start=start, sequence_end=end)

    step(2.0, 4, start=True)
    with pytest.raises(InferenceServerException) as ei:
        step(100.0, 2)
    assert ei.value.status() in BAD_REQUEST and "should be at least 4 bytes" in ei.value.message()
    step(5.0, 4, end=True)
    assert shm.get_contents_as_numpy(handle, np.float32, [1, 1], offset=4).tolist() == [[7.0]]  # 100 never ran


def test_a_destroyed_region_leaves_the_status(server: ServerProcess) -> None:
    client = _client("grpc", server)
    tag = uuid.uuid4().hex[:12]
    handle = shm.create_shared_memory_region(f"gone-{tag}", f"/seqserve-it-{tag}", 8)
    client.register_system_shared_memory(f"gone-{tag}", f"/seqserve-it-{tag}", 8)
    assert f"gone-{tag}" in client.get_system_shared_memory_status().regions
    shm.destroy_shared_memory_region(handle)  # the client goes away without unregistering
    assert f"gone-{tag}" not in client.get_system_shared_memory_status().regions


def test_raw_http_routes(server: ServerProcess) -> None:
    assert http_request(server, "GET", "/v2/systemsharedmemory/status").status == 200
    assert http_request(server, "POST", "/v2/systemsharedmemory/status").status == 405
    assert http_request(server, "POST", "/v2/systemsharedmemory/register", b"{}").status == 404  # names no region
    bad = http_request(server, "POST", "/v2/systemsharedmemory/region/r/register", {"key": "/k", "byte_size": -1})
    assert bad.status == 400 and "byte_size" in bad.error()
    traversal = {"key": "/../../etc/passwd", "byte_size": 8}
    bad = http_request(server, "POST", "/v2/systemsharedmemory/region/r/register", traversal)
    assert bad.status == 400 and "must be a name" in bad.error()
    cuda = http_request(server, "GET", "/v2/cudasharedmemory/status")
    assert cuda.status == 200 and cuda.json() == []
    handle = {"raw_handle": {"b64": base64.b64encode(bytes(64)).decode()}, "device_id": 0, "byte_size": 64}
    refused = http_request(server, "POST", "/v2/cudasharedmemory/region/c/register", handle)
    if not probe_gpus().count:  # the client's error, naming why; the server is unaffected
        assert refused.status == 400 and "Unable to register CUDA shared memory region 'c'" in refused.error()
    bad = http_request(server, "POST", "/v2/cudasharedmemory/region/c/register", {"raw_handle": {"b64": "%%"}})
    assert bad.status == 400 and "not base64" in bad.error()


def test_cuda_shared_memory_rpcs_answer_and_refuse_without_a_gpu(server: ServerProcess) -> None:
    if probe_gpus().count:
        pytest.skip("this machine has a GPU: tests/gpu registers real CUDA regions")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert not client.get_cuda_shared_memory_status().regions
    client.unregister_cuda_shared_memory("nothing")  # no error, as in Triton
    with pytest.raises(InferenceServerException) as ei:
        client.register_cuda_shared_memory("c", base64.b64encode(bytes(64)), 0, 64)  # tritonclient decodes it
    assert ei.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Unable to register CUDA shared memory region 'c'" in ei.value.message()
    assert client.is_server_live()


def test_a_sequence_on_a_stream_through_shared_memory(server: ServerProcess, regions: Regions) -> None:
    in_name, in_key, in_handle = regions.create(4)
    out_name, out_key, out_handle = regions.create(4)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory(in_name, in_key, 4)
    client.register_system_shared_memory(out_name, out_key, 4)
    replies: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put(error or result))
    seq = 8_900 + uuid.uuid4().int % 50
    sums = []
    try:
        for step, value in enumerate([1.0, 2.0, 4.0]):
            shm.set_shared_memory_region(in_handle, [np.array([[value]], dtype=np.float32)])
            x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            x.set_shared_memory(in_name, 4)
            out = grpcclient.InferRequestedOutput("OUTPUT")
            out.set_shared_memory(out_name, 4)
            client.async_stream_infer(
                "accumulator", [x], outputs=[out], sequence_id=seq, sequence_start=step == 0, sequence_end=step == 2
            )
            reply = replies.get(timeout=60)
            assert not isinstance(reply, InferenceServerException), reply
            assert list(reply.get_output("OUTPUT").shape) == [1, 1]
            sums.append(float(shm.get_contents_as_numpy(out_handle, np.float32, [1, 1])[0, 0]))
    finally:
        client.stop_stream()
    assert sums == [1.0, 3.0, 7.0]


def test_a_stream_request_naming_no_region_is_refused_and_the_stream_goes_on(server: ServerProcess) -> None:
    replies: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: replies.put(error or result))
    try:
        x, y = grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")
        x.set_shared_memory("not-registered", 16)
        y.set_shared_memory("not-registered", 16, offset=16)
        client.async_stream_infer("add_sub", [x, y])
        error = replies.get(timeout=60)
        assert isinstance(error, InferenceServerException)
        assert "Unable to find shared memory region: 'not-registered'" in error.message()
        for t in (x, y):
            t.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.async_stream_infer("add_sub", [x, y])
        assert replies.get(timeout=60).as_numpy("OUTPUT0").tolist() == [[2, 2, 2, 2]]
    finally:
        client.stop_stream()
