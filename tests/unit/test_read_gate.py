"""The read gate (api/transport/read_gate.py) over the builtin servers' connections: closed, every
connection (and one accepted meanwhile) stops reading, whatever its own state; opened, each
reads again unless it has its own reason not to. A request sent while closed is answered once
the gate opens: delayed, never lost."""

from __future__ import annotations

import asyncio
import socket

from seqserve.api.limits import GrpcLimits, HttpLimits
from seqserve.api.transport.exchange import HttpReply, HttpRequest
from seqserve.api.transport.grpc_server import BuiltinGrpcServer
from seqserve.api.transport.http1_server import Http1Server
from seqserve.api.transport.read_gate import ReadGate

REQUEST = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # an ephemeral port
    sock.listen()
    return sock


async def _until(predicate: object, what: str) -> None:
    for _ in range(2000):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting until {what}")


async def _ok(request: HttpRequest) -> HttpReply:
    return HttpReply(200, [], b"ok")


def test_http1_connections_pause_while_the_gate_is_closed() -> None:
    async def run() -> None:
        gate = ReadGate()
        server = Http1Server(_ok, HttpLimits(), read_gate=gate)
        sock = _listening()
        await server.start(sock)
        serving = asyncio.create_task(server.serve())
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        await _until(lambda: gate.connections == 1, "the connection registers")
        gate.close()
        (conn,) = server.connections
        assert conn.held and not conn.reading and not conn.transport.is_reading()
        writer.write(REQUEST)
        _, late_writer = await asyncio.open_connection(*sock.getsockname())
        await _until(lambda: gate.connections == 2, "the late connection registers")
        assert all(not c.transport.is_reading() for c in server.connections)
        gate.open()
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        assert all(c.transport.is_reading() for c in server.connections)
        assert gate.closings == 1 and gate.closed_s > 0
        for w in (writer, late_writer):
            w.close()
        await _until(lambda: gate.connections == 0, "closed connections unregister")
        server.stop()
        await serving

    asyncio.run(run())


def test_grpc_connections_pause_while_the_gate_is_closed() -> None:
    async def run() -> None:
        gate = ReadGate()
        server = BuiltinGrpcServer({}, GrpcLimits(), read_gate=gate)
        sock = _listening()
        await server.start(sock)
        _, writer = await asyncio.open_connection(*sock.getsockname())
        await _until(lambda: gate.connections == 1, "the connection registers")
        (conn,) = server.connections
        gate.close()
        assert conn.protocol.held_by_gate and not conn.protocol.transport.is_reading()
        gate.open()
        assert not conn.protocol.held_by_gate and conn.protocol.transport.is_reading()
        writer.close()
        await _until(lambda: gate.connections == 0, "a closed connection unregisters")
        await server.stop(grace=None)

    asyncio.run(run())


def test_one_process_servers_have_no_gate() -> None:
    assert Http1Server(_ok, HttpLimits()).read_gate is None
    assert BuiltinGrpcServer({}, GrpcLimits()).read_gate is None
