"""What one model version reports about itself: metadata, statistics, metrics counters, the
slot table for diagnostics, inline execution."""

from __future__ import annotations

from typing import Any

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import Duration, InlineStats, Scheduler
from seqserve.engine.counters import ModelCounters
from seqserve.engine.model.delivery import Delivery
from seqserve.engine.model.rings import RingRows
from seqserve.engine.model.spec import CoreSpec
from seqserve.engine.model.validation import RequestValidator
from seqserve.engine.tensors import wire_dtype_name


class ModelReports:
    """Reads what one model version's parts counted (the core, the validator, the delivery)
    and reports it; it counts nothing itself."""

    def __init__(
        self,
        cfg: mc.ModelConfig,
        version_str: str,
        *,
        core: Scheduler,
        spec: CoreSpec,
        validator: RequestValidator,
        delivery: Delivery,
    ) -> None:
        self.config = cfg
        self.name = cfg.name
        self.version_str = version_str
        self.max_batch_size = cfg.max_batch_size
        self.is_sequence = cfg.HasField("sequence_batching")
        self._core = core
        self._spec = spec
        self._validator = validator
        self._delivery = delivery
        #: requests from the workers' rings on the compiled path: their refusals count here too
        self.ring: RingRows | None = None

    def _refused(self) -> int:
        return self._validator.failures + (self.ring.refused() if self.ring is not None else 0)

    def metadata(self) -> dict[str, Any]:
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            "name": self.name,
            "versions": [self.version_str],
            "platform": self.config.platform or self.config.backend,
            "inputs": [
                {"name": t.name, "datatype": wire_dtype_name(t.data_type), "shape": [*batch, *t.dims]}
                for t in self.config.input
            ],
            "outputs": [
                {"name": t.name, "datatype": wire_dtype_name(t.data_type), "shape": [*batch, *t.dims]}
                for t in self.config.output
            ],
        }

    def scheduler_state(self) -> dict[str, Any]:
        """Live view of the slot table, for diagnostics."""
        stats = self._core.stats()
        return {
            "free_slots": self._core.free_slots(),
            "backlog_sequences": self._core.backlog_sequences(),
            "max_backlog_sequences": self._spec.scheduler.max_backlog_sequences,
            "pending_requests": self._core.pending_requests(),
            "sequences": dict(self._core.sequences()),
            "backlog_full": stats.backlog_full,
            "cancelled": stats.fail_canceled,
        }

    def statistics(self) -> dict[str, Any]:
        """The core's counts (durations in ns), plus the requests refused before reaching it
        and those a batch failed alone."""
        s = self._core.stats()
        refused = self._refused()
        alone = self._delivery.request_failures
        return {
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "last_inference": s.last_inference_ms,
            "success": _duration(s.success, -alone),
            "fail": _duration(s.fail, refused + alone),
            "queue": _duration(s.queue),
            "compute_input": _duration(s.compute_input),
            "compute_infer": _duration(s.compute_infer),
            "compute_output": _duration(s.compute_output),
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": _duration(b.compute_input),
                    "compute_infer": _duration(b.compute_infer),
                    "compute_output": _duration(b.compute_output),
                }
                for size, b in sorted(s.batches.items())
            ],
        }

    def counters(self, *, rejected_here: int) -> ModelCounters:
        """Everything a metrics exporter reports for this version, read now (one core call).
        ``rejected_here``: requests the core refused as UNAVAILABLE (queue full, stopping); the
        compiled path's such refusals are added here."""
        s = self._core.stats()
        inline = self._core.inline_stats()
        refused = self._refused()
        alone = self._delivery.request_failures
        rejected = s.fail_rejected + rejected_here + (self.ring.rejected() if self.ring is not None else 0)
        backend = s.fail_backend + alone
        fail = s.fail.count + refused + alone
        cumulative = 0
        buckets = []
        for bound, n in zip([*self._spec.scheduler.latency_buckets_ms, float("inf")], s.latency_counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        return ModelCounters(
            model=self.name,
            version=self.version_str,
            tags=dict(self.config.metric_tags),
            success=s.success.count - alone,
            failure={
                "REJECTED": rejected,
                "CANCELED": s.fail_canceled,
                "BACKEND": backend,
                "OTHER": max(0, fail - rejected - s.fail_canceled - backend),
            },
            inference_count=s.inference_count,
            execution_count=s.execution_count,
            request_duration_us=s.success.ns // 1000,
            queue_duration_us=s.queue.ns // 1000,
            compute_input_duration_us=s.compute_input.ns // 1000,
            compute_infer_duration_us=s.compute_infer.ns // 1000,
            compute_output_duration_us=s.compute_output.ns // 1000,
            pending_requests=s.pending_requests,
            latency_buckets=buckets,
            latency_sum_ms=s.latency_sum_ms,
            is_sequence=self.is_sequence,
            sequence_slots=s.sequence_slots,
            sequences_active=s.sequences_active,
            sequences_backlogged=s.sequences_backlogged,
            sequences_started=s.sequences_started,
            sequences_ended=s.sequences_ended,
            sequences_expired=s.sequences_expired,
            sequences_released=s.sequences_released,
            sequences_restored=s.sequences_restored,
            backlog_full=s.backlog_full,
            tombstones_evicted=s.tombstones_evicted,
            tombstones_evicted_client_cap=s.tombstones_evicted_client_cap,
            tombstones_evicted_global_cap=s.tombstones_evicted_global_cap,
            session_starts_refused=s.session_starts_refused,
            state_bytes=s.state_bytes,
            inline_max_batch_us=inline.max_batch_us,
            inline_active=inline.active,
            inline_batches=inline.inline_batches,
            inline_slow_batches=inline.slow_batches,
            inline_demotions=inline.demotions,
        )

    def inline_stats(self) -> InlineStats:
        """Inline execution: its bound (0: never inline), whether it is on now, and how many
        batches ran inline and on executor threads (docs/architecture.md, "Inline execution")."""
        return self._core.inline_stats()


def _duration(d: Duration, extra: int = 0) -> dict[str, int]:
    return {"count": d.count + extra, "ns": d.ns}
