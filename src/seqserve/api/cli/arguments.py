"""From `serve`'s parsed flags to ServeOptions: the checks argparse cannot make (flags that
only make sense together, files, repositories), then the option groups, each built once."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from seqserve.api import security
from seqserve.api.cli.trace_flags import trace_config
from seqserve.api.cli.triton_flags import IGNORED_DEST, apply_triton_names
from seqserve.api.limits import GrpcLimits, HttpLimits
from seqserve.api.metrics import MetricsConfig
from seqserve.api.serve_options import (
    EngineOptions,
    GrpcOptions,
    HttpOptions,
    MetricsOptions,
    ServeOptions,
    StateStoreOptions,
    resolve_http_server,
)
from seqserve.engine import (
    DEFAULT_INLINE_MAX_BATCH_US,
    DEFAULT_REPOSITORY_POLL_SECS,
    WORKERS_INLINE_MAX_BATCH_US,
    ModelControlMode,
    SessionPolicy,
    startup_models,
)

DEMO_REPOSITORY = Path(__file__).resolve().parents[2] / "examples" / "models"


class UsageError(Exception):
    """A command line that cannot run: `seqserve` prints "seqserve: <message>" and exits 2."""


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The options `serve` runs with. The checks run in this order, and the first that fails
    is the one reported (UsageError)."""
    apply_triton_names(args)
    if args.http_port is None and args.grpc_port is None:
        raise UsageError("both front-ends are off; nothing to serve")
    http_tls, grpc_tls = _front_end_tls(args)
    http_server = _http_server(args, http_tls)
    _check_tls_files(args, http_tls, grpc_tls)
    http_restricted, grpc_restricted = _restrictions(args)
    mode, models = _model_control(args)
    metrics = _metrics(args)
    default_max_batch_size = _backend_config(args)
    _not_implemented_yet(args)
    for line in getattr(args, IGNORED_DEST, None) or []:
        logging.getLogger("seqserve").warning("%s", line)
    try:
        trace = trace_config(args)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return ServeOptions(
        _engine(args, mode, models, default_max_batch_size),
        http=_http(args, http_server, http_tls, http_restricted),
        grpc=_grpc(args, grpc_tls, grpc_restricted),
        metrics=metrics,
        state_store=_state_store(args),
        trace=trace,
        workers=_workers(args, http_server),
    )


def _workers(args: argparse.Namespace, http_server: str) -> int:
    """--workers; the worker processes share the engine's listening sockets, which granian and
    grpc.aio (each binding its own) cannot."""
    n: int = args.workers
    if n > 1:
        if args.http_port is not None and resolve_http_server(http_server) == "granian":
            raise UsageError("--workers needs the builtin or hypercorn HTTP server, not granian")
        if args.grpc_port is not None and args.grpc_server == "grpcio":
            raise UsageError("--workers needs the builtin gRPC server, not grpcio")
    return n


# ------------------------------------------------------------------------------- security


def _inline_bound(args: argparse.Namespace) -> int:
    """--inline-max-batch-us, whose default is larger under worker processes (where the batches
    run on the ring drain thread, not on an event loop that serves clients)."""
    if args.inline_max_batch_us is not None:
        return int(args.inline_max_batch_us)
    return WORKERS_INLINE_MAX_BATCH_US if args.workers > 1 else DEFAULT_INLINE_MAX_BATCH_US


def _front_end_tls(args: argparse.Namespace) -> tuple[security.TlsFiles | None, security.TlsFiles | None]:
    """Each front-end's TLS files: its own flags, else the shared ones (None: plain)."""
    chosen = {
        "HTTP": (args.http_port, args.http_tls_cert or args.tls_cert, args.http_tls_key or args.tls_key),
        "gRPC": (args.grpc_port, args.grpc_tls_cert or args.tls_cert, args.grpc_tls_key or args.tls_key),
    }
    client_cas = {
        "HTTP": args.http_tls_client_ca or args.tls_client_ca,
        "gRPC": args.grpc_tls_client_ca or args.tls_client_ca,
    }
    for what, (_, cert, key) in chosen.items():
        if bool(cert) != bool(key):
            raise UsageError(f"{what} TLS needs both a certificate and a key")
    for what, (port, cert, _) in chosen.items():
        if port is not None and client_cas[what] and not cert:
            raise UsageError(f"{what} mutual TLS (a client CA) needs TLS: give a certificate and a key")
    http, grpc = (
        security.TlsFiles(cert, key, client_cas[what]) if cert else None for what, (_, cert, key) in chosen.items()
    )
    return http, grpc


