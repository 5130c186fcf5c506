"""The ``opentelemetry`` trace mode: each sampled request becomes three spans, exported over
OTLP/HTTP (protobuf) by opentelemetry-sdk's batch processor (its own thread, so the event loop
never waits on the collector): ``InferRequest`` (the whole request; a child of the client's
span when it sent a W3C ``traceparent``), the model's span (named after the model: queue and
compute events, the sequence and batch attributes) and ``compute`` (COMPUTE_START to
COMPUTE_END). Needs the ``otel`` extra: ``pip install 'seqserve[otel]'``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from seqserve import __version__
from seqserve.api.tracing.records import Durations, SampledTrace
from seqserve.api.tracing.settings import OtelSettings
from seqserve.engine import InferenceError
from seqserve.engine.tracing import COMPUTE_END, COMPUTE_START, REQUEST_END, REQUEST_START

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

MISSING = (
    "the opentelemetry trace mode needs opentelemetry-sdk and its OTLP/HTTP exporter: pip install 'seqserve[otel]'"
)


class OtelExporter:
    """Sampled traces -> spans -> the OTLP/HTTP endpoint ``settings.url``."""

    def __init__(self, settings: OtelSettings) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise RuntimeError(MISSING) from None
        resource = Resource.create(
            {"service.name": "seqserve", "service.version": __version__, **dict(settings.resource)}
        )
        self._provider: TracerProvider = TracerProvider(resource=resource)
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=settings.url),
                max_queue_size=settings.bsp_max_queue_size,
                schedule_delay_millis=settings.bsp_schedule_delay_ms,
                max_export_batch_size=min(settings.bsp_max_export_batch_size, settings.bsp_max_queue_size),
            )
        )
        self._tracer = self._provider.get_tracer("seqserve", __version__)
        self._propagator = TraceContextTextMapPropagator()
        # the trace's steady-clock stamps, as the wall-clock times spans carry
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def export(self, trace: SampledTrace) -> None:
        from opentelemetry import trace as otel_trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        stamps = dict(trace.timestamps)
        wall = {name: ns + self._offset_ns for name, ns in stamps.items()}
        start, end = wall[REQUEST_START], wall.get(REQUEST_END, wall[REQUEST_START])
        parent = (
            self._propagator.extract({"traceparent": trace.request.trace_parent})
            if trace.request.trace_parent
            else None
        )
        root = self._tracer.start_span("InferRequest", context=parent, kind=SpanKind.SERVER, start_time=start)
        root.set_attribute("triton.trace_id", trace.id)
        if trace.request.id:
            root.set_attribute("triton.request_id", trace.request.id)
        model = self._tracer.start_span(trace.model, context=otel_trace.set_span_in_context(root), start_time=start)
        for key, value in _attributes(trace, Durations(stamps)).items():
            model.set_attribute(key, value)
        for name, ns in wall.items():
            if not name.startswith("COMPUTE"):
                model.add_event(name, timestamp=ns)
        if COMPUTE_START in wall:
            compute = self._tracer.start_span(
                "compute", context=otel_trace.set_span_in_context(model), start_time=wall[COMPUTE_START]
            )
            for name, ns in wall.items():
                if name.startswith("COMPUTE"):
                    compute.add_event(name, timestamp=ns)
            compute.end(end_time=wall.get(COMPUTE_END, wall[COMPUTE_START]))
        if isinstance(trace.outcome, InferenceError):
            status = Status(StatusCode.ERROR, trace.outcome.message)
            model.set_status(status)
            root.set_status(status)
        model.end(end_time=end)
        root.end(end_time=end)

    def close(self) -> None:
        """Export what is queued, then stop (blocks up to the exporter's timeout)."""
        self._provider.shutdown()


def _attributes(trace: SampledTrace, d: Durations) -> dict[str, Any]:
    r = trace.request
    attrs: dict[str, Any] = {
        "triton.model_name": trace.model,
        "triton.model_version": int(trace.version) if trace.version.isdigit() else -1,
        "triton.trace_id": trace.id,
        "seqserve.sequence_start": r.sequence_start,
        "seqserve.sequence_end": r.sequence_end,
        "seqserve.batch_size": trace.batch_size,
        "seqserve.instance": trace.instance,
    }
    if r.sequence_id:
        attrs["seqserve.sequence_id"] = str(r.sequence_id)
    if trace.slot >= 0:
        attrs["seqserve.slot"] = trace.slot
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        value = getattr(d, name)
        if value is not None:
            attrs[f"seqserve.{name}_ns"] = value
    return attrs
