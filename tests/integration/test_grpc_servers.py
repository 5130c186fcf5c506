"""Both gRPC servers (``--grpc-server builtin``, the default, and ``grpcio``) with tritonclient's
gRPC clients: compressed requests, tensors larger than every HTTP/2 window, unary calls and
streams side by side on one connection. The builtin server's protocol details are unit-tested
(tests/integration/test_grpc_builtin_server.py); every other integration test runs on the default."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from tests.support.clients import new_int_id
from tests.support.models import write_model
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, start_server

GRPC_SERVERS = ["builtin", "grpcio"]
ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
ECHO_MODEL = """
class Model:
    def execute(self, batch):
        return {"OUT": batch.inputs["IN"].copy()}
"""


@pytest.fixture(scope="module", params=GRPC_SERVERS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"grpc-{request.param}")
    repo = root / "models"
    shutil.copytree(DEMO_REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    write_model(repo, "echo", ECHO_CONFIG, ECHO_MODEL)
    srv = start_server(repo, "--grpc-server", request.param, log_dir=root)
    assert f"gRPC ({request.param}) listening" in srv.log()
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc}\n{srv.log()}"


def _add_sub(client: grpcclient.InferenceServerClient, **kw: object) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32"), grpcclient.InferInput("INPUT1", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(served: ServerProcess, algorithm: str) -> None:
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        _add_sub(client, compression_algorithm=algorithm)
        _add_sub(client)


def test_tensors_larger_than_the_windows(served: ServerProcess) -> None:
    """32 MiB each way: past the client's and the server's HTTP/2 windows and frame sizes."""
    x = np.random.default_rng(0).random(8 << 20, dtype=np.float32)
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        inp = grpcclient.InferInput("IN", [x.size], "FP32")
        inp.set_data_from_numpy(x)
        for _ in range(2):
            out = client.infer("echo", [inp]).as_numpy("OUT")
            assert out is not None and np.array_equal(out, x)


async def test_unary_calls_and_streams_share_a_connection(served: ServerProcess) -> None:
    """Sequences on a stream and unary calls at once on one aio client (one HTTP/2 connection)."""
    client = grpcaio.InferenceServerClient(served.grpc_url)
    seqs = [new_int_id() for _ in range(4)]

    def step(seq: int, value: float, start: bool, end: bool) -> dict[str, object]:
        inp = grpcaio.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
        return {
            "model_name": "accumulator", "inputs": [inp], "sequence_id": seq,
            "sequence_start": start, "sequence_end": end,
        }  # fmt: skip

    async def requests():  # type: ignore[no-untyped-def]
        for i in range(5):
            for seq in seqs:
                yield step(seq, 1.0, i == 0, i == 4)

    async def unary(seq: int) -> float:
        total = 0.0
        for i in range(5):
            r = await client.infer(**step(seq, 2.0, i == 0, i == 4))  # type: ignore[arg-type]
            total = float(r.as_numpy("OUTPUT")[0][0])
        return total

    async def stream() -> list[float]:
        out = []
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            out.append(float(result.as_numpy("OUTPUT")[0][0]))
        return out

    try:
        streamed, *sums = await asyncio.wait_for(asyncio.gather(stream(), *(unary(new_int_id()) for _ in range(4))), 30)
    finally:
        await client.close()
    assert sums == [10.0] * 4
    assert sorted(streamed) == sorted([float(i) for i in range(1, 6)] * 4)
