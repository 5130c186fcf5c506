"""Prometheus metrics on their own port (Triton's ``--metrics-port``, 8002 by default), with
Triton's metric names, types, help texts and labels, plus seqserve's sequence metrics. See
docs/metrics.md.

**Nothing is counted for metrics on the request path.** ``SeqserveCollector`` is a
prometheus-client collector that, at scrape time, reads the counters the compiled core keeps
anyway (``Server.model_counters()``: one lock acquisition per model version, under which the
core copies its statistics) and turns them into metric families.

**Triton's exposition.** prometheus-client renders a counter ``x`` as ``x_total``; Triton
(prometheus-cpp) does not, and dashboards built for Triton query ``nv_inference_count``. So
``exposition()`` writes the text format itself, each family under its own name; seqserve's own
counters follow the Prometheus convention and end in ``_total``.

**The listener** is a small HTTP/1.1 server on the event loop (``asyncio.start_server``), not
prometheus-client's server thread: a scrape renders in well under a millisecond per model and
then leaves the loop alone, whereas a second Python thread would compete for the GIL with the
loop and the executors for as long as it runs and hand it back only at the interpreter's switch
interval (5 ms), a latency spike for every request in flight. It answers ``GET /metrics``
(and ``HEAD``), keeps connections alive, bounds request heads (8 KiB) and idle connections
(30 s), and answers anything else 404 / 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from seqserve.api.latency_summaries import DEFAULT_QUANTILES, LatencySummaries, parse_quantiles
from seqserve.api.metric_families import custom_families, summary_families
from seqserve.engine import ModelCounters, Server
from seqserve.engine.device.nvml import GPU_FAMILIES, GpuMetricsReader

log = logging.getLogger("seqserve.metrics")

DEFAULT_METRICS_PORT = 8002
DEFAULT_INTERVAL_MS = 2000  # Triton's --metrics-interval-ms default

#: Triton's failure reasons (core ``metric_model_reporter.cc``), each a series from the start
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# (name, type, help) exactly as Triton registers them (core src/metrics.cc).
_TRITON_COUNTERS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)"),
)
_TRITON_LATENCY_COUNTERS = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        "request_duration_us",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        "queue_duration_us",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input_duration_us",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer_duration_us",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        "compute_output_duration_us",
    ),
)
PENDING = (
    "nv_inference_pending_request_count",
    "Instantaneous number of pending requests awaiting execution per-model.",
)
FIRST_RESPONSE = ("nv_inference_first_response_histogram_ms", "Duration from request to first response in milliseconds")
CPU = (
    ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes"),
)
# seqserve's sequence metrics, per sequence model version: (name, type, help, ModelCounters field).
_SEQUENCE = (
    ("seqserve_sequence_slots", "gauge", "Sequence slots of the model's instances", "sequence_slots"),
    ("seqserve_sequence_active", "gauge", "Sequence slots held by a live sequence", "sequences_active"),
    ("seqserve_sequence_backlog", "gauge", "Sequences waiting in the backlog for a slot", "sequences_backlogged"),
    (
        "seqserve_sequence_started_total",
        "counter",
        "Sequences started: START requests accepted, START implied by a new session included",
        "sequences_started",
    ),
    (
        "seqserve_sequence_ended_total",
        "counter",
        "Sequences ended by an END request, through the sequence API, by cancellation or with their stream",
        "sequences_ended",
    ),
    (
        "seqserve_sequence_expired_total",
        "counter",
        "Sequences expired after max_sequence_idle_microseconds without a request",
        "sequences_expired",
    ),
    (
        "seqserve_sequence_released_total",
        "counter",
        "Sequences checkpointed and released from their slot to move to another server (not ended)",
        "sequences_released",
    ),
    (
        "seqserve_sequence_restored_total",
        "counter",
        "Sequences restored into a slot from a checkpoint",
        "sequences_restored",
    ),
    ("seqserve_sequence_state_bytes", "gauge", "Bytes of implicit state held by the sequences in slots", "state_bytes"),
    (
        "seqserve_sequence_backlog_full_total",
        "counter",
        "STARTs refused at once because the backlog held max_backlog_sequences sequences",
        "backlog_full",
    ),
    (
        "seqserve_session_tombstones_evicted_total",
        "counter",
        "Ended sessions' records dropped by a count cap before their time (their ids get no implied START)",
        "tombstones_evicted",
    ),
    (
        "seqserve_session_tombstones_evicted_client_cap_total",
        "counter",
        "Ended sessions' records dropped because their client held --session-tombstone-max-per-client",
        "tombstones_evicted_client_cap",
    ),
    (
        "seqserve_session_tombstones_evicted_global_cap_total",
        "counter",
        "Ended sessions' records dropped at --session-tombstone-max, from the client holding the most",
        "tombstones_evicted_global_cap",
    ),
    (
        "seqserve_session_starts_refused_total",
        "counter",
        "New sessions refused (503) because their client had too many ended sessions dropped lately",
        "session_starts_refused",
    ),
)

# Inline execution, per model version that may run its batches on the event loop (a bound > 0).
_INLINE = (
    ("seqserve_inline_active", "gauge", "1 while the model's batches run on the event loop's thread", "inline_active"),
    ("seqserve_inline_batches_total", "counter", "Batches the event loop ran (the rest ran on executor threads)",
     "inline_batches"),
    ("seqserve_inline_slow_batches_total", "counter", "Batches over the inline bound while the model ran inline",
     "inline_slow_batches"),
    ("seqserve_inline_demotions_total", "counter", "Times the model went back to its executor threads",
     "inline_demotions"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Triton's ``--metrics-config`` settings that seqserve reads."""

    counter_latencies: bool = True  # the nv_inference_*_duration_us counters
    histogram_latencies: bool = False  # nv_inference_first_response_histogram_ms (off, as in Triton)
    summary_latencies: bool = False  # the nv_inference_*_summary_us summaries (off, as in Triton)
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES

    @classmethod
    def parse(cls, settings: Iterable[str]) -> MetricsConfig:
        """``key=value`` strings, as ``--metrics-config`` takes them; ValueError says what is wrong."""
        values: dict[str, Any] = {}
        for item in settings:
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep:
                raise ValueError(f"--metrics-config '{item}' is not <setting>=<value>")
            if key == "summary_quantiles":
                values[key] = parse_quantiles(value.strip().strip('"'))
                continue
            if key not in ("counter_latencies", "histogram_latencies", "summary_latencies"):
                raise ValueError(
                    f"--metrics-config: unknown setting '{key}' "
                    "(known: counter_latencies, histogram_latencies, summary_latencies, summary_quantiles)"
                )
            b = parse_bool(value)
            if b is None:
                raise ValueError(f"--metrics-config {key}: '{value}' is not true or false")
            values[key] = b
        return cls(**values)


