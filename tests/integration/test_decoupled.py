"""Decoupled models through a real `seqserve serve` and tritonclient: several responses per
request on the gRPC stream with `triton_final_response`, `enable_empty_final_response`, error
responses that leave the stream open, a decoupled sequence model with implicit state, and
Triton's refusal of decoupled models on unary HTTP and gRPC infer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.clients import SyncStream
from tests.support.models import copy_model, write_model
from tests.support.process import ServerProcess, serving

# Not decoupled, batch-level: OUT = IN, once the test has created the file `release` next to
# model.py (or after 20 s).
SLOW = """
import os
import time

RELEASE = os.path.join(os.path.dirname(__file__), "release")

class Model:
    def execute(self, batch):
        deadline = time.monotonic() + 20
        while not os.path.exists(RELEASE) and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"OUT": batch.inputs["IN"].copy()}
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("decoupled-repo")
    copy_model(repo, "repeat")
    copy_model(repo, "decoupled_acc", "acc")
    copy_model(repo, "until_cancelled", "uc")
    write_model(repo, "slow", SLOW_CONFIG, SLOW)
    with serving(repo, log_dir=repo) as s:
        yield s


def repeat_inputs(values: list[int], mode: int = 0, cls: Any = grpcclient) -> list[Any]:
    x = cls.InferInput("IN", [len(values)], "INT32")
    x.set_data_from_numpy(np.array(values, np.int32))
    m = cls.InferInput("MODE", [1], "INT32")
    m.set_data_from_numpy(np.array([mode], np.int32))
    return [x, m]


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def read(stream: SyncStream, n: int) -> list[tuple[Any, InferenceServerException | None]]:
    return [stream.get() for _ in range(n)]


def nothing_more(stream: SyncStream) -> bool:
    try:
        stream.get(timeout=0.3)
    except Exception:
        return True
    return False


@pytest.mark.parametrize("empty_final", [False, True])
def test_stream_several_responses(srv: ServerProcess, empty_final: bool) -> None:
    stream = SyncStream(srv)
    try:
        stream.send("repeat", repeat_inputs([4, 5, 6]), request_id="r1", enable_empty_final_response=empty_final)
        got = read(stream, 4 if empty_final else 3)
        assert all(err is None for _, err in got)
        results = [r for r, _ in got]
        assert [r.as_numpy("OUT").tolist() for r in results[:3]] == [[4], [5], [6]]
        assert [r.as_numpy("IDX").tolist() for r in results[:3]] == [[0], [1], [2]]
        assert [final_flag(r) for r in results[:3]] == [False, False, False]
        assert all(r.get_response().id == "r1" for r in results)
        if empty_final:  # the final flag arrives as a response without outputs
            last = results[3].get_response()
            assert final_flag(results[3]) and len(last.outputs) == 0
            assert (last.model_name, last.model_version) == ("repeat", "")  # the version as requested
        assert nothing_more(stream)
    finally:
        stream.close()


def test_final_flag_on_the_last_response(srv: ServerProcess) -> None:
    stream = SyncStream(srv)
    try:
        stream.send("repeat", repeat_inputs([1, 2], mode=1), enable_empty_final_response=True)
        results = [r for r, _ in read(stream, 2)]
        assert [final_flag(r) for r in results] == [False, True]
        assert nothing_more(stream)  # no separate empty final response
    finally:
        stream.close()


def test_error_response_keeps_the_stream(srv: ServerProcess) -> None:
    stream = SyncStream(srv)
    try:
        stream.send("repeat", repeat_inputs([1, -1, 3]), request_id="e")
        got = read(stream, 3)
        assert got[0][0].as_numpy("OUT").tolist() == [1]
        assert got[1][1] is not None and "negative value at 1" in str(got[1][1])
        assert got[2][0].as_numpy("OUT").tolist() == [3]
        # a model failure after a response: the response, then the error
        stream.send("repeat", repeat_inputs([99]))
        got = read(stream, 2)
        assert got[0][0].as_numpy("OUT").tolist() == [5]
        assert "Failed to process the request(s) for model 'repeat_0_0', message: ValueError: boom" in str(got[1][1])
        stream.send("repeat", repeat_inputs([8]))
        assert stream.get()[0].as_numpy("OUT").tolist() == [8]
    finally:
        stream.close()


