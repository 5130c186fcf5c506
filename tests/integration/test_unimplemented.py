"""What seqserve does not serve says so: an rpc outside Triton's service is UNIMPLEMENTED, and
the server is unaffected. (`generate`, which answered 501 before, is served: test_generate.py.)"""

from __future__ import annotations

import grpc
import pytest

from tests.support.process import ServerProcess


def test_an_rpc_outside_the_service_is_unimplemented(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchRpc")
        with pytest.raises(grpc.RpcError) as ei:
            call(b"", timeout=30)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        assert live(b"", timeout=30) is not None