def parse_bool(value: str) -> bool | None:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    return None


class SeqserveCollector(Collector):
    """Every loaded model version's metrics, read at scrape time, plus the host's CPU metrics
    (refreshed at most once per ``interval_ms``, Triton's "per interval" metrics)."""

    def __init__(
        self,
        server: Server,
        config: MetricsConfig | None = None,
        *,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        summaries: LatencySummaries | None = None,
        cpu: bool = True,
        gpu: bool = True,
        extra: Callable[[], Iterable[Metric]] | None = None,
    ) -> None:
        """``summaries``: the latency summaries (``summary_latencies``), fed by the trace hook.
        ``cpu`` / ``gpu``: serve the host's CPU and memory metrics, and Triton's GPU metrics
        (through NVML, when there is a GPU: engine/device/nvml.py), as ``--allow-cpu-metrics``
        and ``--allow-gpu-metrics`` say. ``extra``: more families, read at each scrape (the
        front-ends' connection counts)."""
        self.server = server
        self.extra = extra
        self.config = config or MetricsConfig()
        self.summaries = summaries
        self._cpu = _CpuSampler(interval_ms / 1000.0) if cpu else None
        self._gpu = GpuMetricsReader() if gpu else None
        if self._gpu is not None and not self._gpu.available:
            log.debug("no GPU metrics: %s", self._gpu.reason)

    def describe(self) -> list[Metric]:
        return []  # registering the collector does not scrape

    def collect(self) -> Iterable[Metric]:
        counters = self.server.model_counters()
        families: list[Metric] = []

        def family(name: str, typ: str, doc: str) -> Metric:
            m = Metric(name, doc, typ)
            families.append(m)
            return m

        success, failure, count, execs = (family(n, "counter", d) for n, d in _TRITON_COUNTERS)
        latency = []
        if self.config.counter_latencies:
            latency = [(family(n, "counter", d), attr) for n, d, attr in _TRITON_LATENCY_COUNTERS]
        pending = family(PENDING[0], "gauge", PENDING[1])
        first = family(FIRST_RESPONSE[0], "histogram", FIRST_RESPONSE[1]) if self.config.histogram_latencies else None
        sequence = [(family(n, t, d), attr) for n, t, d, attr in _SEQUENCE]
        inline = [(family(n, t, d), attr) for n, t, d, attr in _INLINE]
        for c in counters:
            labels = model_labels(c)
            success.add_sample(success.name, labels, c.success)
            for reason in FAILURE_REASONS:
                failure.add_sample(failure.name, {**labels, "reason": reason}, c.failure.get(reason, 0))
            count.add_sample(count.name, labels, c.inference_count)
            execs.add_sample(execs.name, labels, c.execution_count)
            for m, attr in latency:
                m.add_sample(m.name, labels, getattr(c, attr))
            pending.add_sample(pending.name, labels, c.pending_requests)
            if first is not None:
                for bound, n in c.latency_buckets:
                    first.add_sample(first.name + "_bucket", {**labels, "le": _number(bound)}, n)
                first.add_sample(first.name + "_sum", labels, c.latency_sum_ms)
                first.add_sample(first.name + "_count", labels, c.latency_buckets[-1][1] if c.latency_buckets else 0)
            if c.is_sequence:
                for m, attr in sequence:
                    m.add_sample(m.name, labels, getattr(c, attr))
            if c.inline_max_batch_us > 0:
                for m, attr in inline:
                    m.add_sample(m.name, labels, int(getattr(c, attr)))
        if self.summaries is not None:
            families += summary_families(self.summaries, [(c.model, c.version, model_labels(c)) for c in counters])
        if self._cpu is not None:
            for (name, doc), value in zip(CPU, self._cpu.read(), strict=True):
                if value is not None:
                    family(name, "gauge", doc).add_sample(name, {}, value)
        if self._gpu is not None and self._gpu.available:
            families += gpu_families(self._gpu)
        if self.extra is not None:
            families.extend(self.extra())
        own = {m.name for m in families}
        families += [m for m in custom_families() if m.name not in own]  # a model cannot shadow these
        return [m for m in families if m.samples]


