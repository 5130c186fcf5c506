"""The HTTP/1.1 conformance cases marked ``live`` (cases.py) over loopback against a real
``seqserve serve`` (the builtin server), with raw sockets: the statuses, the Date header, and
whether the connection closes. The request-smuggling shapes and the cases marked ``hypercorn``
also against ``--http-server hypercorn``, whose requests pass seqserve's filter first: the
smuggled request is never answered and the connection closes on both servers."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.http1.cases import CASES, Case
from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, serving

READ_TIMEOUT_S = 15.0  # a reply that does not come within this fails the case, never hangs it
OPEN_PROBE_S = 0.5  # a connection that stays open this long after its replies is kept alive


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(DEMO_REPO, log_dir=tmp_path_factory.mktemp("http1-builtin")) as srv:
        yield srv


@pytest.fixture(scope="module")
def hypercorn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_dir: Path = tmp_path_factory.mktemp("http1-hypercorn")
    with serving(DEMO_REPO, "--http-server", "hypercorn", log_dir=log_dir) as srv:
        yield srv


def exchange(port: int, raw: bytes, replies: int, close: bool) -> tuple[list[tuple[int, dict[str, str], bytes]], bool]:
    """Send ``raw``; read ``replies`` replies (and on to the close when ``close``). Returns the
    replies and whether the server closed the connection."""
    got: list[tuple[int, dict[str, str], bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as sock:
        with contextlib.suppress(OSError):  # it answered early and closed: read what is there
            sock.sendall(raw)
        buf = b""
        closed = False
        while not closed and (close or len(got) < replies):
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            closed = not data
            buf += data
            while b"\r\n\r\n" in buf:
                head, _, rest = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                n = int(headers.get("content-length", "0"))
                if len(rest) < n:
                    break
                got.append((int(lines[0].split()[1]), headers, rest[:n]))
                buf = rest[n:]
        if not closed:
            sock.settimeout(OPEN_PROBE_S)
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                closed = False
            except ConnectionResetError:
                closed = True
    return got, closed


LIVE = [c for c in CASES if c.live or c.hypercorn]
HYPERCORN = [c for c in CASES if c.hypercorn]


@pytest.mark.parametrize("case", LIVE, ids=[c.id for c in LIVE])
def test_case_on_builtin(builtin: ServerProcess, case: Case) -> None:
    replies, closed = exchange(builtin.http_port, case.raw, len(case.statuses), case.close)
    statuses = [status for status, _, _ in replies]
    assert closed == case.close, statuses
    assert statuses == list(case.statuses), [(s, b[:100]) for s, _, b in replies]
    if case.message:
        assert case.message in json.loads(replies[-1][2])["error"]
    check_replies(replies)
    assert builtin.alive()


@pytest.mark.parametrize("case", HYPERCORN, ids=[c.id for c in HYPERCORN])
def test_case_on_hypercorn(hypercorn: ServerProcess, case: Case) -> None:
    replies, closed = exchange(hypercorn.http_port, case.raw, len(case.statuses), case.close)
    statuses = [status for status, _, _ in replies]
    assert closed == case.close, statuses
    if case.close:
        # h11 has statuses of its own for some refusals: what matters is that the refused request
        # (and anything smuggled after it) gets no answer but the refusal, and the connection ends
        assert statuses[:-1] == list(case.statuses[:-1]) and statuses[-1] >= 400, statuses
    else:
        assert statuses == list(case.statuses), [(s, b[:100]) for s, _, b in replies]
    check_replies(replies)
    assert hypercorn.alive()


def check_replies(replies: list[tuple[int, dict[str, str], bytes]]) -> None:
    for status, headers, body in replies:
        assert "date" in headers  # RFC 9110 §6.6.1
        if status >= 400:
            assert json.loads(body)["error"]


def test_http2_prior_knowledge_passes_hypercorn_filter(hypercorn: ServerProcess) -> None:
    """The request filter lets HTTP/2 through (RFC 9113 §3.3): the server's SETTINGS come back."""
    with socket.create_connection(("127.0.0.1", hypercorn.http_port), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        frame = b""
        while len(frame) < 9 and (data := sock.recv(9 - len(frame))):
            frame += data
    assert len(frame) == 9 and frame[3] == 4, frame  # a SETTINGS frame
