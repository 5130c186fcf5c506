"""The sequence API of one model version: list, show and end its sequences (checkpoints are
``checkpoints.SequenceCheckpoints``'), and the DESCRIBE line of a sequence that expired."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import orjson

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import ExpiredSequence, Scheduler
from seqserve.engine._core import SequenceInfo as CoreSequenceInfo
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.spec import CoreSpec
from seqserve.engine.request import SequenceId
from seqserve.engine.sessions import EndedSequence, SequenceInfo, SequenceList

log = logging.getLogger("seqserve.model")


class SequenceViews:
    """One model version's live sequences, as the core holds them, for the sequence API."""

    def __init__(
        self, name: str, version: int, *, is_sequence: bool, core: Scheduler, spec: CoreSpec, instance_names: list[str]
    ) -> None:
        self.name = name
        self.version = version
        self.is_sequence = is_sequence
        self._core = core
        self._spec = spec
        self._instance_names = instance_names  # instance index -> its name

    def sequences(self, limit: int) -> SequenceList:
        """The live sequences (holding a slot or backlogged): how many, and up to ``limit`` of
        them, the oldest first."""
        total, found = self._core.list_sequences(limit)
        infos = sorted((self._sequence_info(x) for x in found), key=lambda i: -i.age_s)
        return SequenceList(total, infos)

    def sequence(self, sequence_id: SequenceId) -> SequenceInfo:
        """One live sequence; NOT_FOUND when it is not live (the message says why when it is a
        session that ended or expired)."""
        found = self._core.find_sequence(sequence_id)
        if found is None:
            raise self._not_live(sequence_id)
        return self._sequence_info(found)

    def end_sequence(self, sequence_id: SequenceId) -> EndedSequence:
        """End a live sequence now, as idle expiry does: its slot is freed once the requests
        already queued for it have run, and with ``timeout_action: TIMEOUT_COMPLETE`` the model
        gets one final END step first. A backlogged sequence's queued requests are cancelled.
        Its id is remembered as ended, so a session request for it gets SessionGoneError and a
        ``sequence_id`` request without START gets Triton's START error."""
        found = self._core.end_sequence(sequence_id)
        if found is None:
            raise self._not_live(sequence_id)
        info = self._sequence_info(found)
        log.info(
            "model '%s' version %d: sequence %r ended through the sequence API", self.name, self.version, sequence_id
        )
        return EndedSequence(
            info,
            final_step=self._spec.scheduler.timeout_complete and not info.backlogged,
            cancelled_requests=info.queued if info.backlogged else 0,
        )

    def _sequence_info(self, x: CoreSequenceInfo) -> SequenceInfo:
        held = not x.backlogged
        return SequenceInfo(
            sequence_id=x.sequence_id,
            backlogged=x.backlogged,
            session=x.session,
            instance=self._instance_names[x.instance] if held else None,
            slot=x.slot if held else None,
            age_s=x.age_s,
            idle_s=x.idle_s,
            steps=x.steps,
            state_bytes=x.state_bytes,
            queued=x.queued,
        )

    def _not_live(self, sequence_id: SequenceId) -> InferenceError:
        msg = f"sequence {sequence_id!r} of model '{self.name}' version {self.version} is not live"
        if not self.is_sequence:
            msg = f"model '{self.name}' is not a sequence model"
        else:
            gone = self._core.session_gone(sequence_id)
            if gone:
                msg += f": {gone}"
        return InferenceError(Code.NOT_FOUND, msg)


def log_expired(model: str, version: int, x: ExpiredSequence) -> None:
    """stateful_model_policy DESCRIBE: one structured line per expired sequence."""
    info = {
        "model": model,
        "version": version,
        "sequence_id": x.sequence_id,
        "age_s": x.age_s,
        "idle_s": x.idle_s,
        "steps": x.steps,
        "state_bytes": x.state_bytes,
        "instance": x.instance,
        "slot": x.slot,
    }
    log.info("sequence expired %s", orjson.dumps(info).decode())


def expiry_log(cfg: mc.ModelConfig, version: int) -> Callable[[ExpiredSequence], None] | None:
    """The core's on_expire hook: ``log_expired`` for a model whose stateful_model_policy is
    DESCRIBE, else None (the core then describes nothing)."""
    policy = cfg.model_transaction_policy.stateful_model_policy
    if policy.timeout_action != mc.ModelTransactionPolicy.StatefulModelPolicy.DESCRIBE:
        return None
    return functools.partial(log_expired, cfg.name, version)
