"""Bounded input: the front-ends' size and time limits, their defaults, and the two tools that
keep a large request from holding the event loop: an incremental inflater that stops at the
body limit, and a small executor for the decoding work that grows with a request's size.

The defaults follow Triton where it has one: the 64 MiB request limit is Triton's
``--http-max-input-size`` default (``HTTP_DEFAULT_MAX_INPUT_SIZE``, applied after
decompression), and the gRPC message limits default to the same size. docs/security.md
("Bounded input") lists every limit with its flag.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from seqserve.engine import Code, InferenceError

#: the largest request body, before and after decompression (HTTP), and the largest gRPC message
DEFAULT_MAX_BODY_BYTES = 64 << 20
#: a request's headers must have arrived this long after its connection opened or went idle
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: a request body that makes no progress for this long gets 408
DEFAULT_BODY_TIMEOUT_S = 10.0
#: an idle kept-alive HTTP connection is closed after this long (bounded by the header timeout)
DEFAULT_KEEPALIVE_S = 10.0
#: concurrent HTTP connections
DEFAULT_MAX_CONNECTIONS = 1024
#: concurrent connections from one peer address (HTTP and gRPC, each): half the total, so one
#: client holding its share idle leaves the other half to the others, and a load generator or a
#: small proxy on one address still gets a few hundred
DEFAULT_MAX_CONNECTIONS_PER_PEER = 512
#: requests one ModelStreamInfer stream may have read and not yet answered before it stops reading
DEFAULT_GRPC_STREAM_BACKLOG = 4096
#: gRPC: streams per connection, idle connections, keepalive pings (gRPC's and Triton's 2 h, 20 s)
DEFAULT_GRPC_MAX_CONCURRENT_STREAMS = 1024
DEFAULT_GRPC_MAX_CONNECTION_IDLE_S = 300.0
DEFAULT_GRPC_KEEPALIVE_S = 7200.0
DEFAULT_GRPC_KEEPALIVE_TIMEOUT_S = 20.0

#: a request whose body (or whose BYTES data) is larger than this is decoded off the event loop
OFFLOAD_BYTES = 1 << 20
#: inflated on the loop before the rest of a compressed body or message moves to the executor
INLINE_INFLATE_BYTES = 256 << 10
#: one step of inflating in the executor (zlib releases the GIL while it works)
_INFLATE_STEP_BYTES = 1 << 20

T = TypeVar("T")

#: the niceness of the inflate threads (Linux: per thread)
_INFLATE_NICE = 10

_executors: dict[bool, concurrent.futures.ThreadPoolExecutor] = {}


def _lower_priority() -> None:
    """Make the calling thread yield the CPU to the event loop and the model executors: on a
    busy machine a big inflate then slows itself down, not the other clients' steps. Only for
    work that runs without the GIL (a preempted GIL holder would stall the loop instead)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _INFLATE_NICE)


def _pool(background: bool) -> concurrent.futures.ThreadPoolExecutor:
    pool = _executors.get(background)
    if pool is None:
        # Two threads each: large requests queue behind each other instead of taking every core.
        pool = _executors[background] = concurrent.futures.ThreadPoolExecutor(
            max_workers=2,
            thread_name_prefix="seqserve-inflate" if background else "seqserve-decode",
            initializer=_lower_priority if background else None,
        )
    return pool


async def offload(fn: Callable[..., T], *args: Any, background: bool = False) -> T:
    """Run ``fn(*args)`` on a small executor and await its result. ``background``: on threads of
    lower CPU priority, for work that releases the GIL (zlib)."""
    return await asyncio.get_running_loop().run_in_executor(_pool(background), fn, *args)


def shutdown_executor() -> None:
    for pool in _executors.values():
        pool.shutdown(wait=False, cancel_futures=True)
    _executors.clear()


class TooLarge(Exception):
    """A request over a size limit: HTTP 413 / gRPC RESOURCE_EXHAUSTED."""

    def __init__(self, size: int | None, limit: int, what: str = "request body") -> None:
        self.limit = limit
        if size is None:
            super().__init__(f"{what} exceeds the server's limit of {limit} bytes")
        else:
            super().__init__(f"{what} of {size} bytes exceeds the server's limit of {limit} bytes")


# ------------------------------------------------------------------------- inflate

#: the request Content-Encodings understood; "identity" (or none) means no compression
ENCODINGS = ("gzip", "deflate")


def content_encoding(header: str) -> str | None:
    """The encoding to undo: "gzip", "deflate", or None for none. An unknown one is refused with
    415 (Triton answers 501 "Unsupported compression type"; the message is Triton's)."""
    enc = header.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc not in ENCODINGS:
        raise InferenceError(Code.UNSUPPORTED, "Unsupported compression type")
    return enc


