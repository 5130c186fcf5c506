"""RPCs seqserve does not implement answer UNIMPLEMENTED with a message that says why."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.process import ServerProcess


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        ("get_log_settings", "does not implement this extension"),
        ("get_trace_settings", "does not implement this extension"),
    ],
)
def test_grpc_extension_rpcs_are_unimplemented(server: ServerProcess, call: str, fragment: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as ei:
        getattr(client, call)()
    assert ei.value.status() == "StatusCode.UNIMPLEMENTED"
    assert fragment in ei.value.message()
    assert client.is_server_live()  # the server is unaffected