def test_interleaved_requests_on_one_stream(srv: ServerProcess) -> None:
    stream = SyncStream(srv)
    try:
        for i in range(4):
            stream.send("repeat", repeat_inputs(list(range(10 * i, 10 * i + 10))), request_id=str(i))
        by_id: dict[str, list[int]] = {}
        for r, err in read(stream, 40):
            assert err is None
            by_id.setdefault(r.get_response().id, []).append(int(r.as_numpy("OUT")[0]))
        assert by_id == {str(i): list(range(10 * i, 10 * i + 10)) for i in range(4)}
    finally:
        stream.close()


def test_decoupled_sequences_with_implicit_state(srv: ServerProcess) -> None:
    stream = SyncStream(srv)
    try:
        outs: dict[int, list[int]] = {1: [], 2: []}
        for k, (a, b) in enumerate([(1, 10), (2, 20), (3, 30)]):
            for sid, x in ((1, a), (2, b)):
                inp = grpcclient.InferInput("IN", [1, 1], "INT32")
                inp.set_data_from_numpy(np.array([[x]], np.int32))
                stream.send(
                    "acc", [inp], request_id=str(sid), sequence_id=sid, sequence_start=k == 0, sequence_end=k == 2
                )
            for r, err in read(stream, 4):
                assert err is None
                outs[int(r.get_response().id)].append(int(r.as_numpy("OUT")[0, 0]))
        assert outs == {1: [1, -1, 3, -3, 6, -6], 2: [10, -10, 30, -30, 60, -60]}
    finally:
        stream.close()


async def test_aio_stream(srv: ServerProcess) -> None:
    async with grpcaio.InferenceServerClient(srv.grpc_url) as client:
        done = asyncio.Event()

        async def requests() -> Any:
            yield {"model_name": "repeat", "inputs": repeat_inputs([7, 8], cls=grpcaio), "request_id": "a"}
            await done.wait()  # keep the request side open until the replies are in

        got = []
        async for result, err in client.stream_infer(requests()):
            assert err is None
            got.append(int(result.as_numpy("OUT")[0]))
            if len(got) == 2:
                done.set()
                break
        assert got == [7, 8]


def test_unary_infer_is_refused(srv: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(srv.grpc_url) as g:
        with pytest.raises(InferenceServerException) as e:
            g.infer("repeat", repeat_inputs([1]))
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert e.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    with httpclient.InferenceServerClient(srv.http_url) as h:
        with pytest.raises(InferenceServerException) as e:
            h.infer("repeat", repeat_inputs([1], cls=httpclient))
        assert e.value.status() == "501"
        assert e.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
        # the config says so, for clients that pick the call by it
        assert h.get_model_config("repeat")["model_transaction_policy"] == {"decoupled": True}


def test_demo_streaming_sum(server: ServerProcess) -> None:
    """The demo repository's decoupled sequence model, as the README shows it."""
    stream = SyncStream(server)
    try:
        partials: list[list[int]] = []
        for k, chunk in enumerate([[1, 2, 3], [], [10, 20]]):
            inp = grpcclient.InferInput("CHUNK", [len(chunk)], "INT32")
            inp.set_data_from_numpy(np.array(chunk, np.int32))
            stream.send(
                "streaming_sum",
                [inp],
                sequence_id="demo-stream",
                sequence_start=k == 0,
                sequence_end=k == 2,
                enable_empty_final_response=True,
            )
            got = []
            while True:
                result, err = stream.get()
                assert err is None
                if result.get_response().outputs:
                    got.append(int(result.as_numpy("PARTIAL")[0]))
                    assert "TOTAL_OUT" not in [o.name for o in result.get_response().outputs]
                if final_flag(result):
                    break
            partials.append(got)
        assert partials == [[1, 3, 6], [], [16, 36]]
    finally:
        stream.close()


def test_triton_grpc_error_header_ends_the_stream(srv: ServerProcess) -> None:
    """With `triton_grpc_error: true` the first error closes the stream with its status."""
    import queue

    client = grpcclient.InferenceServerClient(srv.grpc_url)
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)), headers={"triton_grpc_error": "true"})
    try:
        client.async_stream_infer("repeat", repeat_inputs([1, -1, 3]))
        first, err = got.get(timeout=10)
        assert err is None and first.as_numpy("OUT").tolist() == [1]
        _, err = got.get(timeout=10)
        assert err is not None and err.status() == "StatusCode.INTERNAL"
        assert "negative value at 1" in err.message()
        with pytest.raises(queue.Empty):  # nothing after the error: the stream is closed
            got.get(timeout=0.5)
    finally:
        client.stop_stream()
        client.close()


