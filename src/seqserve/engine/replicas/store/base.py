"""The state store's contract: where sequences live while no replica runs them, who owns each
one, and how ownership changes hands safely.

One entry per sequence, keyed by (model, version, sequence id): its owner (a replica id), a
fencing token, its status and, once released, the checkpoint bytes. The rules every backend
keeps, atomically:

- ``register`` (a START on this replica) takes the entry whatever it was: the token goes up by
  one and the status is ``live``; the caller keeps the token.
- ``claim`` takes an entry that is ``released``, or ``live`` under another owner whose
  heartbeat has expired (a dead replica); it answers the checkpoint (None for a dead owner's
  live entry: its state died with it) and the new token. Of two claimers of one entry exactly
  one wins; the other sees the winner.
- ``release``, ``end`` and ``refresh`` present the token: a stale one (someone
  claimed the entry since) is refused, so a replica that lost a sequence can never write it
  back over its new owner's.
- Every entry expires (its ``ttl_s``) unless refreshed: abandoned entries vanish by themselves
  (a released one first turns into an ``expired`` tombstone for ``tombstone_ttl_s``).
- The store has an **epoch**: a random name written once, which each replica learns at ``open``.
  A store that lost its data (a Redis restarted empty, a wiped directory) no longer has it:
  ``heartbeat``, ``claim`` and ``register`` notice (``StoreLostError``), and ``recover`` marks
  the loss for every replica (a *loss window*: an absent entry proves nothing while it lasts,
  since the entry, or the tombstone, may be one the store lost).

The store knows nothing about HTTP, gRPC or the engine's objects: it moves bytes.
"""

from __future__ import annotations

import abc
import enum
import os
import secrets
import socket
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from seqserve.engine.request import SequenceId


class StoreError(Exception):
    """The store cannot be reached or answered something unexpected."""


class StoreLostError(StoreError):
    """The store does not have this replica's epoch: it lost its data (restarted empty) since
    this replica last looked. ``StateStore.recover`` before trusting it again."""


class Status(str, enum.Enum):
    LIVE = "live"  # a replica runs it (its slot holds the state)
    RELEASED = "released"  # checkpointed and left its replica: any replica may claim it
    ENDED = "ended"  # ended (END, the sequence API): a tombstone, so sessions answer 410
    EXPIRED = "expired"  # released, and nobody came back for it in time: a tombstone too

    @property
    def tombstone(self) -> bool:
        return self in (Status.ENDED, Status.EXPIRED)


@dataclass(frozen=True, slots=True)
class SequenceKey:
    """A sequence's identity across replicas (5 and "5" are different ids)."""

    model: str
    version: int
    sequence_id: SequenceId

    def encode(self) -> str:
        """A stable, printable name: no ':' or '/' from the model or the id leak through."""
        kind = "u" if isinstance(self.sequence_id, int) else "s"
        sid = urllib.parse.quote(str(self.sequence_id), safe="")
        return f"{urllib.parse.quote(self.model, safe='')}/{self.version}/{kind}{sid}"

    @classmethod
    def decode(cls, text: str) -> SequenceKey:
        model, version, sid = text.split("/", 2)
        raw = urllib.parse.unquote(sid[1:])
        return cls(urllib.parse.unquote(model), int(version), int(raw) if sid[0] == "u" else raw)


@dataclass(frozen=True, slots=True)
class Entry:
    """One sequence as the store holds it."""

    owner: str
    token: int
    status: Status
    session: bool
    data: bytes | None = None  # the checkpoint, once released


@dataclass(frozen=True, slots=True)
class Claim:
    """What ``claim`` answers: ``won`` with the new token and the checkpoint (None when the
    entry was live: its state died with its owner); otherwise the entry as it stands (None:
    the store does not know the sequence)."""

    won: bool
    token: int = 0
    data: bytes | None = None
    entry: Entry | None = None
    previous_owner: str = ""  # when won: who held it (a dead replica's id, for its live entries)
    #: no entry, but the store lost its data within the loss window: the absence proves nothing
    in_loss_window: bool = False
    #: ... and so recently that the owners of live sequences may still be writing them back
    in_loss_grace: bool = False


