"""The interop tests' server and requests (tests/interop): one `seqserve serve` with its default
builtin front-ends on a repository that every independent client shares, and KServe protobuf
requests built with the project's generated classes, framed for clients that send raw bodies
(h2load, nghttp, curl)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from seqserve._proto import grpc_service_pb2 as pb
from tests.support.models import copy_demo_models, copy_model
from tests.support.process import ServerProcess, serving

SERVICE = "inference.GRPCInferenceService"
# Room for the 32 MiB messages of the grpcio tests (request and reply), with their framing.
MAX_MESSAGE_BYTES = 64 << 20
INTEROP_FLAGS = (
    "--grpc-max-receive-message-bytes",
    str(MAX_MESSAGE_BYTES),
    "--grpc-max-send-message-bytes",
    str(MAX_MESSAGE_BYTES),
)
# gRPC's content type and the te header that every gRPC request carries (clients that are not
# gRPC libraries have to be told).
GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")


def interop_repo(path: Path) -> Path:
    """accumulator (a running sum with implicit state), add_sub (stateless), echo_bytes (BYTES
    in, the same out: large messages) and until_cancelled as `uc` (streams until the client
    goes: cancellation and deadlines)."""
    repo = copy_demo_models(path, "accumulator", "add_sub")
    copy_model(repo, "echo_bytes")
    copy_model(repo, "until_cancelled", "uc")
    return repo


@contextmanager
def interop_server(workdir: Path) -> Iterator[ServerProcess]:
    """`seqserve serve` with its default (builtin) HTTP/1.1 and HTTP/2 gRPC servers."""
    with serving(interop_repo(workdir / "models"), *INTEROP_FLAGS, log_dir=workdir) as srv:
        yield srv


def method_path(method: str) -> str:
    return f"/{SERVICE}/{method}"


def grpc_frame(message: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message: the compressed flag, a 4-byte big-endian length, the bytes."""
    return struct.pack(">BI", int(compressed), len(message)) + message


def grpc_messages(body: bytes) -> list[bytes]:
    """The messages of an uncompressed gRPC body (a reply read off the wire)."""
    out = []
    while body:
        flag, length = struct.unpack(">BI", body[:5])
        assert flag == 0, "a compressed message where none was asked for"
        assert len(body) >= 5 + length, f"a message of {length} bytes cut short at {len(body) - 5}"
        out.append(body[5 : 5 + length])
        body = body[5 + length :]
    return out


def add_sub_request(a: list[float], b: list[float]) -> pb.ModelInferRequest:
    """add_sub's request: INPUT0 = a, INPUT1 = b (FP32 [1, 4])."""
    req = pb.ModelInferRequest(model_name="add_sub")
    for name, values in (("INPUT0", a), ("INPUT1", b)):
        req.inputs.add(name=name, datatype="FP32", shape=[1, 4])
        req.raw_input_contents.append(np.asarray(values, np.float32).tobytes())
    return req


def step_request(
    seq_id: int, value: float, *, start: bool = False, end: bool = False, model: str = "accumulator"
) -> pb.ModelInferRequest:
    """One step of a running-sum sequence, named Triton's way (sequence_id, start, end)."""
    req = pb.ModelInferRequest(model_name=model)
    req.parameters["sequence_id"].int64_param = seq_id
    req.parameters["sequence_start"].bool_param = start
    req.parameters["sequence_end"].bool_param = end
    req.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
    req.raw_input_contents.append(np.float32(value).tobytes())
    return req


def bytes_request(payload: bytes) -> pb.ModelInferRequest:
    """echo_bytes' request: one BYTES element (a 4-byte little-endian length, then the bytes)."""
    req = pb.ModelInferRequest(model_name="echo_bytes")
    req.inputs.add(name="IN", datatype="BYTES", shape=[1, 1])
    req.raw_input_contents.append(struct.pack("<I", len(payload)) + payload)
    return req


def until_cancelled_request() -> pb.ModelInferRequest:
    """`uc`'s request: it streams replies every 5 ms until the client goes."""
    req = pb.ModelInferRequest(model_name="uc")
    req.inputs.add(name="IN", datatype="INT32", shape=[1])
    req.inputs.add(name="MODE", datatype="INT32", shape=[1])
    req.raw_input_contents.extend([np.int32(1).tobytes(), np.int32(0).tobytes()])
    return req


def first_output(resp: pb.ModelInferResponse, dtype: type[np.generic] = np.float32) -> list[float]:
    """The first raw output as a flat list."""
    assert resp.raw_output_contents, f"a reply without raw outputs: {resp}"
    return [float(x) for x in np.frombuffer(resp.raw_output_contents[0], dtype)]


def many_metadata(entries: int) -> list[tuple[str, str]]:
    """`entries` metadata entries of about 30 bytes each (61 toward the header list size of
    RFC 9113 §6.5.2): 120 of them are 4.5 KiB on the wire, under the advertised 16 KiB."""
    return [(f"x-interop-{i:03d}", "v" * 16) for i in range(entries)]


# A value over the header list size the server advertises (16 KiB) and under grpcio's own
# client limits: the call must end with RESOURCE_EXHAUSTED alone (issue 25, row 3).
LARGE_METADATA_BYTES = 30 << 10

UC_STOPPED = "until_cancelled: stopped after"


def uc_stops(srv: ServerProcess) -> list[str]:
    """The lines `uc` logged when a request of it ended (how many replies, whether cancelled)."""
    return [line for line in srv.log().splitlines() if UC_STOPPED in line]
