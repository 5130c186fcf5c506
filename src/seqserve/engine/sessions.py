"""Sessions and the sequence API's view of live sequences.

A *session* is a sequence named by the client through a session id (HTTP's
``Inference-Session-Id`` header, gRPC's ``inference-session-id`` metadata), or one whose id the
server generated. Unlike a ``sequence_id`` request, which keeps Triton's rule (a request
without START for a sequence that is not live is refused), a session request starts its
session when the server does not know it: START is implied. An implied start must never hide
lost state, so the core remembers sessions that ended (an END request, or the sequence API)
or expired (idle timeout) for ``SessionPolicy.tombstone_s`` seconds, at most
``SessionPolicy.tombstone_max`` of them per model version, and refuses their next request with
``SessionGoneError``. A request that sets START explicitly starts the id afresh. A restarted
server remembers nothing.

Tombstones count against the client whose request ended or last stepped the session (its
peer address, or ``""`` for in-process callers): one client holds at most
``SessionPolicy.per_client_cap`` of them (its own least recently used one is dropped past
that), and at the total cap the client holding the most loses its least recently used one. A
dropped id is still refused (csrc/tombstones.h); a client that has had too many dropped lately
gets its new sessions refused (UNAVAILABLE with a retry-after), other clients do not.
"""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import SequenceId

#: seconds an ended or expired session is remembered by default
DEFAULT_TOMBSTONE_S = 3600.0
#: how many ended or expired sessions each model version remembers at most, by default
DEFAULT_TOMBSTONE_MAX = 10_000
#: a client's share of ``tombstone_max`` when none is given: one in four, so that it takes at
#: least four flooding addresses to fill the total, and the client holding the most pays first
DEFAULT_PER_CLIENT_DIVISOR = 4


@dataclass(frozen=True, slots=True)
class SessionPolicy:
    """How long and how many ended or expired sessions are remembered (0: none), in all and
    per client (``tombstone_max_per_client``: None for a quarter of ``tombstone_max``; 0 for no
    bound but the total, as when every client reaches the server through one proxy)."""

    tombstone_s: float = DEFAULT_TOMBSTONE_S
    tombstone_max: int = DEFAULT_TOMBSTONE_MAX
    tombstone_max_per_client: int | None = None

    @property
    def per_client_cap(self) -> int:
        """Tombstones one client may hold (0: no bound but ``tombstone_max``)."""
        if self.tombstone_max_per_client is None:
            return max(1, self.tombstone_max // DEFAULT_PER_CLIENT_DIVISOR) if self.tombstone_max else 0
        return self.tombstone_max_per_client

    def __post_init__(self) -> None:
        if not self.tombstone_s >= 0:
            raise ValueError(f"tombstone_s must be >= 0, got {self.tombstone_s}")
        if self.tombstone_max < 0:
            raise ValueError(f"tombstone_max must be >= 0, got {self.tombstone_max}")
        if self.tombstone_max_per_client is not None and self.tombstone_max_per_client < 0:
            raise ValueError(f"tombstone_max_per_client must be >= 0, got {self.tombstone_max_per_client}")


def client_key(client: str) -> int:
    """The core's key for a client's address ("": the shared key, 0); an IPv6 address counts by
    its /64 prefix, as one host usually holds a whole /64. Local to this process, as the
    accounting is."""
    if not client:
        return 0
    if ":" in client:
        client = _ipv6_prefix(client)
    return hash(client) & 0xFFFF_FFFF_FFFF_FFFF


@functools.lru_cache(maxsize=4096)
def _ipv6_prefix(address: str) -> str:
    try:
        ip = ipaddress.IPv6Address(address.partition("%")[0])
    except ValueError:
        return address  # not an address: the text is the key
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


def peer_host(peer: str) -> str:
    """The address without its port, from grpc's ``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5`` (grpcio
    writes ``ipv6:%5B::1%5D:5``) or a plain ``host:port`` (or ``host``)."""
    for scheme in ("ipv4:", "ipv6:"):
        if peer.startswith(scheme):
            peer = peer[len(scheme) :].replace("%5B", "[").replace("%5D", "]")
            break
    if peer.startswith("["):
        return peer[1 : peer.find("]")] if "]" in peer else peer[1:]
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else peer


class SessionGoneError(InferenceError):
    """A session request for a session that ended or expired: ``session 'x' expired after N
    s idle; start a new session with a new id`` (or ``... was ended ...``). NOT_FOUND; HTTP
    answers it with 410 Gone."""

    def __init__(self, message: str) -> None:
        super().__init__(Code.NOT_FOUND, message)


@dataclass(frozen=True, slots=True)
class SequenceInfo:
    """One live sequence of a model version, as the sequence API shows it."""

    sequence_id: SequenceId
    backlogged: bool  # waiting for a slot: no instance, slot, steps or state yet
    session: bool  # named by a session (see the module's docstring)
    instance: str | None  # the model instance's name
    slot: int | None  # the slot within that instance
    age_s: float  # since its START arrived
    idle_s: float  # since its last request arrived
    steps: int  # steps handed to the model
    state_bytes: int  # implicit state it holds
    queued: int  # requests waiting in its slot's queue or in the backlog


@dataclass(frozen=True, slots=True)
class SequenceList:
    """Live sequences of a model version: ``total`` of them, ``sequences`` up to the limit asked
    for, the oldest first."""

    total: int
    sequences: list[SequenceInfo]


@dataclass(frozen=True, slots=True)
class EndedSequence:
    """What ``Server.end_sequence`` did: the sequence as it was, and whether the model gets a
    final END step (``timeout_action: TIMEOUT_COMPLETE``; a backlogged sequence never had a
    slot, so its queued requests are cancelled instead)."""

    sequence: SequenceInfo
    final_step: bool
    cancelled_requests: int


def parse_sequence_id(text: str, id_type: str = "") -> SequenceId:
    """A sequence id written as text (a URL path segment, a header): ``id_type`` "uint64" or
    "string"; "" decides by the text (decimal digits: uint64, anything else: string).
    Raises INVALID_ARG for an id that is none (0, "") or does not fit its type."""
    if id_type not in ("", "uint64", "string"):
        raise InferenceError(Code.INVALID_ARG, f"id_type must be 'uint64' or 'string', not '{id_type}'")
    if id_type == "string" or (id_type == "" and not (text.isascii() and text.isdigit())):
        if not text:
            raise InferenceError(Code.INVALID_ARG, "a sequence id cannot be empty")
        return text
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 2**64:
        raise InferenceError(Code.INVALID_ARG, f"'{text}' is not a uint64 sequence id (1 to 2^64-1)")
    return int(text)
