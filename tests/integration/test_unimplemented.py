"""What seqserve does not serve says so: `generate` answers 501 with a message (until the
pipelines issue builds it), and an rpc outside Triton's service is UNIMPLEMENTED; the server
is unaffected either way."""

from __future__ import annotations

import grpc
import pytest

from tests.support.clients import http_request
from tests.support.process import ServerProcess


@pytest.mark.parametrize("path", ["/v2/models/accumulator/generate", "/v2/models/accumulator/generate_stream"])
def test_generate_answers_501_with_a_message(server: ServerProcess, path: str) -> None:
    r = http_request(server, "POST", path, b"{}")
    assert r.status == 501 and "use /infer" in r.error(), (r.status, r.body)
    assert http_request(server, "GET", "/v2/health/live").status == 200


def test_an_rpc_outside_the_service_is_unimplemented(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")
        with pytest.raises(grpc.RpcError) as ei:
            call(b"", timeout=30)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        assert live(b"", timeout=30) is not None