def _http_server(args: argparse.Namespace, tls: security.TlsFiles | None) -> str:
    """--http-server; granian is refused where mutual TLS needs client certificates that this
    granian cannot ask for, and an 'auto' that resolved to granian would become hypercorn ('auto'
    is the builtin server now, which can ask for them)."""
    if (
        args.http_port is not None
        and tls is not None
        and tls.client_ca
        and resolve_http_server(args.http_server) == "granian"
        and not security.granian_client_verify_supported()
    ):
        if args.http_server == "granian":
            raise UsageError(
                "this granian cannot require client certificates (mutual TLS); "
                "use --http-server hypercorn or a granian with ssl_client_verify"
            )
        return "hypercorn"  # auto: the server that can
    return str(args.http_server)


def _check_tls_files(args: argparse.Namespace, http: security.TlsFiles | None, grpc: security.TlsFiles | None) -> None:
    """Load the files of each front-end that is on, as its server will."""
    for what, port, tls in (("HTTP", args.http_port, http), ("gRPC", args.grpc_port, grpc)):
        if port is not None and tls is not None:
            try:
                security.check_tls(what, tls)
            except ValueError as e:
                raise UsageError(str(e)) from None


def _restrictions(args: argparse.Namespace) -> tuple[security.Restrictions, security.Restrictions]:
    try:
        return (
            security.Restrictions.parse("http-restricted-api", args.http_restricted_api),
            security.Restrictions.parse("grpc-restricted-protocol", args.grpc_restricted_protocol),
        )
    except security.RestrictionError as e:
        raise UsageError(str(e)) from None


# ------------------------------------------------------------------------------ the engine


def _model_control(args: argparse.Namespace) -> tuple[ModelControlMode, list[str] | None]:
    """The model control mode, and the models to load at startup (None: all)."""
    mode = ModelControlMode.parse(args.model_control_mode)
    try:
        models = startup_models(mode, args.load_model)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.repository_poll_secs is not None and mode is not ModelControlMode.POLL:
        logging.getLogger("seqserve").warning(
            "--repository-poll-secs is ignored: the repository is polled with --model-control-mode=poll only"
        )
    return mode, models


def _engine(
    args: argparse.Namespace, mode: ModelControlMode, models: list[str] | None, default_max_batch_size: int | None
) -> EngineOptions:
    repositories: list[Path] = args.model_repository or [DEMO_REPOSITORY]
    for repo in repositories:
        if not repo.is_dir():
            raise UsageError(f"model repository '{repo}' is not a directory")
    if args.backend_directory is not None and not args.backend_directory.is_dir():
        raise UsageError(f"--backend-directory '{args.backend_directory}' is not a directory")
    poll_secs = args.repository_poll_secs
    return EngineOptions(
        model_repository=repositories,
        model_control=mode,
        startup_models=models,
        repository_poll_secs=DEFAULT_REPOSITORY_POLL_SECS if poll_secs is None else poll_secs,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        exit_timeout_s=args.exit_timeout_secs,
        strict_sequence_ids=args.strict_sequence_ids,
        max_backlog_sequences=args.max_backlog_sequences,
        sessions=SessionPolicy(
            args.session_tombstone_secs, args.session_tombstone_max, args.session_tombstone_max_per_client
        ),
        python_isolation=args.python_isolation,
        inline_max_batch_us=_inline_bound(args),
        server_id=args.id or "seqserve",
        model_config_name=args.model_config_name,
        auto_complete_config=not args.disable_auto_complete_config and args.strict_model_config is not True,
        default_max_batch_size=4 if default_max_batch_size is None else default_max_batch_size,
        backend_directory=args.backend_directory,
        kind_gpu_on_cpu=args.kind_gpu_on_cpu,
    )


# ------------------------------------------------------------------------- the front-ends


def _http(
    args: argparse.Namespace, server: str, tls: security.TlsFiles | None, restricted: security.Restrictions
) -> HttpOptions | None:
    if args.http_port is None:
        return None  # off
    return HttpOptions(
        host=args.http_address or args.host,
        port=args.http_port,
        server=server,
        max_body_bytes=args.http_max_body_bytes,
        limits=HttpLimits(
            header_timeout_s=args.http_header_timeout_secs,
            body_timeout_s=args.http_body_timeout_secs,
            keepalive_s=args.http_keepalive_secs,
            max_connections=args.http_max_connections,
            max_connections_per_peer=args.http_max_connections_per_peer,
        ),
        tls=tls,
        restricted=restricted,
        reuse_port=args.reuse_http_port,
        header_forward=args.http_header_forward_pattern,
    )


