"""Request tracing (Triton's trace extension and ``--trace-config``): settings, sampling, the
trace file and OpenTelemetry export, the HTTP and gRPC settings endpoints. The engine's side
is ``seqserve.engine.tracing``. See docs/observability.md, "Traces"."""

from __future__ import annotations

from seqserve.api.tracing.endpoints import grpc_trace_setting, http_trace_setting
from seqserve.api.tracing.manager import TraceManager, install_tracing, trace_manager
from seqserve.api.tracing.settings import TraceConfig, TraceSetting

__all__ = [
    "TraceConfig",
    "TraceManager",
    "TraceSetting",
    "grpc_trace_setting",
    "http_trace_setting",
    "install_tracing",
    "trace_manager",
]
