"""BLS over the wire: a Triton-style Python model (tests/models/bls_sum) calls the demo
`accumulator` inside its own sequences, through a real `seqserve serve`, driven by tritonclient
over HTTP, gRPC and the gRPC stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from tests.support.bls import bls_model
from tests.support.clients import Client, SyncStream, expect_error, grpc_input, new_int_id, new_str_id
from tests.support.models import copy_demo_models, copy_model
from tests.support.process import ServerProcess, serving


@pytest.fixture(scope="module")
def bls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = copy_demo_models(tmp_path_factory.mktemp("bls-repo"), "accumulator")
    copy_model(repo, "repeat")
    bls_model(repo)
    bls_model(repo, "bls_async", mode="async")
    bls_model(repo, "bls_stream", callee="repeat", mode="stream")
    bls_model(repo, "bls_missing", callee="nowhere")
    bls_model(repo, "bls_self", callee="bls_self")
    bls_model(repo, "bls_bad", mode="bad_input")
    with serving(repo, log_dir=repo) as srv:
        yield srv


@pytest.fixture(params=["http", "http_aio", "grpc", "grpc_aio"])
async def bls_client(request: pytest.FixtureRequest, bls_server: ServerProcess) -> AsyncIterator[Client]:
    cl = Client(request.param, bls_server)
    yield cl
    await cl.close()


@pytest.mark.parametrize("model", ["bls_sum", "bls_async"])
async def test_running_sums_through_bls(bls_client: Client, model: str) -> None:
    for sid in (new_int_id(), new_str_id()):
        values = [2.0, 3.0, 4.0, 1.0]
        sums = []
        for k, v in enumerate(values):
            sums.append(await bls_client.step(model, sid, v, sequence_start=k == 0, sequence_end=k == len(values) - 1))
        assert sums == [2.0, 5.0, 9.0, 10.0]


@pytest.mark.parametrize("model", ["bls_sum", "bls_async"])
def test_running_sums_over_one_grpc_stream(bls_server: ServerProcess, model: str) -> None:
    """Interleaved sequences on one ModelStreamInfer call; each reply names its request."""
    stream = SyncStream(bls_server)
    try:
        sids = [new_int_id() for _ in range(4)]
        expected: dict[str, float] = {}
        sent = 0
        for k in range(3):
            for n, sid in enumerate(sids):
                value = float(n + 1)
                rid = f"{sid}-{k}"
                expected[rid] = value * (k + 1)
                stream.send(
                    model,
                    [grpc_input(value)],
                    request_id=rid,
                    sequence_id=sid,
                    sequence_start=k == 0,
                    sequence_end=k == 2,
                )
                sent += 1
        got: dict[str, float] = {}
        for _ in range(sent):
            result, error = stream.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            got[response.id] = float(result.as_numpy("OUTPUT")[0, 0])
        assert got == expected
    finally:
        stream.close()


async def test_decoupled_callee_through_bls(bls_client: Client) -> None:
    inp = bls_client.input("INPUT", np.array([[5.0]], dtype=np.float32))
    result = await bls_client(
        "infer", "bls_stream", [inp], sequence_id=new_int_id(), sequence_start=True, sequence_end=True
    )
    assert float(result.as_numpy("OUTPUT")[0, 0]) == 15.0


@pytest.mark.parametrize(
    ("model", "kind", "fragment"),
    [
        ("bls_missing", "NOT_FOUND", "nowhere"),
        ("bls_self", "INVALID_ARG", "called itself from its own execute"),
        (
            "bls_bad",
            "INVALID_ARG",
            "inference input 'INPUT' data-type is 'INT32', but model 'accumulator' expects 'FP32'",
        ),
    ],
)
async def test_callee_errors_reach_the_client(bls_client: Client, model: str, kind: str, fragment: str) -> None:
    inp = bls_client.input("INPUT", np.array([[1.0]], dtype=np.float32))
    call = bls_client("infer", model, [inp], sequence_id=new_int_id(), sequence_start=True, sequence_end=True)
    await expect_error(call, bls_client.code(kind), fragment)
    assert await bls_client("is_server_live")
    # the caller's batch was not harmed: the same server still sums
    assert await bls_client.step("bls_sum", new_int_id(), 7.0, sequence_start=True, sequence_end=True) == 7.0


def test_the_demo_bls_model_over_a_grpc_stream(server: ServerProcess) -> None:
    """The bundled accumulator_bls (async execute, async_exec) on the demo repository."""
    stream = SyncStream(server)
    try:
        sid = new_str_id()
        for k, value in enumerate([1.0, 2.0, 3.0]):
            stream.send(
                "accumulator_bls", [grpc_input(value)], sequence_id=sid, sequence_start=k == 0, sequence_end=k == 2
            )
        sums = []
        for _ in range(3):
            result, error = stream.get(timeout=60)
            assert error is None, error
            sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
        assert sums == [1.0, 3.0, 6.0]
    finally:
        stream.close()
