"""Config -> the core's scheduler spec: strategy and batch forming, inputs, control tensors
and implicit state. Everything here runs once, at load."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import ControlKind, ControlSpec, InputSpec, ModelSpec, QueuePolicy, StateSpec, Strategy
from seqserve.engine.config import read_initial_state
from seqserve.engine.sessions import SessionPolicy
from seqserve.engine.tensors import BY_CONFIG

log = logging.getLogger("seqserve.model")

_CONTROL_KIND = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: ControlKind.START,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: ControlKind.READY,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: ControlKind.END,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: ControlKind.CORRID,
}


@dataclass(slots=True)
class CoreSpec:
    """What the core is built from, plus what the Python side needs to know of it."""

    scheduler: ModelSpec
    strategy_name: str  # direct, oldest, reusable_batch, dynamic, default
    preserve_ordering: bool  # replies leave in submit order (dynamic batcher's preserve_ordering)
    #: (state index, output name) of each implicit state: execute returns its next value
    state_outputs: list[tuple[int, str]] = field(default_factory=list)
    state_names: tuple[str, ...] = ()  # input names of the implicit states, in state order
    #: control and state inputs: the server supplies them, a client's copy is ignored
    server_inputs: frozenset[str] = frozenset()
    corrid_dtype: int | None = None  # the CORRID control's config datatype, if there is one
    corrid_name: str = ""


def core_dtype(data_type: int) -> np.dtype[Any]:
    """The numpy dtype the core handles a config datatype as: the dtype table's (object for
    BYTES); BF16, which numpy lacks, travels as its uint16 bits."""
    dt = BY_CONFIG[data_type]
    return dt.numpy if dt.numpy is not None else np.dtype(np.uint16)


#: Triton's first-response histogram, whose buckets a config's model_metrics may set
LATENCY_HISTOGRAM = "nv_inference_first_response_histogram_ms"
#: its default buckets (ms), Triton's (core ``metric_model_reporter.h``)
DEFAULT_LATENCY_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)


def build_core_spec(
    cfg: mc.ModelConfig,
    model_dir: Path,
    instance_count: int,
    sessions: SessionPolicy | None = None,
    *,
    max_backlog_sequences: int = 0,
) -> CoreSpec:
    """The core's spec for a finished, validated config. ``max_backlog_sequences``: the
    server's bound on backlogged sequences (0: none), unless the config sets its own."""
    sessions = sessions or SessionPolicy()
    is_sequence = cfg.HasField("sequence_batching")
    sb = cfg.sequence_batching
    controls: list[ControlSpec] = []
    states: list[StateSpec] = []
    state_outputs: list[tuple[int, str]] = []
    corrid_dtype: int | None = None
    corrid_name = ""
    if is_sequence:
        controls, corrid_dtype, corrid_name = _control_specs(sb)
        states, state_outputs = _state_specs(cfg.name, sb, model_dir, cfg.max_batch_size)
    batching = _batching_spec(cfg, is_sequence, instance_count)
    strategy_name = batching.pop("strategy_name")
    preserve_ordering = bool(batching.pop("preserve_ordering"))
    scheduler = ModelSpec(
        name=cfg.name,
        max_batch_size=cfg.max_batch_size,
        instance_count=instance_count,
        idle_us=sb.max_sequence_idle_microseconds or 1_000_000,
        max_queue_delay_us=sb.direct.max_queue_delay_microseconds,
        min_slot_utilization=sb.direct.minimum_slot_utilization,
        inputs=[
            InputSpec(
                name=t.name,
                dtype=core_dtype(t.data_type),
                must_match=any(d < 0 for d in t.dims) and not t.allow_ragged_batch,
                default_shape=[1 if d < 0 else d for d in t.dims],
                ragged=t.allow_ragged_batch and cfg.max_batch_size > 0,
            )
            for t in cfg.input
        ],
        controls=controls,
        states=states,
        delay_requests=_env_int("TRITONSERVER_DELAY_SCHEDULER"),
        # the backlog hold is the sequence batcher's alone (Triton): a model without one never backlogs
        delay_backlog_requests=_env_int("TRITONSERVER_BACKLOG_DELAY_SCHEDULER") if is_sequence else 0,
        timeout_complete=is_sequence and sb.timeout_action == mc.TIMEOUT_COMPLETE,
        tombstone_us=int(sessions.tombstone_s * 1e6),
        max_tombstones=sessions.tombstone_max,
        max_tombstones_per_client=sessions.per_client_cap,
        latency_buckets_ms=_latency_buckets(cfg),
        max_backlog_sequences=backlog_bound(sb.max_backlog_sequences, max_backlog_sequences) if is_sequence else 0,
        **batching,
    )
    return CoreSpec(
        scheduler=scheduler,
        strategy_name=strategy_name,
        preserve_ordering=preserve_ordering,
        state_outputs=state_outputs,
        state_names=tuple(s.input_name for s in states),
        server_inputs=frozenset(c.name for c in controls) | frozenset(s.input_name for s in states),
        corrid_dtype=corrid_dtype,
        corrid_name=corrid_name,
    )


def backlog_bound(configured: int, server_default: int) -> int:
    """The bound on backlogged sequences (0: none): the config's
    ``sequence_batching.max_backlog_sequences`` (-1: none), else the server's default."""
    if configured < 0:
        return 0
    return configured or max(0, server_default)


