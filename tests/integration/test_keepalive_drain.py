"""SIGTERM under keep-alive HTTP load (issue 24): every request a client sent on a connection is
answered (200, or 503 with ``Connection: close`` once the server stops), never reset, and the
process exits 0. The clients reconnect at once after each ``Connection: close``, so that
connections are being opened, queued and read at every moment of the stop (before issue 24, each
run reset about one request per client: connections queued on the listener when it closed, and
idle ones closed with their request unread). Several runs, real processes."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from tests.support.clients import acc_input, new_int_id
from tests.support.process import ServerProcess

CLIENTS = 32
RUNS = 3
SEQ = {"sequence_start": True, "sequence_end": True}


@dataclass
class Outcomes:
    """What the load's requests got, by kind; ``lock`` guards them (one thread per client)."""

    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, detail: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if detail:
                self.failures.append(detail)


def keep_alive_client(port: int, stop: threading.Event, out: Outcomes) -> None:
    """Steps on one kept-alive connection after another until the server is gone: a new
    connection when a reply says ``Connection: close``. A connection refused is no request
    sent; a reset or an end without a reply after a request was sent is a failure."""
    body = json.dumps({"inputs": [acc_input(1.0)], "parameters": {"sequence_id": 0, **SEQ}})
    conn: http.client.HTTPConnection | None = None
    reused = False
    while not stop.is_set():
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.connect()
            except ConnectionRefusedError:
                out.add("refused at connect")
                conn = None
                time.sleep(0.05)
                continue
            reused = False
        doc = body.replace('"sequence_id": 0', f'"sequence_id": {new_int_id()}')
        where = "a kept-alive connection" if reused else "a new connection"
        try:
            conn.request("POST", "/v2/models/accumulator/infer", body=doc)
            reply = conn.getresponse()
            reply.read()
        except ConnectionResetError as e:
            out.add("reset", f"reset on {where}: {e!r}")
            conn.close()
            conn = None
            continue
        except (http.client.RemoteDisconnected, BrokenPipeError) as e:
            out.add("no reply", f"closed without a reply on {where}: {e!r}")
            conn.close()
            conn = None
            continue
        out.add(str(reply.status))
        if reply.will_close:
            conn.close()
            conn = None
        else:
            reused = True
    if conn is not None:
        conn.close()


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("http_server", ["builtin", "hypercorn"])
def test_sigterm_under_keep_alive_load_resets_no_request(
    launch: Callable[..., ServerProcess], http_server: str, run: int
) -> None:
    srv = launch(None, "--http-server", http_server, exit_timeout_s=5.0)
    stop, out = threading.Event(), Outcomes()
    threads = [threading.Thread(target=keep_alive_client, args=(srv.http_port, stop, out)) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while out.counts["200"] < 200:  # the load runs
            assert time.monotonic() < deadline, out.counts
            time.sleep(0.05)
        srv.terminate()
        assert srv.wait() == 0
        deadline = time.monotonic() + 10
        while out.counts["refused at connect"] < CLIENTS:  # every client has seen the server gone
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert out.counts["200"] >= 200
    assert not out.failures, f"{out.counts}: {out.failures[:5]}"
