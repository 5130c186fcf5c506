"""Triton's CUDA shared-memory extension against a real `seqserve serve`: tritonclient's CUDA
shared-memory utilities (this process) make device regions, the server (another process) opens
them by IPC handle, reads inputs from and writes outputs into them, over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(DEMO_REPO, log_dir=tmp_path_factory.mktemp("logs")) as srv:
        yield srv


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_through_cuda_shared_memory(server: ServerProcess, protocol: str) -> None:
    import tritonclient.utils.cuda_shared_memory as cudashm

    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 10, dtype=np.float32)
    inputs = cudashm.create_shared_memory_region(f"in-{protocol}", 32, 0)
    outputs = cudashm.create_shared_memory_region(f"out-{protocol}", 32, 0)
    try:
        cudashm.set_shared_memory_region(inputs, [a, b])
        client.register_cuda_shared_memory(f"in-{protocol}", cudashm.get_raw_handle(inputs), 0, 32)
        client.register_cuda_shared_memory(f"out-{protocol}", cudashm.get_raw_handle(outputs), 0, 32)
        status = client.get_cuda_shared_memory_status()
        names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
        assert f"in-{protocol}" in names and f"out-{protocol}" in names
        x, y = mod.InferInput("INPUT0", [1, 4], "FP32"), mod.InferInput("INPUT1", [1, 4], "FP32")
        x.set_shared_memory(f"in-{protocol}", 16)
        y.set_shared_memory(f"in-{protocol}", 16, offset=16)
        total, diff = mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")
        total.set_shared_memory(f"out-{protocol}", 16)
        diff.set_shared_memory(f"out-{protocol}", 16, offset=16)
        client.infer("add_sub", [x, y], outputs=[total, diff])
        got = cudashm.get_contents_as_numpy(outputs, np.float32, [2, 4])
        assert got[0].tolist() == (a + b)[0].tolist() and got[1].tolist() == (a - b)[0].tolist()
        y.set_shared_memory(f"in-{protocol}", 16, offset=24)  # beyond the region
        with pytest.raises(Exception, match="exceed"):
            client.infer("add_sub", [x, y])
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(inputs)
        cudashm.destroy_shared_memory_region(outputs)
