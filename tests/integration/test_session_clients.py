"""Session tombstones per client, against a real server on loopback: a client on 127.0.0.2 that
ends far more sessions than its share evicts only its own tombstones (its old sessions still
answer 410), never another client's (127.0.0.3: its ended sessions keep their exact 410, its new
sessions start); a client whose evictions fill its share of the filter gets its new sessions
refused with 503 and Retry-After, and the other client does not."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest

from seqserve.api.transport import h2_frames as f
from tests.support.clients import new_str_id
from tests.support.fleet import Replica, Reply
from tests.support.h2_peer import HELLO, LivePeer, grpc_message, headers_frame, stream_done
from tests.support.process import ServerProcess
from tests.support.wire import acc_request

FLOODER = "127.0.0.2"
OTHER = "127.0.0.3"
ENDED = "was ended by its END request"


def step(srv: ServerProcess, source: str, session: str, *, end: bool = False) -> tuple[Reply, str | None]:
    """One accumulator session step over a new connection from `source`: the reply and its
    Retry-After header."""
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
    headers = {"Content-Type": "application/json", "Inference-Session-Id": session}
    if end:
        headers["Inference-Session-End"] = "true"
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=20, source_address=(source, 0))
    try:
        conn.request("POST", "/v2/models/accumulator/infer", json.dumps(body).encode(), headers)
        r = conn.getresponse()
        doc = json.loads(r.read() or b"null")
        retry_after = r.getheader("Retry-After")
    finally:
        conn.close()
    if r.status == 200:
        return Reply(200, float(doc["outputs"][0]["data"][0])), retry_after
    return Reply(r.status, error=str(doc.get("error") if isinstance(doc, dict) else doc)), retry_after


def end_sessions(srv: ServerProcess, source: str, n: int) -> list[str]:
    ids = [new_str_id() for _ in range(n)]
    for s in ids:
        reply, _ = step(srv, source, s, end=True)
        assert reply.value == 1.0, (source, s, reply)
    return ids


def metric(srv: ServerProcess, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", srv.metrics_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.parametrize("http_server", ["builtin", "granian"])
def test_a_flooding_client_evicts_only_its_own_tombstones(
    launch: Callable[..., ServerProcess], http_server: str
) -> None:
    if http_server == "granian":
        pytest.importorskip("granian")
    srv = launch(
        None,
        "--http-server",
        http_server,
        "--session-tombstone-max",
        "40",
        "--session-tombstone-max-per-client",
        "10",
    )
    others = end_sessions(srv, OTHER, 5)
    flooded = end_sessions(srv, FLOODER, 120)
    for s in others:  # exact tombstones: the flood pushed none of them out
        reply, _ = step(srv, OTHER, s)
        assert reply.status == 410 and ENDED in reply.error, (s, reply)
    for s in flooded:  # the flooder's own: evicted or not, 410, never a fresh start
        reply, _ = step(srv, FLOODER, s)
        assert reply.status == 410, (s, reply)
    reply, _ = step(srv, OTHER, new_str_id())
    assert reply.value == 1.0, reply  # the other client's new sessions start
    assert metric(srv, "seqserve_session_tombstones_evicted_client_cap_total") == 110
    assert metric(srv, "seqserve_session_tombstones_evicted_global_cap_total") == 0
    assert metric(srv, "seqserve_session_starts_refused_total") == 0


def test_a_client_that_fills_its_filter_share_is_refused_alone(launch: Callable[..., ServerProcess]) -> None:
    # one tombstone of 100,000 per client: a share of 5 of the filter's 524,288 ids
    srv = launch(None, "--session-tombstone-max", "100000", "--session-tombstone-max-per-client", "1")
    others = end_sessions(srv, OTHER, 2)
    flooded = end_sessions(srv, FLOODER, 6)  # 5 evicted: the share is full
    reply, retry_after = step(srv, FLOODER, new_str_id())
    assert reply.status == 503 and "--session-tombstone-max-per-client" in reply.error, reply
    assert retry_after is not None and int(retry_after) > 0
    for s in flooded:  # its old sessions are still gone (410), not refused for now (503)
        reply, _ = step(srv, FLOODER, s)
        assert reply.status == 410, (s, reply)
    reply, _ = step(srv, OTHER, new_str_id())
    assert reply.value == 1.0, reply  # the other client is not refused
    reply, _ = step(srv, OTHER, others[-1])
    assert reply.status == 410 and ENDED in reply.error, reply  # and its newest tombstone is exact
    assert metric(srv, "seqserve_session_starts_refused_total") == 1


class GrpcClient:
    """Raw ModelInfer calls on one HTTP/2 connection from `source` (grpcio's client cannot choose
    its source address)."""

    def __init__(self, srv: ServerProcess, source: str) -> None:
        self.peer = LivePeer(srv.grpc_port, source=source)
        self.peer.send(HELLO)
        self.sid = -1

    def call(self, session: str, *, end: bool = False) -> tuple[str, str]:
        """(grpc-status, grpc-message) of one session step."""
        self.sid += 2
        fields = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                  (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
                  ("inference-session-id", session)]  # fmt: skip
        if end:
            fields.append(("inference-session-end", "true"))
        self.peer.send(headers_frame(self.peer.encoder.block(fields), self.sid))
        self.peer.send(f.frame(f.DATA, f.END_STREAM, self.sid, grpc_message(acc_request().SerializeToString())))
        trailers = self.peer.read_until(lambda r: stream_done(r, self.sid)).trailers(self.sid)
        return trailers.get("grpc-status", "?"), unquote(trailers.get("grpc-message", ""))

    def close(self) -> None:
        self.peer.close()


@pytest.mark.parametrize("grpc_server", ["builtin", "grpcio"])
def test_grpc_clients_are_told_apart(launch: Callable[..., ServerProcess], grpc_server: str) -> None:
    srv = launch(
        None,
        "--grpc-server",
        grpc_server,
        "--session-tombstone-max",
        "40",
        "--session-tombstone-max-per-client",
        "10",
    )
    flooder, other = GrpcClient(srv, FLOODER), GrpcClient(srv, OTHER)
    try:
        others = [new_str_id() for _ in range(3)]
        for s in others:
            assert other.call(s, end=True)[0] == "0"
        flooded = [new_str_id() for _ in range(30)]
        for s in flooded:
            assert flooder.call(s, end=True)[0] == "0"
        for s in others:  # NOT_FOUND with the exact reason: not one of them was evicted
            status, message = other.call(s)
            assert status == "5" and ENDED in message, (status, message)
        for s in flooded:
            assert flooder.call(s)[0] == "5"
    finally:
        flooder.close()
        other.close()
    assert metric(srv, "seqserve_session_tombstones_evicted_client_cap_total") == 20


def test_with_a_state_store(redis_url: str, tmp_path: Path) -> None:
    """Tombstones live in the store (any replica answers 410); the accounting per client is each
    replica's own, and its refusal leaves nothing behind in the store."""
    flags = ("--session-tombstone-max", "100000", "--session-tombstone-max-per-client", "1")
    a = Replica(redis_url, "clients-A", tmp_path, *flags)
    b = Replica(redis_url, "clients-B", tmp_path, *flags)
    try:
        others = end_sessions(a.srv, OTHER, 2)
        flooded = end_sessions(a.srv, FLOODER, 6)  # 5 evicted on A: its share is full there
        refused = new_str_id()
        reply, retry_after = step(a.srv, FLOODER, refused)
        assert reply.status == 503 and retry_after is not None, reply
        for s in flooded + others:  # every ended session is 410 on both replicas
            for srv in (a.srv, b.srv):
                reply, _ = step(srv, FLOODER, s)
                assert reply.status == 410, (s, reply)
        reply, _ = step(a.srv, OTHER, refused)  # the refused start left no entry behind
        assert reply.value == 1.0, reply
        reply, _ = step(b.srv, FLOODER, new_str_id())  # B counts its own clients
        assert reply.value == 1.0, reply
    finally:
        assert a.drain() == 0 and b.drain() == 0
