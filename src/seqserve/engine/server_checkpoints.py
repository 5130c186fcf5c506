"""Checkpoint and restore of live sequences through the in-process API: what a replica
coordinator (drain handoff, restore on arrival, handover, idle spill) calls. See
docs/checkpoints.md; the work is done by ``LoadedModel`` (``engine/model/checkpoints.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from seqserve.engine.checkpoint import SequenceCheckpoint
from seqserve.engine.request import SequenceId
from seqserve.engine.server_state import ModelState

if TYPE_CHECKING:
    from seqserve.engine.model import LoadedModel


class CheckpointAPI:
    """Part of ``Server``; see ``seqserve.engine.server``."""

    _models: dict[str, ModelState]

    if TYPE_CHECKING:  # provided by Server

        def _sequence_model(self, model: str, version: str | int) -> LoadedModel: ...

    def checkpoint_sequence(
        self, model: str, version: str | int, sequence_id: SequenceId, *, release: bool
    ) -> SequenceCheckpoint | None:
        """The live sequence ``sequence_id`` of a model version as it stands between two steps,
        or None when it is not live there. With ``release`` it leaves its slot without an END
        step (it moved; see ``LoadedModel.checkpoint_sequence``). Raises SequenceBusyError
        while it has a request queued or running, CheckpointUnsupportedError for a model that
        keeps its sequences' state itself, INVALID_ARG for a model without sequences, NOT_FOUND
        for a model (version) that is not loaded."""
        return self._sequence_model(model, version).checkpoint_sequence(sequence_id, release=release)

    def restore_sequence(self, ckpt: SequenceCheckpoint) -> None:
        """Put a checkpointed sequence into a free slot of its model version (``ckpt.model``,
        ``ckpt.version``, which must be loaded: NOT_FOUND otherwise); its next non-START
        request continues from there. See ``LoadedModel.restore_sequence`` for the refusals."""
        self._sequence_model(ckpt.model, ckpt.version).restore_sequence(ckpt)

    def live_sequences(self) -> list[tuple[str, int, SequenceId, float]]:
        """(model, version, sequence id, idle seconds) of every live sequence holding a slot,
        in every loaded sequence model (backlogged ones are left out: they hold no state yet).
        For drain and idle spill; models without implicit state are included, and refuse a
        checkpoint (CheckpointUnsupportedError): finish those where they run."""
        return [
            (name, version, sequence_id, idle_s)
            for name, state in list(self._models.items())
            for version, m in list(state.versions.items())
            for sequence_id, idle_s in m.slot_sequences()
        ]