class InflateError(Exception):
    """Compressed bytes that do not inflate (zlib's reason); ``truncated``: they end early."""

    def __init__(self, why: str, *, truncated: bool = False) -> None:
        super().__init__(why)
        self.truncated = truncated


#: zlib's window bits for data with a gzip or a zlib header (32 + 15), for gzip alone (16 +
#: 15) and for zlib ("deflate" in HTTP and in gRPC)
GZIP_OR_ZLIB, GZIP, ZLIB = 47, 16 + zlib.MAX_WBITS, zlib.MAX_WBITS


class Inflater:
    """Inflates compressed bytes a step at a time, never past ``limit`` bytes of output: a
    1 MiB body that would inflate to 1 GiB stops at the limit after inflating just over it,
    and each step is bounded so the caller decides where it runs (``inflate_bounded``)."""

    __slots__ = ("_d", "_done", "_out", "_pending", "_total", "limit")

    def __init__(self, data: bytes, limit: int, wbits: int = GZIP_OR_ZLIB) -> None:
        self._d = zlib.decompressobj(wbits)
        self._pending = data
        self._out: list[bytes] = []
        self._total = 0
        self._done = False
        self.limit = limit

    def run(self, budget: int | None = None) -> bool:
        """Inflate up to ``budget`` more bytes (None: to the end); True once the data is done.
        Raises TooLarge past the limit, InflateError on corrupt or truncated data."""
        step = _INFLATE_STEP_BYTES if budget is None else budget
        produced = 0
        d = self._d
        try:
            while not self._done:
                room = self.limit + 1 - self._total  # one byte more than allowed says "too large"
                chunk = d.decompress(self._pending, min(step, room))
                self._pending = d.unconsumed_tail
                if chunk:
                    self._out.append(chunk)
                    self._total += len(chunk)
                    produced += len(chunk)
                if self._total > self.limit:
                    raise TooLarge(None, self.limit, "decompressed request body")
                if d.eof:
                    self._done = True
                elif not self._pending and not chunk:
                    raise InflateError("the compressed stream is truncated", truncated=True)
                if budget is not None and produced >= budget:
                    break
        except zlib.error as e:
            raise InflateError(str(e)) from None
        return self._done

    @property
    def trailing_data(self) -> bool:
        """Whether bytes followed the end of the compressed stream."""
        return bool(self._d.unused_data)

    def result(self) -> bytes:
        out = self._out
        return out[0] if len(out) == 1 else b"".join(out)


async def inflate_bounded(data: bytes, limit: int, wbits: int = GZIP_OR_ZLIB) -> Inflater:
    """``data`` inflated within ``limit``: on the event loop for the first INLINE_INFLATE_BYTES
    of output, the rest off it (zlib releases the GIL), whatever the compressed size. Both
    front-ends inflate here (an HTTP body, a gRPC message)."""
    inflater = Inflater(data, limit, wbits)
    if not inflater.run(INLINE_INFLATE_BYTES):
        await offload(inflater.run, background=True)
    return inflater


def _corrupt(encoding: str, why: str) -> InferenceError:
    return InferenceError(Code.INVALID_ARG, f"failed to decompress the request body ({encoding}): {why}")


#: deflate's largest ratio: a 258-byte match per 2 bits of code, about 1032:1
_MAX_DEFLATE_RATIO = 1032


def declared_size(body: bytes) -> int | None:
    """The size a gzip body says it inflates to (its trailer's ISIZE, modulo 2^32), when that
    size is one its compressed bytes could hold; else None (a zlib body does not say, and the
    last 4 bytes of a truncated gzip body are not a trailer)."""
    if len(body) >= 18 and body[:2] == b"\x1f\x8b":
        size = int.from_bytes(body[-4:], "little")
        if size <= _MAX_DEFLATE_RATIO * len(body):
            return size
    return None


async def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """An HTTP request body decompressed (gzip or zlib, told apart by their headers): TooLarge
    (413) past ``limit``, InferenceError (400) when corrupt. A gzip body whose trailer
    declares more than the limit (a size its compressed bytes could hold) is refused before
    any inflating; one whose trailer lies is inflated only up to the limit. (A truncated gzip
    body over 64 KiB may therefore get 413 rather than 400.)"""
    size = declared_size(body)
    if size is not None and size > limit:
        raise TooLarge(size, limit, "decompressed request body")
    try:
        inflater = await inflate_bounded(body, limit)
    except InflateError as e:
        raise _corrupt(encoding, str(e)) from None
    if inflater.trailing_data:
        raise _corrupt(encoding, "trailing data after the compressed stream")
    return inflater.result()