def test_cancelled_stream_cancels_its_requests(srv: ServerProcess) -> None:
    """stop_stream(cancel_requests=True): the model sees is_cancelled() and stops."""
    import queue
    import time

    client = grpcclient.InferenceServerClient(srv.grpc_url)
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("uc", repeat_inputs([0]))
    for _ in range(3):
        assert got.get(timeout=10)[1] is None
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.monotonic() + 10
    while "until_cancelled: stopped after" not in srv.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    line = next(x for x in srv.log().splitlines() if "until_cancelled: stopped after" in x)
    assert line.endswith('cancelled=True"')  # Triton's log line: the message quoted


def test_error_responses_say_whether_they_are_final(srv: ServerProcess) -> None:
    """triton_final_response is on error responses too: false for an error the model sends
    mid-stream, true for the error that ends a request (its batch failed)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def request(values: list[int], rid: str) -> service_pb2.ModelInferRequest:
        r = service_pb2.ModelInferRequest(model_name="repeat", id=rid)
        r.inputs.add(name="IN", datatype="INT32", shape=[len(values)])
        r.inputs.add(name="MODE", datatype="INT32", shape=[1])
        r.raw_input_contents.extend([np.array(values, np.int32).tobytes(), np.array([1], np.int32).tobytes()])
        return r

    with grpc.insecure_channel(srv.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        replies = list(stub.ModelStreamInfer(iter([request([-1, 2], "a"), request([99], "b")]), timeout=20))
    flags = {
        (r.infer_response.id, r.error_message or "ok"): r.infer_response.parameters["triton_final_response"].bool_param
        for r in replies
    }
    assert flags == {
        ("a", "negative value at 0"): False,
        ("a", "ok"): True,
        ("b", "ok"): False,
        (
            "b",
            "Failed to process the request(s) for model 'repeat_0_0', message: ValueError: boom (request id b)",
        ): True,
    }


def test_stream_reply_order(srv: ServerProcess) -> None:
    """As in Triton: replies to non-decoupled requests and refusals keep the stream's request
    order (a fast refusal waits for a slow model's reply); decoupled responses go out at once."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    slow = service_pb2.ModelInferRequest(model_name="slow", id="slow")
    slow.inputs.add(name="IN", datatype="INT32", shape=[1])
    slow.raw_input_contents.append(np.array([7], np.int32).tobytes())
    unknown = service_pb2.ModelInferRequest(model_name="no_such_model", id="unknown")
    streamed = service_pb2.ModelInferRequest(model_name="repeat", id="decoupled")
    streamed.inputs.add(name="IN", datatype="INT32", shape=[1])
    streamed.inputs.add(name="MODE", datatype="INT32", shape=[1])
    streamed.raw_input_contents.extend([np.array([5], np.int32).tobytes(), np.array([1], np.int32).tobytes()])
    with grpc.insecure_channel(srv.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        stream = stub.ModelStreamInfer(iter([slow, unknown, streamed]), timeout=60)
        replies = [next(stream)]  # while the slow model waits
        (srv.repo / "slow" / "1" / "release").touch()
        replies += list(stream)
    assert [r.infer_response.id for r in replies] == ["decoupled", "slow", "unknown"]
    assert "no_such_model" in replies[2].error_message
