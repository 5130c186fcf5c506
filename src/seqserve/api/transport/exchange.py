"""What an HTTP server hands a handler, and what the handler gives back: the narrow interface
between the servers (the builtin one, or hypercorn and granian through ``asgi``) and the KServe
routes (api/http), so that the routes are written once and the builtin server calls them with
no ASGI in between."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol


class BodySource(Protocol):
    """A request body as it arrives; the server keeps the connection's limits."""

    async def receive(self) -> tuple[bytes, bool] | None:
        """The next part of the body and whether more follows; None when it cannot end: the
        client disconnected, or the body's framing was malformed."""

    async def wait_disconnect(self) -> None:
        """Returns once the client is gone (or the reply is written)."""


@dataclass(slots=True)
class HttpRequest:
    """A request: ``path`` percent-decoded; header names lower-case, values as sent."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: BodySource
    scheme: str = "http"
    server: tuple[str, int] | None = None  # the local address, for URLs built without Host
    peer: str = ""  # the client's address without its port ("": unknown)
    _index: dict[bytes, bytes] | None = field(default=None, repr=False)

    def header(self, name: bytes) -> str | None:
        """The value of header ``name`` (lower-case), the last one when it is repeated."""
        index = self._index
        if index is None:
            index = self._index = dict(self.headers)
        value = index.get(name)
        return None if value is None else value.decode("latin-1")


@dataclass(slots=True)
class HttpReply:
    """A reply; the server writes its framing (content-length, or chunks; connection).

    ``stream``: the rest of the body, produced part by part after ``body`` (server-sent events):
    the server writes each part as it comes (chunked in HTTP/1.1) and ends the body when the
    iterator ends. When the client goes away first, the server stops reading it and closes it
    (``aclose``), so the producer's ``finally`` can let go of what it holds."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    close: bool = False  # the connection closes after it
    stream: AsyncIterator[bytes] | None = None


#: a route: the reply, or None when the client is gone and nothing is to be sent
Handler = Callable[[HttpRequest], Awaitable[HttpReply | None]]
