"""What one `seqserve serve` runs with, in groups that each travel whole to the part that
uses them: the engine's settings to the Server, a front-end's to the function that starts it.

The command line (api/cli) builds these once, after its checks; nothing changes them later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from seqserve.api.limits import DEFAULT_MAX_BODY_BYTES, GrpcLimits, HttpLimits
from seqserve.api.metrics import DEFAULT_INTERVAL_MS, DEFAULT_METRICS_PORT, MetricsConfig
from seqserve.api.security import Restrictions, TlsFiles
from seqserve.api.tracing.settings import TraceConfig
from seqserve.engine import (
    DEFAULT_INLINE_MAX_BATCH_US,
    DEFAULT_MAX_BACKLOG_SEQUENCES,
    DEFAULT_REPOSITORY_POLL_SECS,
    ModelControlMode,
    Server,
    SessionPolicy,
)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """The Server's settings, and how startup treats the models it loads."""

    model_repository: list[Path]  # several: Triton's repeated --model-repository
    model_control: ModelControlMode = ModelControlMode.NONE
    startup_models: list[str] | None = None  # None: every model of the repository
    repository_poll_secs: float = DEFAULT_REPOSITORY_POLL_SECS
    exit_on_error: bool = True  # a model that fails to load at startup ends startup (Triton's default)
    strict_readiness: bool = True  # /v2/health/ready is false while a model failed to load
    exit_timeout_s: float = 30.0
    strict_sequence_ids: bool = False
    max_backlog_sequences: int = DEFAULT_MAX_BACKLOG_SEQUENCES  # per model; 0: no bound
    sessions: SessionPolicy = field(default_factory=SessionPolicy)
    python_isolation: str = "thread"  # or "process": see docs/isolation.md
    inline_max_batch_us: int = DEFAULT_INLINE_MAX_BATCH_US  # 0: never run batches on the loop
    server_id: str = "seqserve"  # the server metadata's name (Triton's --id)
    model_config_name: str | None = None  # configs/<name>.pbtxt (Triton's --model-config-name)
    auto_complete_config: bool = True  # Triton's --disable-auto-complete-config turns it off
    default_max_batch_size: int = 4  # Triton's --backend-config=default-max-batch-size
    backend_directory: Path | None = None  # third-party backends (Triton's --backend-directory)
    kind_gpu_on_cpu: bool = False  # KIND_GPU groups without a usable GPU run on the CPU

    def new_server(self) -> Server:
        """The Server these settings describe, not started."""
        return Server(
            self.model_repository,
            exit_timeout_s=self.exit_timeout_s,
            auto_sequence_ids=not self.strict_sequence_ids,
            model_control=self.model_control,
            repository_poll_secs=self.repository_poll_secs,
            strict_readiness=self.strict_readiness,
            sessions=self.sessions,
            python_isolation=self.python_isolation,
            max_backlog_sequences=self.max_backlog_sequences,
            inline_max_batch_us=self.inline_max_batch_us,
            server_id=self.server_id,
            model_config_name=self.model_config_name,
            auto_complete_config=self.auto_complete_config,
            default_max_batch_size=self.default_max_batch_size,
            backend_directory=self.backend_directory,
            kind_gpu_on_cpu=self.kind_gpu_on_cpu,
        )


def resolve_http_server(choice: str) -> str:
    """``auto`` is seqserve's own server (its parser, httptools, is a dependency)."""
    return "builtin" if choice == "auto" else choice


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """The HTTP front-end: where it listens, which server runs it, its limits and security."""

    host: str = "0.0.0.0"
    port: int = 8000
    server: str = "auto"  # "builtin", "hypercorn", "granian", or "auto" (resolve_http_server)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    limits: HttpLimits = field(default_factory=HttpLimits)
    tls: TlsFiles | None = None  # None: plain HTTP
    restricted: Restrictions = field(default_factory=Restrictions)
    reuse_port: bool = False  # SO_REUSEPORT (Triton's --reuse-http-port)
    header_forward: re.Pattern[str] | None = None  # headers passed as request parameters

    @property
    def kind(self) -> str:
        """The server that runs it: "builtin", "hypercorn" or "granian"."""
        return resolve_http_server(self.server)


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    """The gRPC front-end: where it listens, which server runs it, its limits and security,
    and whether sequences started on a stream end with it."""

    host: str = "0.0.0.0"
    port: int = 8001
    server: str = "auto"  # "builtin", "grpcio", or "auto" (builtin)
    limits: GrpcLimits = field(default_factory=GrpcLimits)
    tls: TlsFiles | None = None  # None: plain gRPC
    restricted: Restrictions = field(default_factory=Restrictions)
    stream_scoped: bool = False
    reuse_port: bool = False  # SO_REUSEPORT (Triton's --reuse-grpc-port)
    header_forward: re.Pattern[str] | None = None  # metadata passed as ModelInfer parameters

    @property
    def kind(self) -> str:
        """The server that runs it: "grpcio" (grpc.aio) or "builtin"."""
        return "grpcio" if self.server == "grpcio" else "builtin"


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """The Prometheus endpoint."""

    host: str = "0.0.0.0"  # the command line's default: the HTTP address, as in Triton
    port: int = DEFAULT_METRICS_PORT
    interval_ms: int = DEFAULT_INTERVAL_MS
    config: MetricsConfig = field(default_factory=MetricsConfig)
    cpu: bool = True  # the host's CPU and memory metrics (Triton's --allow-cpu-metrics)
    gpu: bool = True  # the GPU metrics, where there is a GPU (Triton's --allow-gpu-metrics)


@dataclass(frozen=True, slots=True)
class StateStoreOptions:
    """The store that replicas share sequences through (docs/state-store.md)."""

    url: str  # redis://host:port/db or dir:///path
    replica_id: str | None = None  # None: hostname-pid-random
    spill_idle_s: float = 0.0  # idle sequences move to the store after this long (0: never)
    handover_timeout_s: float = 2.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything `serve` runs with; a part that is None is off."""

    engine: EngineOptions
    http: HttpOptions | None = field(default_factory=HttpOptions)
    grpc: GrpcOptions | None = field(default_factory=GrpcOptions)
    metrics: MetricsOptions | None = field(default_factory=MetricsOptions)
    state_store: StateStoreOptions | None = None
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config
    workers: int = 1  # front-end worker processes (1: the engine's process serves them itself)
