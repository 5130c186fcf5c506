"""The defaults Triton applies to a config at load."""

from __future__ import annotations

from seqserve._proto.model_config_pb2 import (
    ModelConfig,
    ModelSequenceBatching,
)
from seqserve.engine.config.extensions import normalize_extensions
from seqserve.engine.config.names import DEFAULT_MAX_SEQUENCE_IDLE_US


def normalize_config(cfg: ModelConfig) -> None:
    """Fill in the defaults Triton applies at load, in place.

    KIND_AUTO instance groups are left for the server, which knows the
    devices. seqserve extension fields are left as parsed.
    """
    normalize_extensions(cfg)
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    _normalize_instance_groups(cfg)
    _normalize_pinned_memory(cfg)
    if cfg.HasField("dynamic_batching"):
        dyn = cfg.dynamic_batching
        if not dyn.preferred_batch_size and cfg.max_batch_size > 0:
            dyn.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching"):
        _normalize_sequence_batching(cfg.sequence_batching, cfg.max_batch_size)


def _normalize_instance_groups(cfg: ModelConfig) -> None:
    if cfg.platform == "ensemble" or cfg.HasField("ensemble_scheduling"):
        return  # an ensemble has no instances of its own (and may not name any)
    if not cfg.instance_group:
        cfg.instance_group.add()
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.count < 1:
            group.count = 1


def _normalize_pinned_memory(cfg: ModelConfig) -> None:
    # Triton turns pinned staging buffers on unless told otherwise (not for
    # ensembles, which have no buffers of their own).
    if cfg.HasField("ensemble_scheduling") or cfg.platform == "ensemble":
        return
    opt = cfg.optimization
    if not opt.HasField("input_pinned_memory"):
        opt.input_pinned_memory.enable = True
    if not opt.HasField("output_pinned_memory"):
        opt.output_pinned_memory.enable = True


def _normalize_sequence_batching(seq: ModelSequenceBatching, max_batch_size: int) -> None:
    if seq.max_sequence_idle_microseconds == 0:
        seq.max_sequence_idle_microseconds = DEFAULT_MAX_SEQUENCE_IDLE_US
    strategy = seq.WhichOneof("strategy_choice")
    if strategy is None:
        seq.direct.SetInParent()
    elif strategy == "oldest":
        oldest = seq.oldest
        if oldest.max_candidate_sequences == 0:
            oldest.max_candidate_sequences = max(1, max_batch_size)
        if not oldest.preferred_batch_size and max_batch_size > 0:
            oldest.preferred_batch_size.append(max_batch_size)
