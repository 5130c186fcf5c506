"""Triton's --grpc-max-connection-age and -grace on the builtin gRPC server: a connection older
than the age gets a GOAWAY (NO_ERROR, debug data "max_age"); the call open on it is answered
within the grace, and the connection then closes; the client's next call goes to a new one."""

from __future__ import annotations

import time

import grpc
import pytest

from seqserve.api.transport import h2_frames as f
from tests.support.h2_peer import HELLO, LivePeer, grpc_message, headers_frame
from tests.support.paths import DEMO_REPO
from tests.support.process import serving

LIVE = "/inference.GRPCInferenceService/ServerLive"
FIELDS = [(":method", "POST"), (":scheme", "http"), (":path", LIVE), (":authority", "x"),
          ("content-type", "application/grpc"), ("te", "trailers")]  # fmt: skip


@pytest.mark.timeout(180)
def test_an_old_connection_gets_a_goaway_and_closes(tmp_path) -> None:
    with serving(DEMO_REPO, "--grpc-max-connection-age=1000", "--grpc-max-connection-age-grace=1000",
                 log_dir=tmp_path) as srv:  # fmt: skip
        peer = LivePeer(srv.grpc_port, timeout=20)
        try:
            peer.send(HELLO)
            # a call left open (no END_STREAM): the GOAWAY comes while it is in flight
            peer.send(headers_frame(peer.encoder.block(FIELDS), 1))
            started = time.monotonic()
            reader = peer.read_until(lambda r: r.goaway() is not None)
            assert reader.goaway() == f.NO_ERROR
            assert time.monotonic() - started >= 0.9  # not before the age
            # the grace is over: the call is cancelled and the connection closes
            assert peer.read_until(lambda r: r.rst(1) is not None).rst(1) == f.CANCEL
        finally:
            peer.close()
        with grpc.insecure_channel(srv.grpc_url) as channel:  # a new connection serves as usual
            live = channel.unary_unary(LIVE)
            assert live(grpc_message(b"")[5:], timeout=30) is not None