#: handover requests reach a replica through this: called with the key asked for
HandoverHandler = Callable[[SequenceKey, str], Coroutine[Any, Any, None]]


class StateStore(abc.ABC):
    """An async state store; one client per replica (``replica_id``)."""

    def __init__(self, replica_id: str, *, heartbeat_ttl_s: float = 10.0) -> None:
        self.replica_id = replica_id
        self.heartbeat_ttl_s = heartbeat_ttl_s
        #: the store's epoch as this replica last knew it (``open`` and ``recover`` set it)
        self.epoch = ""
        #: ``open`` wrote the epoch: the store was empty (new, or restarted empty)
        self.created_epoch = False

    # lifecycle ------------------------------------------------------------------------
    @abc.abstractmethod
    async def open(self, on_handover: HandoverHandler | None = None) -> None:
        """Connect, learn the store's epoch (writing one when there is none), announce this
        replica (a first heartbeat) and, with ``on_handover``, start listening for handover
        requests addressed to it."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop listening, forget this replica's heartbeat, disconnect."""

    @abc.abstractmethod
    async def heartbeat(self) -> bool:
        """This replica is alive for ``heartbeat_ttl_s`` more seconds. False when the store no
        longer has this replica's epoch (it lost its data): call ``recover``."""

    @abc.abstractmethod
    async def recover(self, window_s: float, grace_s: float) -> None:
        """After a loss: adopt the store's new epoch (writing one when there is none) and mark
        the loss window (``window_s``: the longest any lost entry or tombstone could have
        lived) and its grace (``grace_s``: while owners write their live sequences back), for
        every replica, unless another replica marked a longer one."""

    @abc.abstractmethod
    async def is_alive(self, replica_id: str) -> bool:
        """Whether that replica's heartbeat is current."""

    # entries ---------------------------------------------------------------------------
    @abc.abstractmethod
    async def get(self, key: SequenceKey) -> Entry | None:
        """The entry, or None when there is none (never was, ended long ago, expired)."""

    @abc.abstractmethod
    async def register(
        self, keys: list[tuple[SequenceKey, bool]], ttl_s: float, *, if_absent: bool = False
    ) -> list[int]:
        """Take each (key, session) for this replica, live, whatever the entry was (a START
        begins the id afresh); the new tokens, in order. Batched: one round trip. Raises
        StoreLostError when the store lost its data. ``if_absent`` (writing back the live
        sequences after a loss): only where there is no entry; 0 where there is one (someone
        started the id meanwhile: this replica's copy is stale)."""

    @abc.abstractmethod
    async def claim(self, key: SequenceKey, ttl_s: float) -> Claim:
        """Take a released entry, or a live one whose (other) owner is dead."""

    @abc.abstractmethod
    async def release(
        self, key: SequenceKey, token: int, data: bytes, ttl_s: float, tombstone_ttl_s: float = 0.0
    ) -> bool:
        """Store the checkpoint and mark the entry released, if ``token`` is current. Nobody
        claims it within ``ttl_s``: it expires as an idle sequence would, and stays
        ``tombstone_ttl_s`` more as an ``expired`` tombstone (sessions answer 410 then, never
        start afresh on lost state)."""

    @abc.abstractmethod
    async def end(self, items: list[tuple[SequenceKey, int]], tombstone_ttl_s: float) -> list[bool]:
        """The sequences ended: each entry becomes a tombstone (kept ``tombstone_ttl_s``; 0:
        deleted), if its token is current. Batched."""

    @abc.abstractmethod
    async def refresh(self, items: list[tuple[SequenceKey, int]], ttl_s: float) -> list[bool]:
        """Push back the expiry of live entries this replica still holds (token current)."""

    # handover ----------------------------------------------------------------------------
    @abc.abstractmethod
    async def request_handover(self, owner: str, key: SequenceKey) -> None:
        """Ask ``owner`` to checkpoint and release ``key`` between two steps."""


def default_replica_id() -> str:
    """hostname-pid-random: unique per process, readable in logs and in the store."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def redact_url(url: str) -> str:
    """The URL without its user name and password, for logs and error messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
