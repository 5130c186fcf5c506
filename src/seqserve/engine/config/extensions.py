"""seqserve's config extensions, given their meaning in terms of Triton's standard fields."""

from __future__ import annotations

from seqserve._proto.model_config_pb2 import (
    ModelConfig,
    ModelQueuePolicy,
    SeqserveTimeoutAction,
)

#: Idle timeout of a model made stateful by `stateful_model_policy` alone: sessions are
#: conversational, so minutes rather than Triton's 1 s default.
STATEFUL_POLICY_IDLE_US = 300_000_000


def normalize_extensions(cfg: ModelConfig) -> None:
    """Give seqserve's config extensions their meaning in terms of standard fields, before
    Triton's defaults are applied (so unset fields can still be told apart)."""
    dyn = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
    if dyn is not None:
        # default_batch_size adds a preferred size (next to max_batch_size when none is given).
        if dyn.default_batch_size > 0 and dyn.default_batch_size not in dyn.preferred_batch_size:
            sizes = set(dyn.preferred_batch_size) or ({cfg.max_batch_size} if cfg.max_batch_size > 0 else set())
            sizes.add(dyn.default_batch_size)
            del dyn.preferred_batch_size[:]
            dyn.preferred_batch_size.extend(sorted(sizes))
        if dyn.timeout_action == SeqserveTimeoutAction.TIMEOUT_COMPLETE:
            dyn.default_queue_policy.timeout_action = ModelQueuePolicy.DELAY
    policy = cfg.model_transaction_policy
    if policy.HasField("stateful_model_policy") and not cfg.HasField("sequence_batching"):
        cfg.sequence_batching.max_sequence_idle_microseconds = STATEFUL_POLICY_IDLE_US
    if not cfg.HasField("sequence_batching"):
        return
    seq = cfg.sequence_batching
    for state in seq.state:  # `name` is both the input and the output state
        if state.name:
            state.input_name = state.input_name or state.name
            state.output_name = state.output_name or state.name
    strategy = seq.WhichOneof("strategy_choice")
    if strategy == "reusable_batch":
        rb = seq.reusable_batch
        if rb.max_size == 0:
            rb.max_size = max(1, cfg.max_batch_size)
        if not rb.candidate_batch_size:
            if dyn is not None and dyn.preferred_batch_size:
                rb.candidate_batch_size.extend(dyn.preferred_batch_size)
            elif cfg.max_batch_size > 0:
                rb.candidate_batch_size.append(cfg.max_batch_size)
    elif strategy == "oldest" and dyn is not None:
        # Oldest batches honour dynamic_batching's delay and sizes unless they set their own.
        if not seq.oldest.preferred_batch_size:
            seq.oldest.preferred_batch_size.extend(dyn.preferred_batch_size)
        if seq.oldest.max_queue_delay_microseconds == 0:
            seq.oldest.max_queue_delay_microseconds = dyn.max_queue_delay_microseconds
