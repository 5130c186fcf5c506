"""What seqserve adds to hypercorn where it lacks a setting granian has (granian's settings
are passed in app.py): a cap on concurrent connections, and JSON bodies on the errors its
HTTP/1 parser answers by itself (a malformed request line, header or framing), so that every
non-200 a client gets is a ``{"error": "..."}`` document, as tritonclient expects.

Both hook hypercorn's internals (``hypercorn.asyncio.run.TCPServer``, ``H11Protocol``) as of
hypercorn 0.18; each checks that the hook point exists and leaves hypercorn as it is if not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson

log = logging.getLogger("seqserve.http")

#: hypercorn's own refusals (h11's status hints), worded for the client
_PARSE_ERRORS = {
    400: "malformed HTTP request (request line, headers or body framing)",
    413: "a chunk of the request body exceeds the server's body limit",
    414: "request target too long",
    431: "request head too large",
}


def harden_hypercorn(cfg: Any, max_connections: int, max_body_bytes: int) -> None:
    """Cap ``cfg``'s server at ``max_connections`` connections, give its parser's error
    replies JSON bodies, and refuse a chunk larger than ``max_body_bytes`` when its size line
    arrives (413) rather than waiting for it."""
    cfg.seqserve_connections = _ConnectionSlots(max_connections)
    _install_connection_cap()
    _install_json_errors()
    _install_chunk_limit(max_body_bytes)


def _install_chunk_limit(limit: int) -> None:
    """h11 reads a chunk size of any length: ``ffffffffffffffff`` would be read until the body
    timeout. Its chunked-body reader (process-wide, so the largest limit of the servers in the
    process applies) refuses a chunk over the limit as soon as it has parsed its size."""
    try:
        import h11
        from h11 import _readers
    except ImportError:
        return
    table = _readers.READERS.get(h11.SEND_BODY)  # type: ignore[call-overload]
    base = table.get("chunked") if isinstance(table, dict) else None
    if base is None:
        return
    if getattr(base, "seqserve_limit", None) is not None:
        base.seqserve_limit = max(base.seqserve_limit, limit)  # type: ignore[attr-defined]
        return

    class BoundedChunkedReader(base):  # type: ignore[misc, valid-type]
        seqserve_limit = limit

        def __call__(self, buf: Any) -> Any:
            event = super().__call__(buf)
            if self._bytes_in_chunk > self.seqserve_limit:
                raise h11.RemoteProtocolError("chunk larger than the body limit", error_status_hint=413)
            return event

    table["chunked"] = BoundedChunkedReader  # type: ignore[index]


class _ConnectionSlots:
    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


def _install_connection_cap() -> None:
    """hypercorn builds one ``TCPServer`` per accepted connection; the subclass installed here
    counts them against the limit stored on their config. A connection beyond the limit gets
    a 503 with a JSON error and is closed (granian instead leaves it in the listen backlog)."""
    try:
        import hypercorn.asyncio.run as hrun
    except ImportError:
        return
    base = getattr(hrun, "TCPServer", None)
    if base is None or getattr(base, "seqserve_capped", False):
        if base is None:
            log.warning("hypercorn has no TCPServer hook: --http-max-connections is not enforced")
        return

    class CappedTCPServer(base):  # type: ignore[misc, valid-type]
        seqserve_capped = True
        _seqserve_slots: _ConnectionSlots | None = None

        async def run(self) -> None:
            slots = getattr(self.config, "seqserve_connections", None)
            if slots is not None:
                if slots.used >= slots.limit:
                    await _refuse_connection(self.writer, slots.limit)
                    return
                slots.used += 1
                self._seqserve_slots = slots
            try:
                await super().run()
            finally:
                self._seqserve_release()

        async def _read_data(self) -> None:
            try:
                await super()._read_data()
            finally:  # the peer is gone: hypercorn keeps the task until its idle timer fires
                self._seqserve_release()

        def _seqserve_release(self) -> None:
            if self._seqserve_slots is not None:
                self._seqserve_slots.used -= 1
                self._seqserve_slots = None

    hrun.TCPServer = CappedTCPServer  # type: ignore[misc]


async def _refuse_connection(writer: asyncio.StreamWriter, limit: int) -> None:
    body = orjson.dumps({"error": f"too many connections: the server serves at most {limit} at once"})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(Exception):
        writer.write(head + body)
        await asyncio.wait_for(writer.drain(), 5.0)
    with contextlib.suppress(Exception):
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 5.0)


def _install_json_errors() -> None:
    try:
        import h11
        from hypercorn.protocol.h11 import H11Protocol
    except ImportError:
        return
    if getattr(H11Protocol, "seqserve_json_errors", False) or not hasattr(H11Protocol, "_send_error_response"):
        return

    async def _send_error_response(self: Any, status_code: int) -> None:
        body = orjson.dumps({"error": _PARSE_ERRORS.get(status_code, "malformed HTTP request")})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    H11Protocol._send_error_response = _send_error_response  # type: ignore[method-assign]
    H11Protocol.seqserve_json_errors = True  # type: ignore[attr-defined]
