"""hypercorn (``--http-server hypercorn``) behind seqserve's own accept loop, for what its
settings lack and granian's have (granian's settings are passed in app.py): caps on
concurrent connections (in total and per peer address), the builtin server's request rules in
front of h11 (``http1_filter``: the request-smuggling shapes h11 would answer), and JSON bodies
on the errors its HTTP/1 parser answers by itself (a malformed request line, header or framing),
so that every non-200 a client gets is a
``{"error": "..."}`` document, as tritonclient expects.

Nothing of hypercorn is patched: the loop here accepts the connections, refuses those beyond
the cap, and hands each to hypercorn's own per-connection server (``TCPServer``, what
``hypercorn.asyncio.serve`` runs for each) with a reader that checks the requests and frees the
connection's slot when the client goes, and a writer that fills in the body of hypercorn's parser errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from seqserve.api.limits import ConnectionAdmission, peer_host
from seqserve.api.transport.http1_filter import RequestFilter
from seqserve.api.transport.listener import accept_queued

log = logging.getLogger("seqserve.http")

#: hypercorn's own refusals (h11's status hints), worded for the client
PARSE_ERRORS = {
    400: "malformed HTTP request (request line, headers or body framing)",
    414: "request target too long",
    431: "request head too large",
    501: "a Transfer-Encoding other than chunked is not supported",
}
#: at stop, how long new connections are still accepted (and answered 503) before the listener
#: closes, so that a request on its way is answered rather than reset (as the builtin server)
LAST_CALL_S = 0.25
#: how long a refused connection's writing side stays closed while what the client still sends
#: is read and dropped: a close with unread data would reset it, and could cost it the 503
LINGER_S = 2.0


async def serve_hypercorn(
    app: Any,
    cfg: Any,
    sock: Any,
    admission: ConnectionAdmission,
    shutdown_trigger: Callable[[], Awaitable[Any]],
) -> None:
    """Serve ASGI ``app`` with hypercorn Config ``cfg`` on listening socket ``sock`` until
    ``shutdown_trigger`` returns; then connections get ``cfg.graceful_timeout`` to finish.
    ``admission``: the connection caps (a connection beyond gets 503 and is closed)."""
    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.asyncio.worker_context import WorkerContext
    from hypercorn.utils import wrap_app

    loop = asyncio.get_running_loop()
    wrapped = wrap_app(app, cfg.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)
    tasks: set[asyncio.Task[Any]] = set()
    stopping = False

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        peer = peer_host(writer.get_extra_info("peername"))
        refused = admission.admit(peer, stopping=stopping)
        if refused is not None:
            await _refuse_connection(reader, writer, admission.refusal_message(refused))
            return
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                admission.release(peer)

        try:
            checks = RequestFilter()
            reader_in_front: Any = SlotReader(reader, release, checks)  # the parts of a stream hypercorn uses
            writer_in_front: Any = JsonErrorWriter(writer, checks)
            await TCPServer(wrapped, loop, cfg, context, {}, reader_in_front, writer_in_front)
        finally:
            release()

    ssl_context = cfg.create_ssl_context() if cfg.ssl_enabled else None
    server = await asyncio.start_server(
        connected,
        sock=sock,
        backlog=cfg.backlog,
        ssl=ssl_context,
        ssl_handshake_timeout=cfg.ssl_handshake_timeout if ssl_context is not None else None,
    )
    try:
        await shutdown_trigger()
    finally:
        # New connections get 503 for a moment, then those queued on the listener are accepted
        # (and get it) before it closes: closing it with connections queued would reset them.
        stopping = True
        await asyncio.sleep(LAST_CALL_S)
        await accept_queued(server)
        await context.terminated.set()
        server.close()
        await server.wait_closed()
        if tasks:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), cfg.graceful_timeout)


class SlotReader:
    """A connection's reader that frees its slot once the client is gone (end of stream or a
    read error): hypercorn keeps the connection's task until its idle timer fires. What it reads
    passes the builtin server's request rules first (``http1_filter``): a refused request reaches
    hypercorn as a request line it answers with 400, or as the end of the stream."""

    __slots__ = ("_filter", "_on_gone", "_reader")

    def __init__(self, reader: asyncio.StreamReader, on_gone: Callable[[], None], checks: RequestFilter) -> None:
        self._reader = reader
        self._on_gone = on_gone
        self._filter = checks

    def at_eof(self) -> bool:
        return self._reader.at_eof()

    async def read(self, n: int = -1) -> bytes:
        try:
            data = await self._reader.read(n)
        except BaseException:
            self._on_gone()
            raise
        if not data:
            self._on_gone()
            return data
        return self._filter.feed(data)  # empty once a request is refused: hypercorn sees the end


class JsonErrorWriter:
    """A connection's writer that gives hypercorn's own error replies (a parser refusal: a
    4xx head with ``content-length: 0`` and no content type) a JSON body. seqserve's routes
    never send such a head: each of their errors has a JSON body and its content type. The
    message is the request filter's where it refused the request."""

    __slots__ = ("_checks", "_writer")

    def __init__(self, writer: asyncio.StreamWriter, checks: RequestFilter) -> None:
        self._writer = writer
        self._checks = checks

    def write(self, data: bytes) -> None:
        if data.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5")):
            refusal = self._checks.refusal
            data = json_error(data, None if refusal is None else refusal.message)
        self._writer.write(data)

    def __getattr__(self, name: str) -> Any:  # drain, close, get_extra_info, ...: the writer's
        return getattr(self._writer, name)


def json_error(head: bytes, refusal: str | None = None) -> bytes:
    """``head`` with a JSON body when it is hypercorn's own error reply (its message ``refusal``
    when given); else ``head``."""
    status = head[9:12]
    message = PARSE_ERRORS.get(int(status)) if status.isdigit() else None
    if message is None or not head.endswith(b"\r\n\r\n"):
        return head
    lines = head[:-4].split(b"\r\n")
    names = [line.split(b":", 1)[0].strip().lower() for line in lines[1:]]
    if b"content-type" in names or b"content-length: 0" not in (line.lower() for line in lines[1:]):
        return head
    body = orjson.dumps({"error": refusal or message})
    kept = [line for line in lines[1:] if not line.lower().startswith(b"content-length:")]
    out = [lines[0], b"content-type: application/json", b"content-length: %d" % len(body), *kept]
    return b"\r\n".join(out) + b"\r\n\r\n" + body


async def _drop_until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


async def _refuse_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: str) -> None:
    body = orjson.dumps({"error": message})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(Exception):
        writer.write(head + body)
        await asyncio.wait_for(writer.drain(), 5.0)
    with contextlib.suppress(Exception):  # read and drop the request, until the client closes
        if writer.can_write_eof():
            writer.write_eof()
            await asyncio.wait_for(_drop_until_eof(reader), LINGER_S)
    with contextlib.suppress(Exception):
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 5.0)
