"""gRPC floor without grpcio: gRPC over HTTP/2 with the ``h2`` library on the event loop.

    python bench/floors/grpc_h2.py PORT [--host 127.0.0.1]

An ``asyncio.Protocol`` on uvloop per connection, ``h2`` for HTTP/2 (frames, HPACK, flow
control), and the least of gRPC on top: a unary rpc's length-prefixed message in, the reply
message, ``grpc-status: 0`` in the trailers. ModelInfer echoes the first input as the other
floors do; the readiness and metadata rpcs answer from ``grpc_stream.FloorServicer``; anything
else (streams included) answers UNIMPLEMENTED. It serves the bench's gRPC unary runs and nothing
more: no TLS, no compression, no deadlines, no limits. It measures what a gRPC front-end on the
event loop without grpcio's per-call machinery would cost ("gRPC unary: the floors of each way to
serve it" in bench/docs/front-ends.md).
"""

from __future__ import annotations

import asyncio
import struct
import sys
from typing import Any

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from bench.floors import common
from bench.floors.grpc_stream import FloorServicer, reply
from seqserve._proto import grpc_service_pb2 as pb

_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_OK = [(b"grpc-status", b"0")]
_UNIMPLEMENTED = [(b"grpc-status", b"12"), (b"grpc-message", b"not served by the h2 floor")]
_FLOOR = FloorServicer()
_SERVED = {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata"}


def _answer(method: str, body: bytes) -> bytes | None:
    """The reply message of a unary rpc, None when the floor does not serve it."""
    if method == "ModelInfer":
        return reply(pb.ModelInferRequest.FromString(body)).SerializeToString()
    if method not in _SERVED:
        return None
    request = getattr(pb, method + "Request").FromString(body)
    return bytes(common.result_of(getattr(_FLOOR, method)(request, None)).SerializeToString())


class GrpcH2Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.paths: dict[int, bytes] = {}
        self.bodies: dict[int, bytearray] = {}
        self.transport: Any = None  # uvloop's TCPTransport is no asyncio.Transport subclass

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.conn.initiate_connection()
        self.transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        try:
            events = conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.transport.write(conn.data_to_send())
            self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self.paths[ev.stream_id] = dict(ev.headers).get(b":path", b"")
                self.bodies[ev.stream_id] = bytearray()
            elif isinstance(ev, h2.events.DataReceived):
                self.bodies[ev.stream_id] += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self._respond(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.paths.pop(ev.stream_id, None)
                self.bodies.pop(ev.stream_id, None)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                self.transport.close()
        out = conn.data_to_send()
        if out:
            self.transport.write(out)

    def _respond(self, stream_id: int) -> None:
        path = self.paths.pop(stream_id, b"")
        body = bytes(self.bodies.pop(stream_id, b""))
        answer = _answer(path.rsplit(b"/", 1)[-1].decode("ascii", "replace"), body[5:])
        self.conn.send_headers(stream_id, _HEADERS)
        if answer is None:
            self.conn.send_headers(stream_id, _UNIMPLEMENTED, end_stream=True)
            return
        self.conn.send_data(stream_id, struct.pack(">BI", 0, len(answer)) + answer)
        self.conn.send_headers(stream_id, _OK, end_stream=True)


async def serve(host: str, port: int) -> None:
    await common.serve_protocol(GrpcH2Protocol, host, port)


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("grpc_h2.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
