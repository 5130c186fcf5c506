"""The front-ends' own metrics, beside the engine's (api/metrics.py): connections open and refused
per protocol and reason, and how gRPC streams met their bounds. Read at each scrape."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.metrics_core import Metric

from seqserve.api.grpc.stream import StreamStats
from seqserve.api.limits import ConnectionAdmission

CONNECTIONS_OPEN = ("seqserve_connections_open", "Connections served now, per protocol (http, grpc)")
CONNECTIONS_REFUSED = (
    "seqserve_connections_refused_total",
    "Connections refused at accept, per protocol and reason: total (the server's cap), peer (the cap per "
    "client address), stopping (the server drains)",
)
STREAM_REFUSED_AT_ONCE = (
    "seqserve_grpc_stream_refused_at_once_total",
    "Temporary refusals (a full backlog) written on a request-order gRPC stream ahead of the replies before them",
)
RING_FULL_PAUSES = (
    "seqserve_worker_reading_paused_total",
    "Times a front-end worker process stopped reading its connections because its request ring to the engine "
    "(or its slab pool) was full",
)
RING_FULL_SECONDS = (
    "seqserve_worker_reading_paused_seconds_total",
    "Seconds the front-end worker processes spent with their connections paused for a full request ring",
)
STREAM_READING_PAUSED = (
    "seqserve_grpc_stream_reading_paused_total",
    "Times a gRPC stream stopped reading because it had --grpc-max-stream-backlog requests unanswered",
)


class FrontEndMetrics:
    """The counts of the front-ends that are up: their connection admissions (by protocol) and
    the gRPC streams' statistics."""

    __slots__ = ("admissions", "ring_full", "stream_stats")

    def __init__(self, admissions: Mapping[str, ConnectionAdmission], stream_stats: StreamStats | None) -> None:
        self.admissions = admissions
        self.stream_stats = stream_stats
        self.ring_full: tuple[int, float] | None = None  # with workers: (pauses, seconds paused)

    def collect(self) -> Iterable[Metric]:
        out: list[Metric] = []
        if self.admissions:
            opened = Metric(CONNECTIONS_OPEN[0], CONNECTIONS_OPEN[1], "gauge")
            refused = Metric(CONNECTIONS_REFUSED[0], CONNECTIONS_REFUSED[1], "counter")
            for protocol, admission in self.admissions.items():
                opened.add_sample(opened.name, {"protocol": protocol}, admission.total)
                for reason, n in admission.refused.items():
                    refused.add_sample(refused.name, {"protocol": protocol, "reason": reason}, n)
            out += [opened, refused]
        stats = self.stream_stats
        if stats is not None:
            for (name, doc), value in (
                (STREAM_REFUSED_AT_ONCE, stats.refused_at_once),
                (STREAM_READING_PAUSED, stats.reading_paused),
            ):
                m = Metric(name, doc, "counter")
                m.add_sample(name, {}, value)
                out.append(m)
        if self.ring_full is not None:
            for (name, doc), amount in zip((RING_FULL_PAUSES, RING_FULL_SECONDS), self.ring_full, strict=True):
                m = Metric(name, doc, "counter")
                m.add_sample(name, {}, amount)
                out.append(m)
        return out