# --------------------------------------------------------------------------- gRPC


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """The gRPC server's limits, as grpc core channel arguments."""

    max_receive_message_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_send_message_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_concurrent_streams: int = DEFAULT_GRPC_MAX_CONCURRENT_STREAMS
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # the builtin server's; grpc core has none
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER  # 0: no per-peer bound
    stream_backlog: int = DEFAULT_GRPC_STREAM_BACKLOG  # per ModelStreamInfer stream
    max_connection_idle_s: float = DEFAULT_GRPC_MAX_CONNECTION_IDLE_S  # 0: never closed for idleness
    #: a connection this old gets a GOAWAY (no new calls); 0: no limit (Triton's
    #: --grpc-max-connection-age, in seconds here)
    max_connection_age_s: float = 0.0
    #: after that GOAWAY, how long its calls get before the connection closes; None: no limit
    max_connection_age_grace_s: float | None = None
    keepalive_s: float = DEFAULT_GRPC_KEEPALIVE_S
    keepalive_timeout_s: float = DEFAULT_GRPC_KEEPALIVE_TIMEOUT_S

    def options(self) -> list[tuple[str, int]]:
        """A message over a size limit fails its call with RESOURCE_EXHAUSTED, before it is
        read whole; a connection with no rpc for ``max_connection_idle_s`` gets a GOAWAY
        (clients reconnect on their next call); keepalive pings find dead peers."""
        opts = [
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
            ("grpc.max_concurrent_streams", self.max_concurrent_streams),
            ("grpc.keepalive_time_ms", _ms(self.keepalive_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.keepalive_timeout_s)),
        ]
        if self.max_connection_idle_s > 0:
            opts.append(("grpc.max_connection_idle_ms", _ms(self.max_connection_idle_s)))
        if self.max_connection_age_s > 0:
            opts.append(("grpc.max_connection_age_ms", _ms(self.max_connection_age_s)))
        if self.max_connection_age_grace_s is not None:
            opts.append(("grpc.max_connection_age_grace_ms", _ms(self.max_connection_age_grace_s)))
        return opts


def _ms(secs: float) -> int:
    return min(int(secs * 1000), 2**31 - 1)


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The HTTP server's time and connection limits (the body size limit is
    ``--http-max-body-bytes``). How each HTTP server enforces them: docs/security.md."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keepalive_s: float = DEFAULT_KEEPALIVE_S  # 0: no keep-alive, one request per connection
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER  # 0: no per-peer bound

    @property
    def idle_s(self) -> float:
        """How long a connection may wait for (the rest of) a request's headers: both servers
        time the wait for the next request and for its headers with one timer."""
        if self.keepalive_s <= 0:
            return self.header_timeout_s
        return min(self.header_timeout_s, self.keepalive_s)


# --------------------------------------------------------------------- connections


class ConnectionAdmission:
    """The connections one front-end serves, counted in total and per peer address (event loop
    only): a new one is admitted while both counts are under their caps. The total bounds the
    memory; the per-peer cap keeps one client (one address) from taking every connection, so
    that others still connect while it holds its share open. Refusals are counted per reason
    for the metrics endpoint."""

    __slots__ = ("by_peer", "max_per_peer", "max_total", "refused", "total")

    #: why a connection was refused: the keys of ``refused``
    REASONS = ("total", "peer", "stopping")

    def __init__(self, max_total: int, max_per_peer: int = 0) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer  # 0: none
        self.total = 0
        self.by_peer: dict[str, int] = {}
        self.refused: dict[str, int] = dict.fromkeys(self.REASONS, 0)

    def admit(self, peer: str | None, *, stopping: bool = False) -> str | None:
        """Count in a new connection from ``peer`` (its host address; None: unknown, counted in
        the total only) and return None, or the reason it is refused (counted, not admitted)."""
        reason = None
        if stopping:
            reason = "stopping"
        elif self.total >= self.max_total:
            reason = "total"
        elif peer is not None and self.max_per_peer > 0 and self.by_peer.get(peer, 0) >= self.max_per_peer:
            reason = "peer"
        if reason is not None:
            self.refused[reason] += 1
            return reason
        self.total += 1
        if peer is not None:
            self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        return None

    def release(self, peer: str | None) -> None:
        """An admitted connection from ``peer`` has closed."""
        self.total -= 1
        if peer is not None:
            left = self.by_peer.get(peer, 0) - 1
            if left > 0:
                self.by_peer[peer] = left
            else:
                self.by_peer.pop(peer, None)

    def refusal_message(self, reason: str) -> str:
        """What a refused client is told."""
        if reason == "peer":
            return f"too many connections from one address: the server serves at most {self.max_per_peer} per client"
        if reason == "stopping":
            return "the server is shutting down"
        return f"too many connections: the server serves at most {self.max_total} at once"


def peer_host(address: Any) -> str | None:
    """The host part of a socket's peer address (``transport.get_extra_info("peername")``)."""
    if isinstance(address, tuple) and address:
        return str(address[0])
    return None
