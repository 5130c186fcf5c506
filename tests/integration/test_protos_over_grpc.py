"""Our generated protobuf modules over a real gRPC channel: tritonclient's client against a
servicer built from them (the socket-free comparisons are in tests/unit/test_protos.py)."""

from __future__ import annotations

import queue
from concurrent import futures

import grpc
import numpy as np
import pytest

from seqserve._proto import grpc_service_pb2, grpc_service_pb2_grpc


class _Servicer(grpc_service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[grpc_service_pb2.ModelInferRequest] = []

    def ServerLive(self, request, context):
        return grpc_service_pb2.ServerLiveResponse(live=True)

    def _respond(self, request):
        self.requests.append(request)
        resp = grpc_service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            resp.outputs.add(name="OUT_" + tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            resp.raw_output_contents.append(raw)
        return resp

    def ModelInfer(self, request, context):
        return self._respond(request)

    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            if request.model_name != "echo":
                failed = grpc_service_pb2.ModelStreamInferResponse(error_message="unknown model")
                failed.infer_response.id = request.id
                yield failed
                continue
            resp = self._respond(request)
            resp.parameters["triton_final_response"].bool_param = True
            yield grpc_service_pb2.ModelStreamInferResponse(infer_response=resp)


@pytest.fixture
def grpc_endpoint():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = _Servicer()
    grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_tritonclient_over_grpc(grpc_endpoint):
    import tritonclient.grpc as grpcclient

    url, servicer = grpc_endpoint
    client = grpcclient.InferenceServerClient(url)
    try:
        assert client.is_server_live(client_timeout=10)

        data = np.array([[1, 2, 3]], dtype=np.int64)
        inp = grpcclient.InferInput("IN", list(data.shape), "INT64")
        inp.set_data_from_numpy(data)
        result = client.infer(
            "echo",
            [inp],
            request_id="r1",
            sequence_id=42,
            sequence_start=True,
            sequence_end=False,
            priority=3,
            timeout=1000,
            parameters={"flag": True, "n": 5, "s": "x", "f": 0.5},
            client_timeout=10,
        )
        np.testing.assert_array_equal(result.as_numpy("OUT_IN"), data)
        assert result.get_response().id == "r1"

        (req,) = servicer.requests
        kinds = {
            key: (p.WhichOneof("parameter_choice"), getattr(p, p.WhichOneof("parameter_choice")))
            for key, p in req.parameters.items()
        }
        assert kinds == {
            "sequence_id": ("int64_param", 42),
            "sequence_start": ("bool_param", True),
            "sequence_end": ("bool_param", False),
            "priority": ("uint64_param", 3),
            "timeout": ("int64_param", 1000),
            "flag": ("bool_param", True),
            "n": ("int64_param", 5),
            "s": ("string_param", "x"),
            "f": ("double_param", 0.5),
        }

        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            client.async_stream_infer("missing", [inp], request_id="bad")
            client.async_stream_infer("echo", [inp], request_id="good")
            _, error = results.get(timeout=10)
            assert error is not None and "unknown model" in error.message()
            result, error = results.get(timeout=10)
            assert error is None
            assert result.get_response().id == "good"
            np.testing.assert_array_equal(result.as_numpy("OUT_IN"), data)
        finally:
            client.stop_stream()
    finally:
        client.close()
