"""gRPC over HTTP/2 (gRPC's PROTOCOL-HTTP2.md) below the call: the reply header blocks, the
status trailers, the request headers gRPC reads (deadline, encoding, binary metadata), the
5-byte message prefix, and compressed messages inflated within the message limit."""

from __future__ import annotations

import base64
import binascii

from seqserve.api.limits import GZIP, ZLIB, InflateError, TooLarge, inflate_bounded
from seqserve.api.transport.grpc_context import CallAborted, Status
from seqserve.api.transport.h2_hpack import STATUS_200, literal

#: a status message's encoded length (grpc core's clients drop metadata over 8 KiB)
_MAX_MESSAGE_BYTES = 6 << 10
#: the encodings a request may use (``ENCODINGS``), advertised in every reply (gRPC's
#: compression.md: a client learns them, and an unknown one is UNIMPLEMENTED with this list)
ACCEPT_ENCODING = b"identity,deflate,gzip"
REPLY_HEADERS = (
    STATUS_200 + literal(b"content-type", b"application/grpc") + literal(b"grpc-accept-encoding", ACCEPT_ENCODING)
)
OK_TRAILERS = literal(b"grpc-status", b"0")
#: request headers that are not the call's metadata
NOT_METADATA = frozenset(
    (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"content-length")
)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
#: grpc-encoding -> zlib window bits (0: identity)
ENCODINGS = {b"gzip": GZIP, b"deflate": ZLIB, b"identity": 0}


def status_trailers(code: int, message: str, *, trailers_only: bool) -> bytes:
    """``grpc-status`` and a percent-encoded ``grpc-message`` (gRPC's HTTP/2 protocol: printable
    ASCII but ``%`` as is, every other byte of its UTF-8 as %XX)."""
    block = literal(b"grpc-status", str(code).encode())
    if message:
        raw = message.encode("utf-8", "replace")
        encoded = bytearray()
        for b in raw:
            if len(encoded) > _MAX_MESSAGE_BYTES:  # grpc core's clients drop metadata over 8 KiB
                encoded += b"..."
                break
            if 0x20 <= b <= 0x7E and b != 0x25:
                encoded.append(b)
            else:
                encoded += b"%%%02X" % b
        block += literal(b"grpc-message", bytes(encoded))
    return (REPLY_HEADERS + block) if trailers_only else block


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout``: at most 8 digits and a unit; None when malformed (no deadline)."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1:])
    return None if unit is None else int(value[:-1]) * unit


def metadata_value(name: str, value: bytes) -> str | bytes:
    if name.endswith("-bin"):
        try:
            return base64.b64decode(value + b"=" * (-len(value) % 4))
        except (binascii.Error, ValueError):
            return value
    return value.decode("latin-1")


def too_large(size: int, limit: int) -> CallAborted:
    return CallAborted(Status.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")


class MessageFramer:
    """The messages in a stream's DATA: a 5-byte prefix (compressed flag, length) and the
    message. Bytes are kept only while a message is incomplete; a length over ``limit`` is
    refused before the rest is read."""

    __slots__ = ("limit", "pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = bytearray()

    def feed(self, data: bytes) -> None:
        self.pending += data

    def next(self) -> tuple[bool, bytes] | None:
        """The next complete message (compressed, bytes), or None; CallAborted when one is
        too large or its flag is not 0 or 1."""
        pending = self.pending
        if len(pending) < 5:
            return None
        size = int.from_bytes(pending[1:5], "big")
        if size > self.limit:
            raise too_large(size, self.limit)
        if len(pending) < 5 + size:
            return None
        flag = pending[0]
        message = bytes(pending[5 : 5 + size])
        del pending[: 5 + size]
        if flag > 1:
            raise CallAborted(Status.INTERNAL, f"invalid message compression flag {flag}")
        return flag == 1, message


async def inflate_message(message: bytes, wbits: int, limit: int) -> bytes:
    """A compressed message inflated within the message limit (``limits.inflate_bounded``)."""
    try:
        inflater = await inflate_bounded(message, limit, wbits)
    except TooLarge:
        raise CallAborted(
            Status.RESOURCE_EXHAUSTED, f"Received message larger than max (over {limit} decompressed)"
        ) from None
    except InflateError as e:
        why = "it is truncated" if e.truncated else str(e)
        raise CallAborted(Status.INTERNAL, f"the message did not decompress: {why}") from None
    return inflater.result()
