"""What a gRPC call's handler sees, on either server: seqserve's own small interface, which the
builtin server implements (``grpc_calls.BuiltinContext``) and which wraps grpc.aio's context
for ``--grpc-server grpcio`` (``api/grpc/aio.py``). A handler reads the call's metadata and its
peer, reads a stream's messages, and ends the call with a status by raising ``CallAborted``."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

#: a call's metadata: (lower-case key, value), ``-bin`` values as bytes
Metadata = tuple[tuple[str, str | bytes], ...]


class Status(enum.IntEnum):
    """gRPC's status codes (doc/statuscodes.md), by their numbers on the wire."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class CallAborted(Exception):
    """Raised by a handler (or for it): the call ends with ``status`` and ``details``."""

    def __init__(self, status: Status, details: str) -> None:
        super().__init__(details)
        self.status = status
        self.details = details


class CallContext(Protocol):
    """A call as its handler sees it."""

    @property
    def metadata(self) -> Metadata:
        """The request's metadata (its headers other than gRPC's own)."""

    def peer(self) -> str:
        """The client's address, as grpc writes it (``ipv4:host:port``)."""

    async def read(self) -> Any:
        """A streaming call's next request message, or None once the client half-closed."""


@dataclass(frozen=True, slots=True)
class Method:
    """A registered rpc: its behaviour and (de)serializer (None: bytes in and out). A unary
    behaviour is ``await behaviour(request, context)``; a streaming one (bidirectional) is
    ``behaviour(requests, context)``, an async iterator of replies, with ``requests`` an async
    iterator of the request messages."""

    behaviour: Callable[..., Any]
    streaming: bool
    deserialize: Callable[[bytes], Any] | None
    serialize: Callable[[Any], bytes] | None
