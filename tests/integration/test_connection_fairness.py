"""Connections per client address (issue 24): one peer holding 1,024 idle sockets takes at most
its share (--http-max-connections-per-peer, --grpc-max-connections-per-peer), and another peer's
new connections are served. The hoarding peer binds 127.0.0.2 (Linux loopback answers all of
127/8); the other clients connect from 127.0.0.1."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import tritonclient.grpc as grpcclient

from tests.support.clients import acc_input, grpc_input, http_request, new_int_id
from tests.support.process import ServerProcess, under_workers

#: each worker process admits connections on its own
pytestmark = pytest.mark.skipif(
    under_workers(), reason="the connection caps apply per worker process (docs/architecture.md, Worker processes)"
)

HOARD = 1024
PER_PEER = 512  # the default of both flags
SEQ = {"sequence_start": True, "sequence_end": True}


@contextmanager
def hoard(port: int, n: int = HOARD, source: str = "127.0.0.2") -> Iterator[list[socket.socket]]:
    """``n`` idle connections to ``port`` from ``source``; closed when the block ends."""
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
            held.append(s)
        yield held
    finally:
        for s in held:
            s.close()


def refusals(srv: ServerProcess, protocol: str, reason: str) -> int:
    """seqserve_connections_refused_total for ``protocol`` and ``reason``, from /metrics."""
    with urllib.request.urlopen(srv.metrics_url, timeout=15) as r:
        text = r.read().decode()
    want = f'seqserve_connections_refused_total{{protocol="{protocol}",reason="{reason}"}} '
    for line in text.splitlines():
        if line.startswith(want):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no {want.strip()} in /metrics")


def wait_refused(srv: ServerProcess, protocol: str) -> None:
    """Until the server has refused the hoarder's connections past its share (it accepts them
    as its loop gets to them)."""
    deadline = time.monotonic() + 60
    while refusals(srv, protocol, "peer") < HOARD - PER_PEER:
        assert time.monotonic() < deadline, f"{refusals(srv, protocol, 'peer')} refused"
        time.sleep(0.1)


def http_step(srv: ServerProcess) -> int:
    doc = {"inputs": [acc_input(1.0)], "parameters": {"sequence_id": new_int_id(), **SEQ}}
    return http_request(srv, "POST", "/v2/models/accumulator/infer", doc, timeout=15).status


@pytest.mark.parametrize("http_server", ["builtin", "hypercorn"])
def test_one_peer_cannot_take_every_http_connection(launch: Callable[..., ServerProcess], http_server: str) -> None:
    srv = launch(None, "--http-server", http_server, "--http-header-timeout-secs", "60")
    with hoard(srv.http_port) as held:
        # The hoarder's connections past its share are answered 503 and closed.
        s = held[-1]
        s.settimeout(15)
        head, _, body = s.recv(65536).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), head
        assert "too many connections from one address" in json.loads(body)["error"]
        # Another client is served, on new connections, while the hoarder holds its share.
        assert [http_step(srv) for _ in range(5)] == [200] * 5
        wait_refused(srv, "http")
        assert refusals(srv, "http", "total") == 0


def test_one_peer_cannot_take_every_grpc_connection(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None)
    with hoard(srv.grpc_port):
        wait_refused(srv, "grpc")
        for _ in range(3):  # a new channel (connection) each time, from another address
            client = grpcclient.InferenceServerClient(srv.grpc_url)
            try:
                result = client.infer(
                    "accumulator", [grpc_input(2.0)], sequence_id=new_int_id(), sequence_start=True, sequence_end=True
                )
                assert float(result.as_numpy("OUTPUT")[0, 0]) == 2.0
            finally:
                client.close()
        assert refusals(srv, "grpc", "total") == 0


def test_per_peer_flags(launch: Callable[..., ServerProcess]) -> None:
    """--http-max-connections-per-peer 2: the third connection from one address gets 503; 0
    turns the per-address cap off (the total cap stays)."""
    srv = launch(None, "--http-max-connections-per-peer", "2")
    with hoard(srv.http_port, n=3) as held:
        held[2].settimeout(15)
        assert held[2].recv(65536).startswith(b"HTTP/1.1 503")
        held[0].settimeout(0.5)
        with pytest.raises(TimeoutError):  # admitted, waiting for its request
            held[0].recv(1)
    srv = launch(None, "--http-max-connections-per-peer", "0", "--http-max-connections", "700")
    with hoard(srv.http_port, n=600):  # past the default 512 per address
        assert http_step(srv) == 200
        assert refusals(srv, "http", "peer") == 0
