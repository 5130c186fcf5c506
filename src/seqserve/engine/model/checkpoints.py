"""Checkpoint and restore of one model version's sequences (see docs/checkpoints.md).

The core does the work under its lock (``SequenceScheduler::checkpoint_sequence`` and
``restore_sequence``, csrc/sequence_scheduler.cc); this side turns its answers into ``SequenceCheckpoint`` objects and
errors with status codes, and checks a checkpoint against the model before the core sees it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import Refusal, Scheduler, StateSpec
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.spec import CoreSpec
from seqserve.engine.model.validation import INTEGER_CORRID, MAX_STRING_ID
from seqserve.engine.replicas.checkpoint import (
    RETRY_AFTER_S,
    CheckpointError,
    CheckpointUnsupportedError,
    SequenceBusyError,
    SequenceCheckpoint,
    check_fields,
)
from seqserve.engine.request import SequenceId
from seqserve.engine.tensors import deserialize_bytes, numpy_wire_name, serialize_bytes, wire_dtype_name

log = logging.getLogger("seqserve.model")

#: list_sequences' limit when every live sequence is wanted
_ALL = 1 << 62


class SequenceCheckpoints:
    """Checkpoints of one model version's sequences, and restores into its free slots."""

    def __init__(self, name: str, version: int, *, is_sequence: bool, core: Scheduler, spec: CoreSpec) -> None:
        self.name = name
        self.version = version
        self.is_sequence = is_sequence
        self._core = core
        self._spec = spec

    def slot_sequences(self) -> list[tuple[SequenceId, float]]:
        """(sequence id, idle seconds) of every live sequence that holds a slot (not the
        backlogged ones: they hold no state yet); empty for a model without sequences."""
        if not self.is_sequence:
            return []
        _, found = self._core.list_sequences(_ALL)
        return [(x.sequence_id, x.idle_s) for x in found if not x.backlogged]

    def checkpoint_sequence(self, sequence_id: SequenceId, *, release: bool) -> SequenceCheckpoint | None:
        """The live sequence ``sequence_id`` as it stands between two steps; None when it is
        not live here (unknown, ended, expired, or released).

        Raises SequenceBusyError (UNAVAILABLE, retry shortly) while it has a request queued or
        running, or waits in the backlog for a slot; CheckpointUnsupportedError (UNSUPPORTED)
        for a model that keeps its sequences' state itself (no implicit state: finish those
        where they run); INVALID_ARG for a model without sequences.

        ``release``: the sequence then leaves its slot without an END step and without being
        remembered as ended (it moved): the slot is free for the backlog at once, statistics
        count it as released (neither ended nor expired), and a later non-START request for it
        here gets Triton's START error (SequenceReleasedError), a session's too, until it is
        restored or started again."""
        if not self.is_sequence:
            raise InferenceError(Code.INVALID_ARG, f"model '{self.name}' is not a sequence model: it has no sequences")
        got = self._core.checkpoint_sequence(sequence_id, release=release)
        if got is None:
            return None
        if isinstance(got, Refusal):
            if got.busy:
                raise SequenceBusyError(got.message)
            if got.code is Code.UNSUPPORTED:
                raise CheckpointUnsupportedError(got.message)
            raise InferenceError(got.code, got.message)
        steps, session, raw = got
        states: dict[str, np.ndarray] = {}
        for spec, (data, shape) in zip(self._spec.scheduler.states, raw, strict=True):
            if spec.dtype.kind == "O":
                arr = deserialize_bytes(data, shape)
            else:
                arr = np.frombuffer(data, dtype=spec.dtype).reshape(shape)
            arr.flags.writeable = False
            states[spec.input_name] = arr
        if release:
            log.debug("model '%s' version %d: sequence %r released", self.name, self.version, sequence_id)
        return SequenceCheckpoint(self.name, self.version, sequence_id, steps, session, states)

    def restore_sequence(self, ckpt: SequenceCheckpoint) -> None:
        """Claim a free slot for ``ckpt.sequence_id`` holding ``ckpt.states`` and ``ckpt.steps``:
        its next non-START request continues from there (the model sees START=0, READY=1, its
        CORRID and the restored state). Its idle clock starts now.

        Raises InferenceError: UNAVAILABLE (with ``retry_after_s``) when no slot is free (a
        restore is never backlogged) or the model is stopping; ALREADY_EXISTS when the id is
        live here; INVALID_ARG when the checkpoint is another model's or version's, or its
        states do not fit (names, dtypes, shapes); UNSUPPORTED (CheckpointUnsupportedError)
        for a model without implicit state."""
        if not self.is_sequence:
            raise InferenceError(Code.INVALID_ARG, f"model '{self.name}' is not a sequence model: it has no sequences")
        if ckpt.model != self.name or ckpt.version != self.version:
            raise InferenceError(
                Code.INVALID_ARG,
                f"the checkpoint of sequence {ckpt.sequence_id!r} is of model '{ckpt.model}' version "
                f"{ckpt.version}, not '{self.name}' version {self.version}",
            )
        self._check_identity(ckpt)
        specs = self._spec.scheduler.states
        if not specs:
            raise CheckpointUnsupportedError(
                f"model '{self.name}' keeps its sequences' state itself (its config has no implicit state): "
                "it cannot restore a sequence from a checkpoint"
            )
        values = self._state_values(ckpt, specs)
        got = self._core.restore_sequence(ckpt.sequence_id, session=ckpt.session, steps=ckpt.steps, states=values)
        if got is None:
            log.debug("model '%s' version %d: sequence %r restored", self.name, self.version, ckpt.sequence_id)
            return
        code = got.code
        if code is Code.UNSUPPORTED:
            raise CheckpointUnsupportedError(got.message)
        raise InferenceError(code, got.message, retry_after_s=RETRY_AFTER_S if code is Code.UNAVAILABLE else None)

    def _check_identity(self, ckpt: SequenceCheckpoint) -> None:
        """The checkpoint's fields are in range, and its id is one this model's requests can
        name (a string id needs a string CORRID, if the model has a CORRID control)."""
        try:
            check_fields(ckpt.model, ckpt.version, ckpt.sequence_id, ckpt.steps, ckpt.session)
        except CheckpointError as e:
            raise InferenceError(Code.INVALID_ARG, str(e)) from None
        sid = ckpt.sequence_id
        is_str = isinstance(sid, str)
        if is_str and len(sid) > MAX_STRING_ID:  # type: ignore[arg-type]
            raise InferenceError(Code.INVALID_ARG, f"string sequence id longer than {MAX_STRING_ID} characters")
        cd = self._spec.corrid_dtype
        if cd is not None and ((is_str and cd != mc.TYPE_STRING) or (not is_str and cd not in INTEGER_CORRID)):
            raise InferenceError(
                Code.INVALID_ARG,
                f"the checkpoint of sequence {sid!r} has a {'string' if is_str else 'integer'} id, the CORRID "
                f"control of model '{self.name}' is {wire_dtype_name(cd)}",
            )

    def _state_values(self, ckpt: SequenceCheckpoint, specs: list[StateSpec]) -> list[tuple[Any, list[int]]]:
        """The checkpoint's states in the model's order as (C-contiguous data, shape); the core
        checks shapes and sizes."""
        who = f"the checkpoint of sequence {ckpt.sequence_id!r}"
        names = [s.input_name for s in specs]
        if set(ckpt.states) != set(names):
            raise InferenceError(
                Code.INVALID_ARG,
                f"{who} has the states {sorted(ckpt.states)}, model '{self.name}' has {sorted(names)}",
            )
        values: list[tuple[Any, list[int]]] = []
        for spec in specs:
            arr = np.asarray(ckpt.states[spec.input_name])
            if spec.dtype.kind == "O":
                if arr.dtype.kind not in "OSU":
                    raise InferenceError(
                        Code.INVALID_ARG, f"{who}: state '{spec.input_name}' is {arr.dtype}, the model's is BYTES"
                    )
                values.append((serialize_bytes(np.ascontiguousarray(arr, dtype=object)), list(arr.shape)))
                continue
            if arr.dtype != spec.dtype:
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"{who}: state '{spec.input_name}' is {numpy_wire_name(arr.dtype)}, the model's is "
                    f"{numpy_wire_name(spec.dtype)}",
                )
            values.append((np.ascontiguousarray(arr).reshape(-1).view(np.uint8), list(arr.shape)))
        return values
