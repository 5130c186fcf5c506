"""seqserve's own gRPC server (``--grpc-server builtin``, the default): gRPC over the sans-IO
HTTP/2 core on the event loop, serving a method table (``Method`` by path) that
``api/grpc/methods.py`` builds from the servicers.

Why a server of our own: grpc.aio runs HTTP/2 on grpc core's threads and hands every call to
the loop and its reply back, with Python objects and a completion-queue round trip per call; a
unary call cost more there than all of Triton's server (bench/docs/front-ends.md, "gRPC: the
builtin server"). Here a call costs one ``data_received`` on the loop's own thread, a task for the
handler and one ``write`` for its reply. The connection limits are grpc.aio's: idle GOAWAY,
keepalive pings, concurrent streams, and caps on connections, in total and per peer address
(``ConnectionAdmission``; a connection beyond gets a GOAWAY ENHANCE_YOUR_CALM and is closed).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from seqserve.api.limits import ConnectionAdmission, GrpcLimits
from seqserve.api.transport.grpc_calls import MAX_HEADER_LIST_BYTES, PREFACE_TIMEOUT_S, GrpcConnection
from seqserve.api.transport.grpc_context import Method
from seqserve.api.transport.h2_frames import CANCEL, NO_ERROR
from seqserve.api.transport.h2_protocol import H2Protocol
from seqserve.api.transport.read_gate import ReadGate


class BuiltinGrpcServer:
    """Serves ``methods`` (path → Method) on a listening socket; ``stop`` as grpc.aio's."""

    def __init__(
        self,
        methods: dict[bytes, Method],
        limits: GrpcLimits,
        *,
        ssl_context: ssl.SSLContext | None = None,
        admission: ConnectionAdmission | None = None,
        read_gate: ReadGate | None = None,
    ) -> None:
        """``admission``: the connection caps (one of ``limits``' caps when None), given to
        share its counts with the metrics; ``read_gate``: a worker process's (see read_gate.py)."""
        self.methods = methods
        self.limits = limits
        self.admission = admission or ConnectionAdmission(limits.max_connections, limits.max_connections_per_peer)
        self.ssl_context = ssl_context
        self.read_gate = read_gate
        self.connections: set[GrpcConnection] = set()
        self.stopping = False
        self._listener: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._ping = 0

    def _protocol(self) -> H2Protocol:
        return H2Protocol(
            lambda protocol: GrpcConnection(self, protocol),
            max_concurrent_streams=self.limits.max_concurrent_streams,
            max_header_list_bytes=MAX_HEADER_LIST_BYTES,
            read_gate=self.read_gate,
        )

    async def start(self, sock: Any) -> None:
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(
            self._protocol,
            sock=sock,
            ssl=self.ssl_context,
            backlog=1024,
            ssl_handshake_timeout=PREFACE_TIMEOUT_S if self.ssl_context is not None else None,
        )
        self._sweeper = loop.call_later(1.0, self._sweep)

    async def stop(self, grace: float | None) -> None:
        """Stop accepting; GOAWAY to every connection; the calls in flight get ``grace`` seconds
        (None: none) to finish, then are cancelled and the connections closed."""
        self.stopping = True
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            if conn.h2.streams:
                conn.h2.send_goaway()
            else:
                conn.protocol.close(NO_ERROR)
        if grace:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + grace
            while any(c.h2.streams for c in self.connections) and loop.time() < deadline:
                await asyncio.sleep(0.02)
        for conn in list(self.connections):
            for s in list(conn.h2.streams.values()):
                conn.reset(s, CANCEL)
            conn.protocol.close(NO_ERROR)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.0
        while self.connections and loop.time() < deadline:  # what is left to write goes out
            await asyncio.sleep(0.02)
        for conn in list(self.connections):  # a client that reads nothing
            conn.protocol.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._listener is not None:
            await self._listener.wait_closed()
        # let the cancelled handlers unwind
        await asyncio.sleep(0)

    def _sweep(self) -> None:
        """Once a second: connections that never sent their preface, idle ones (a GOAWAY, as
        grpc's max_connection_idle), keepalive pings and their timeout, and clients that read
        nothing of what they are sent."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        limits = self.limits
        for conn in list(self.connections):
            h2 = conn.h2
            if h2.closed or conn.protocol.held_by_gate:  # unread by us: no timer is the client's fault
                continue
            if conn.expired(now, limits.keepalive_timeout_s):
                conn.protocol.abort()
                continue
            conn.end_stalled(now)
            if limits.max_connection_age_s > 0 and self._aged(conn, now):
                continue
            if (
                limits.max_connection_idle_s > 0
                and h2.idle_since is not None
                and not h2.streams
                and now - h2.idle_since > limits.max_connection_idle_s
            ):
                conn.protocol.close(NO_ERROR, "max_idle")
            elif conn.ping_sent is None and now - h2.last_active > limits.keepalive_s:
                self._ping += 1
                conn.ping_sent = now
                h2.ping(self._ping.to_bytes(8, "big"))
        self._sweeper = loop.call_later(1.0, self._sweep)

    def _aged(self, conn: GrpcConnection, now: float) -> bool:
        """gRPC's max_connection_age: past it, a GOAWAY (the calls in flight go on, new ones go
        to a new connection); once they are done, or the grace is over, the connection closes.
        True when the connection is on its way out."""
        limits = self.limits
        if conn.aged_at is None:
            if now - conn.opened_at <= limits.max_connection_age_s:
                return False
            conn.aged_at = now
            conn.h2.send_goaway(NO_ERROR, "max_age")
        grace = limits.max_connection_age_grace_s
        if not conn.h2.streams or (grace is not None and now - conn.aged_at >= grace):
            for s in list(conn.h2.streams.values()):
                conn.reset(s, CANCEL)
            conn.protocol.close(NO_ERROR, "max_age")
        return True