def _latency_buckets(cfg: mc.ModelConfig) -> list[float]:
    """The latency histogram's buckets: Triton's, unless the config's ``model_metrics`` sets
    them for its family (unknown families are warned about and ignored, as Triton does)."""
    buckets = list(DEFAULT_LATENCY_BUCKETS_MS)
    for control in cfg.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family != LATENCY_HISTOGRAM:
            log.warning(
                "model '%s': metric family '%s' in 'metric_identifier' is not a customizable metric", cfg.name, family
            )
            continue
        buckets = sorted(set(control.histogram_options.buckets))
    return buckets


def _batching_spec(cfg: mc.ModelConfig, is_sequence: bool, instance_count: int) -> dict[str, Any]:
    """The core's strategy and batch-forming settings for this config (ModelSpec keywords, plus
    strategy_name and preserve_ordering for the Python side)."""
    mbs = cfg.max_batch_size
    dyn = cfg.dynamic_batching
    has_dyn = cfg.HasField("dynamic_batching")
    spec: dict[str, Any] = {"preserve_ordering": False}
    if is_sequence:
        sb = cfg.sequence_batching
        which = sb.WhichOneof("strategy_choice")
        if which == "oldest":
            spec.update(
                strategy=Strategy.OLDEST,
                strategy_name="oldest",
                slots_per_instance=sb.oldest.max_candidate_sequences or max(1, mbs),
                preferred_batch_sizes=list(sb.oldest.preferred_batch_size),
                batch_delay_us=sb.oldest.max_queue_delay_microseconds,
            )
        elif which == "reusable_batch":
            # Oldest-like batches across sequences; the delay comes from dynamic_batching.
            spec.update(
                strategy=Strategy.OLDEST,
                strategy_name="reusable_batch",
                slots_per_instance=sb.reusable_batch.max_size,
                preferred_batch_sizes=list(sb.reusable_batch.candidate_batch_size),
                batch_delay_us=dyn.max_queue_delay_microseconds if has_dyn else 0,
            )
        else:
            if has_dyn:
                log.info(
                    "model '%s': Direct strategy; dynamic_batching settings do not apply to sequences",
                    cfg.name,
                )
            spec.update(strategy=Strategy.DIRECT, strategy_name="direct", slots_per_instance=max(1, mbs))
        return spec
    slots = {"slots_per_instance": 1}
    if not has_dyn:
        return spec | slots | {"strategy": Strategy.STATELESS, "strategy_name": "default"}
    levels = max(1, dyn.priority_levels)
    policies = []
    for level in range(1, levels + 1):
        qp = dyn.priority_queue_policy.get(level, dyn.default_queue_policy)
        policies.append(
            QueuePolicy(
                delay_on_timeout=qp.timeout_action == mc.ModelQueuePolicy.DELAY,
                default_timeout_us=qp.default_timeout_microseconds,
                allow_override=qp.allow_timeout_override,
                max_queue_size=qp.max_queue_size,
            )
        )
    return (
        spec
        | slots
        | {
            "strategy": Strategy.DYNAMIC,
            "strategy_name": "dynamic",
            "preferred_batch_sizes": list(dyn.preferred_batch_size),
            "batch_delay_us": dyn.max_queue_delay_microseconds,
            "priority_levels": levels,
            "default_priority": dyn.default_priority_level or 1,
            "queue_policies": policies,
            "preserve_ordering": dyn.preserve_ordering and instance_count > 1,
        }
    )


def _control_specs(sb: mc.ModelSequenceBatching) -> tuple[list[ControlSpec], int | None, str]:
    out: list[ControlSpec] = []
    corrid_dtype: int | None = None
    corrid_name = ""
    for ci in sb.control_input:
        spec: ControlSpec | None = None
        for c in ci.control:  # several kinds on one tensor: the later one wins, as in Triton
            kind = _CONTROL_KIND[c.kind]
            if kind == ControlKind.CORRID:
                spec = ControlSpec(name=ci.name, kind=kind, dtype=core_dtype(c.data_type))
                corrid_dtype = c.data_type
                corrid_name = ci.name
                continue
            if len(c.int32_false_true) == 2:
                data_type, values = mc.TYPE_INT32, [float(v) for v in c.int32_false_true]
            elif len(c.fp32_false_true) == 2:
                data_type, values = mc.TYPE_FP32, [float(v) for v in c.fp32_false_true]
            else:
                data_type, values = mc.TYPE_BOOL, [float(v) for v in c.bool_false_true]
            spec = ControlSpec(
                name=ci.name, kind=kind, dtype=core_dtype(data_type), false_value=values[0], true_value=values[1]
            )
        if spec is not None:
            out.append(spec)
    return out, corrid_dtype, corrid_name


def _state_specs(
    model: str, sb: mc.ModelSequenceBatching, model_dir: Path, max_batch_size: int
) -> tuple[list[StateSpec], list[tuple[int, str]]]:
    out: list[StateSpec] = []
    outputs: list[tuple[int, str]] = []
    seen: set[str] = set()
    for st in sb.state:
        in_name = st.input_name or st.name
        out_name = st.output_name or st.name
        if in_name in seen:
            log.warning("model '%s': state input '%s' is given twice; the later one is ignored", model, in_name)
            continue
        seen.add(in_name)
        data, dims = read_initial_state(model_dir, st, max_batch_size)
        outputs.append((len(out), out_name))
        out.append(
            StateSpec(
                input_name=in_name,
                output_name=out_name,
                dtype=core_dtype(st.data_type),
                dims=list(st.dims),
                initial=data,
                initial_dims=list(dims),
                same_buffer=st.use_same_buffer_for_input_output,
            )
        )
    return out, outputs


def _env_int(name: str) -> int:
    raw = os.environ.get(name, "")
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        log.warning("ignoring %s=%r: not an integer", name, raw)
        return 0