def gpu_families(reader: GpuMetricsReader) -> list[Metric]:
    """Triton's GPU families, one series per GPU labelled ``gpu_uuid``."""
    samples = reader.read()
    out = []
    for name, typ, doc in GPU_FAMILIES:
        m = Metric(name, doc, typ)
        for s in samples:
            if name in s.values:
                m.add_sample(name, {"gpu_uuid": s.uuid}, s.values[name])
        out.append(m)
    return out


def model_labels(c: ModelCounters) -> dict[str, str]:
    """Triton's labels: model, version, and each metric_tags entry as ``_<key>``."""
    return {"model": c.model, "version": c.version, **{"_" + k: v for k, v in c.tags.items()}}


# ------------------------------------------------------------------------- exposition

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def exposition(collector: Collector) -> bytes:
    """The Prometheus text format (0.0.4) of what ``collector`` collects, every family under
    its own name (a counter keeps its name: no ``_total`` is added), labels sorted as
    prometheus-cpp sorts them."""
    out: list[str] = []
    for m in collector.collect():
        out.append(f"# HELP {m.name} {_escape_help(m.documentation)}\n")
        out.append(f"# TYPE {m.name} {'untyped' if m.type == 'unknown' else m.type}\n")
        for s in m.samples:
            if s.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(s.labels.items()))
                out.append(f"{s.name}{{{labels}}} {_number(s.value)}\n")
            else:
                out.append(f"{s.name} {_number(s.value)}\n")
    return "".join(out).encode()


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    if v == int(v) and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