def _grpc(
    args: argparse.Namespace, tls: security.TlsFiles | None, restricted: security.Restrictions
) -> GrpcOptions | None:
    if args.grpc_port is None:
        return None  # off
    return GrpcOptions(
        host=args.grpc_address or args.host,
        port=args.grpc_port,
        server=args.grpc_server,
        limits=GrpcLimits(
            max_receive_message_bytes=args.grpc_max_receive_message_bytes or args.http_max_body_bytes,
            max_send_message_bytes=args.grpc_max_send_message_bytes or args.http_max_body_bytes,
            max_concurrent_streams=args.grpc_max_concurrent_streams,
            max_connections=args.grpc_max_connections,
            max_connections_per_peer=args.grpc_max_connections_per_peer,
            stream_backlog=args.grpc_max_stream_backlog,
            max_connection_idle_s=args.grpc_max_connection_idle_secs,
            max_connection_age_s=args.grpc_max_connection_age,
            max_connection_age_grace_s=args.grpc_max_connection_age_grace,
            keepalive_s=args.grpc_keepalive_secs,
            keepalive_timeout_s=args.grpc_keepalive_timeout_secs,
        ),
        tls=tls,
        restricted=restricted,
        stream_scoped=args.stream_scoped_sequences,
        reuse_port=args.reuse_grpc_port,
        header_forward=args.grpc_header_forward_pattern,
    )


def _metrics(args: argparse.Namespace) -> MetricsOptions | None:
    try:
        config = MetricsConfig.parse(args.metrics_config)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not args.allow_metrics:
        return None
    return MetricsOptions(
        host=args.metrics_address or args.http_address or args.host,  # Triton's: the HTTP address
        port=args.metrics_port,
        interval_ms=args.metrics_interval_ms,
        config=config,
        cpu=args.allow_cpu_metrics,
        gpu=args.allow_gpu_metrics,
    )


def _state_store(args: argparse.Namespace) -> StateStoreOptions | None:
    if args.spill_idle_secs and not args.state_store:
        raise UsageError("--spill-idle-secs needs --state-store (spilled sequences go there)")
    if not args.state_store:
        return None
    return StateStoreOptions(
        url=args.state_store,
        replica_id=args.replica_id,
        spill_idle_s=args.spill_idle_secs,
        handover_timeout_s=args.handover_timeout_secs,
    )


# ------------------------------------------------------------------- Triton's backend settings

#: the Python backend's settings, which concern its stub processes and their shared memory
_PYTHON_BACKEND_SETTINGS = (
    "shm-default-byte-size",
    "shm-growth-byte-size",
    "shm-message-queue-size",
    "shm-region-prefix-name",
    "stub-timeout-seconds",
    "grpc-timeout-milliseconds",
)


def _backend_config(args: argparse.Namespace) -> int | None:
    """--backend-config: default-max-batch-size is read (None: not given); every other
    setting earns one warning line."""
    default_max_batch_size: int | None = None
    log = logging.getLogger("seqserve")
    for backend, key, value in args.backend_config:
        if key == "default-max-batch-size":
            try:
                default_max_batch_size = int(value)
            except ValueError:
                default_max_batch_size = -1
            if default_max_batch_size < 0:
                raise UsageError(f"--backend-config {key}={value}: not an integer >= 0")
        elif backend == "python" and key in _PYTHON_BACKEND_SETTINGS:
            log.warning(
                "--backend-config python,%s is accepted and ignored: seqserve runs Python models without stub "
                "processes or their shared memory (--python-isolation process has its own)",
                key,
            )
        else:
            shown = f"{backend},{key}" if backend else key
            log.warning("--backend-config %s is accepted and ignored: seqserve has no such backend setting", shown)
    return default_max_batch_size


def _not_implemented_yet(args: argparse.Namespace) -> None:
    """Triton options that parse and are checked but do not act yet: one warning each, so that
    none is silently without effect."""
    log = logging.getLogger("seqserve")
    pending = {
        "--model-load-thread-count": args.model_load_thread_count != 4,
    }
    for flag, value in pending.items():
        if value:
            log.warning("%s is accepted but not implemented yet: it has no effect", flag)
