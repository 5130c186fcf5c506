"""A model version's counters as one snapshot: what a metrics exporter reads at scrape time.

Everything comes from counts the core already keeps (one lock acquisition per model version)
plus the few the Python side keeps (requests refused before they reached the core, requests a
batch failed alone). Durations are in microseconds, as Triton's metrics report them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelCounters:
    model: str
    version: str
    tags: dict[str, str]  # the config's metric_tags
    success: int  # requests answered successfully
    failure: dict[str, int]  # failed requests by Triton's reason: REJECTED, CANCELED, BACKEND, OTHER
    inference_count: int  # inferences performed (padding rows excluded)
    execution_count: int  # model executions
    request_duration_us: int  # cumulative, successful requests: arrival to the end of their batch
    queue_duration_us: int
    compute_input_duration_us: int
    compute_infer_duration_us: int
    compute_output_duration_us: int
    pending_requests: int  # waiting for a batch or a slot, now
    #: latency histogram: (upper bound in ms, cumulative count) per bucket, +Inf last; sum in ms
    latency_buckets: list[tuple[float, int]] = field(default_factory=list)
    latency_sum_ms: float = 0.0
    is_sequence: bool = False
    sequence_slots: int = 0
    sequences_active: int = 0  # slots held by a sequence
    sequences_backlogged: int = 0
    sequences_started: int = 0
    sequences_ended: int = 0
    sequences_expired: int = 0
    sequences_released: int = 0  # checkpointed and released from their slot: moved, neither ended nor expired
    sequences_restored: int = 0  # restored into a slot from a checkpoint
    backlog_full: int = 0  # STARTs refused because the backlog held max_backlog_sequences sequences
    tombstones_evicted: int = 0  # session tombstones the count caps dropped before their time
    tombstones_evicted_client_cap: int = 0  # ... by a client's own cap
    tombstones_evicted_global_cap: int = 0  # ... by the total cap (from the client holding the most)
    session_starts_refused: int = 0  # new sessions refused: their client had too many evicted lately
    state_bytes: int = 0  # implicit state held by the sequences in slots
    #: inline execution (docs/architecture.md): its bound (0: the model never runs on the event loop)
    inline_max_batch_us: float = 0.0
    inline_active: bool = False  # its batches run on the event loop now
    inline_batches: int = 0  # batches the event loop ran
    inline_slow_batches: int = 0  # batches over the bound while inline
    inline_demotions: int = 0  # times it went back to its executor threads