# ------------------------------------------------------------------------ CPU metrics


class _CpuSampler:
    """Triton's CPU metrics from /proc/stat and /proc/meminfo (used = MemTotal - MemAvailable),
    read again at most once per interval; utilization is the busy share of the time between two
    readings. (None, None, None) where /proc is not there."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._at = -math.inf
        self._ticks: tuple[int, int] | None = None  # (busy, total)
        self._values: tuple[float | None, float | None, float | None] = (None, None, None)
        with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
            self._poll()  # the first scrape's utilization covers the time since startup

    def read(self) -> tuple[float | None, float | None, float | None]:
        now = time.monotonic()
        if now - self._at >= self.interval_s:
            self._at = now
            with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
                self._values = self._poll()
        return self._values

    def _poll(self) -> tuple[float | None, float | None, float | None]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        total = sum(fields[:8])  # guest time is already in user and nice
        util = 0.0
        if self._ticks is not None and total > self._ticks[1]:
            util = min(1.0, max(0.0, ((total - idle) - self._ticks[0]) / (total - self._ticks[1])))
        self._ticks = (total - idle, total)
        mem: dict[str, int] = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                mem[key] = int(rest.split()[0]) * 1024
        return util, float(mem["MemTotal"]), float(mem["MemTotal"] - mem["MemAvailable"])


# --------------------------------------------------------------------------- listener

_MAX_HEAD = 8192
_MAX_BODY = 65536
_IDLE_S = 30.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}


class MetricsServer:
    """``GET /metrics`` on its own port, served on the running event loop."""

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(
        self, host: str | None = None, port: int | None = None, *, sock: socket.socket | None = None
    ) -> None:
        """Listen on host:port, or on the listening socket ``sock``."""
        if sock is not None:
            self._server = await asyncio.start_server(self._accept, sock=sock, limit=_MAX_HEAD)
        else:
            self._server = await asyncio.start_server(self._accept, host, port, limit=_MAX_HEAD)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._clients):
            task.cancel()
        for task in list(self._clients):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._server.wait_closed()
        self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            while await self._one(reader, writer):
                pass
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection is to be closed."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _IDLE_S)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._reply(writer, 400, b"bad request\n", close=True)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > _MAX_BODY or "transfer-encoding" in headers:
            await self._reply(writer, 413, b"request body not accepted\n", close=True)
            return False
        if int(length):
            await asyncio.wait_for(reader.readexactly(int(length)), _IDLE_S)
        connection = headers.get("connection", "").lower()
        close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if target.split("?", 1)[0] != "/metrics":
            await self._reply(writer, 404, b"Not Found\n", close=close)
        elif method not in ("GET", "HEAD"):
            await self._reply(writer, 405, b"Method Not Allowed\n", close=close, allow="GET, HEAD")
        else:
            body = self._render()
            await self._reply(writer, 200, body, close=close, content_type=CONTENT_TYPE, head=method == "HEAD")
        return not close

    @staticmethod
    async def _reply(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        *,
        close: bool,
        content_type: str = "text/plain; charset=utf-8",
        allow: str | None = None,
        head: bool = False,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
        ]
        if allow:
            lines.append(f"Allow: {allow}")
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body))
        await writer.drain()


async def start_metrics(
    server: Server,
    where: socket.socket | tuple[str, int],
    *,
    interval_ms: int = DEFAULT_INTERVAL_MS,
    config: MetricsConfig | None = None,
    summaries: LatencySummaries | None = None,
    cpu: bool = True,
    gpu: bool = True,
    extra: Callable[[], Iterable[Metric]] | None = None,
) -> MetricsServer:
    """Serve ``server``'s metrics at ``/metrics`` on the running loop: on a listening socket, or
    on (host, port); ``extra``: more families (``SeqserveCollector``)."""
    collector = SeqserveCollector(
        server, config, interval_ms=interval_ms, summaries=summaries, cpu=cpu, gpu=gpu, extra=extra
    )
    metrics = MetricsServer(lambda: exposition(collector))
    if isinstance(where, socket.socket):
        await metrics.start(sock=where)
    else:
        await metrics.start(*where)
    return metrics
