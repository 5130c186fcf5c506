"""Sequences that live no longer than something else: a ``SequenceScope`` collects the sequences
its requests start (``InferRequest.scope``), and ``close`` ends those still running.

The gRPC front-end gives each ``ModelStreamInfer`` call one when the stream asks for
stream-scoped sequences: a client that goes away then frees its slots at once, instead of
holding them until the idle timeout (see docs/behaviour.md).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

#: a sequence's id (``seqserve.engine.request.SequenceId``, which imports this module)
_SequenceId = int | str


class ScopedModel(Hashable, Protocol):
    """What a scope needs of the model versions its sequences run on (``LoadedModel``)."""

    def end_owned_sequence(self, sequence_id: _SequenceId, owner: int, reason: str, /) -> bool: ...


class SequenceScope:
    """The live sequences started under this scope. Event-loop only."""

    __slots__ = ("_live", "reason")

    def __init__(self, reason: str = "the scope that started it was closed") -> None:
        #: what the requests still queued in an ended sequence are told (after the sequence's name)
        self.reason = reason
        # (model, sequence id) -> handle of the START that began it: a later START of the same
        # id, from anywhere, makes it someone else's sequence
        self._live: dict[tuple[ScopedModel, _SequenceId], int] = {}

    def __len__(self) -> int:
        return len(self._live)

    def started(self, model: ScopedModel, sequence_id: _SequenceId, handle: int) -> None:
        self._live[(model, sequence_id)] = handle

    def joined(self, model: ScopedModel, sequence_id: _SequenceId, handle: int) -> None:
        """A session request (whose START may be implied) of a sequence not yet the scope's: it
        is, if that request started it (the core compares its handle with the START's)."""
        self._live.setdefault((model, sequence_id), handle)

    def ended(self, model: ScopedModel, sequence_id: _SequenceId) -> None:
        self._live.pop((model, sequence_id), None)

    def close(self) -> int:
        """End every sequence still live, as idle expiry does: slots free at once (after one
        final END step for models with ``timeout_action: TIMEOUT_COMPLETE``), queued requests
        are answered CANCELLED. Returns how many ended."""
        live, self._live = self._live, {}
        ended = 0
        for (model, sequence_id), handle in live.items():
            ended += model.end_owned_sequence(sequence_id, handle, self.reason)
        return ended
