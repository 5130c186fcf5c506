"""What the process keeps for observing requests: the trace manager (``--trace-config`` and the
trace extension) and the latency summaries (``--metrics-config summary_latencies``), both fed
by the engine's trace hook. Started before the front-ends, closed after the drain."""

from __future__ import annotations

from dataclasses import dataclass

from seqserve.api.latency_summaries import LatencySummaries
from seqserve.api.serve_options import ServeOptions
from seqserve.api.tracing import TraceManager, install_tracing
from seqserve.engine import Server


@dataclass(slots=True)
class Observability:
    tracing: TraceManager
    summaries: LatencySummaries | None

    def close(self) -> None:
        """Write what the trace files hold; flush the OpenTelemetry exporter (blocks briefly)."""
        self.tracing.close()


def start_observability(server: Server, opts: ServeOptions) -> Observability:
    """RuntimeError when the configured tracing cannot run (the otel extra is missing)."""
    config = opts.metrics.config if opts.metrics is not None else None
    summaries = LatencySummaries(config.summary_quantiles) if config and config.summary_latencies else None
    tracing = install_tracing(server, opts.trace, observe=summaries.observe if summaries else None)
    return Observability(tracing, summaries)
