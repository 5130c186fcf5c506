"""The `seqserve` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from seqserve import __version__
from seqserve.api import limits as lim
from seqserve.api import security
from seqserve.api.app import ServeOptions, resolve_http_server, run
from seqserve.api.cli_state import add_state_store_args
from seqserve.api.metrics import DEFAULT_INTERVAL_MS, DEFAULT_METRICS_PORT, MetricsConfig
from seqserve.engine import (
    DEFAULT_INLINE_MAX_BATCH_US,
    DEFAULT_MAX_BACKLOG_SEQUENCES,
    DEFAULT_REPOSITORY_POLL_SECS,
    DEFAULT_TOMBSTONE_MAX,
    DEFAULT_TOMBSTONE_S,
    ModelControlMode,
    startup_models,
)

DEMO_REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "models"


def _port(value: str) -> int | None:
    """A TCP port, or 'off' to disable that front-end."""
    if value.lower() in ("off", "none", "-1"):
        return None
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535) or 'off'")
    return port


def _bool(value: str) -> bool:
    """Triton's boolean option values."""
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean (true or false)")


def _log_verbose(value: str) -> int:
    level = int(value)
    if level < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a verbose level (0 or more)")
    return level


def _tcp_port(value: str) -> int:
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return port


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return n


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value} is not an integer >= 0")
    return n


def _poll_secs(value: str) -> float:
    secs = float(value)
    if not secs >= 0:
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds >= 0")
    return secs


def _limit_int(value: str) -> int:
    """A size or count for grpc core and the servers: an int32 above 0."""
    n = int(value)
    if not 0 < n < 2**31:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer up to 2147483647")
    return n


def _positive_secs(value: str) -> float:
    secs = float(value)
    if not 0 < secs < 1e9:
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds > 0")
    return secs


def _limits_group(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("limits", "bounded input (docs/security.md, 'Bounded input')")
    g.add_argument(
        "--http-max-body-bytes",
        type=_limit_int,
        default=lim.DEFAULT_MAX_BODY_BYTES,
        metavar="BYTES",
        help="largest accepted HTTP request body, checked before and after decompression: larger gets 413 "
        f"(default: {lim.DEFAULT_MAX_BODY_BYTES}, 64 MiB, Triton's --http-max-input-size default)",
    )
    g.add_argument(
        "--http-header-timeout-secs",
        type=_positive_secs,
        default=lim.DEFAULT_HEADER_TIMEOUT_S,
        metavar="SECONDS",
        help="a connection that has not sent a complete request head this long after it opened or after its "
        f"last response is closed (default: {lim.DEFAULT_HEADER_TIMEOUT_S:g})",
    )
    g.add_argument(
        "--http-body-timeout-secs",
        type=_positive_secs,
        default=lim.DEFAULT_BODY_TIMEOUT_S,
        metavar="SECONDS",
        help="a request body from which no data arrives for this long gets 408 and its connection is closed "
        f"(default: {lim.DEFAULT_BODY_TIMEOUT_S:g})",
    )
    g.add_argument(
        "--http-keepalive-secs",
        type=_poll_secs,
        default=lim.DEFAULT_KEEPALIVE_S,
        metavar="SECONDS",
        help="how long an idle kept-alive connection waits for its next request, at most the header timeout; "
        f"0: one request per connection (default: {lim.DEFAULT_KEEPALIVE_S:g})",
    )
    g.add_argument(
        "--http-max-connections",
        type=_limit_int,
        default=lim.DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="most HTTP connections served at once (granian: more wait to be accepted; hypercorn: more get "
        f"503) (default: {lim.DEFAULT_MAX_CONNECTIONS})",
    )
    g.add_argument(
        "--grpc-max-receive-message-bytes",
        type=_limit_int,
        default=None,
        metavar="BYTES",
        help="largest gRPC request message: larger fails with RESOURCE_EXHAUSTED before it is read "
        "(default: --http-max-body-bytes)",
    )
    g.add_argument(
        "--grpc-max-send-message-bytes",
        type=_limit_int,
        default=None,
        metavar="BYTES",
        help="largest gRPC response message (default: --http-max-body-bytes)",
    )
    g.add_argument(
        "--grpc-max-concurrent-streams",
        type=_limit_int,
        default=lim.DEFAULT_GRPC_MAX_CONCURRENT_STREAMS,
        metavar="N",
        help="concurrent calls per gRPC connection; a client queues the calls beyond "
        f"(default: {lim.DEFAULT_GRPC_MAX_CONCURRENT_STREAMS})",
    )
    g.add_argument(
        "--grpc-max-connections",
        type=_limit_int,
        default=lim.DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="most gRPC connections served at once by the builtin gRPC server; one beyond gets a GOAWAY and "
        f"is closed (grpcio: not limited) (default: {lim.DEFAULT_MAX_CONNECTIONS})",
    )
    g.add_argument(
        "--grpc-max-connection-idle-secs",
        type=_poll_secs,
        default=lim.DEFAULT_GRPC_MAX_CONNECTION_IDLE_S,
        metavar="SECONDS",
        help="a gRPC connection with no call for this long is closed with a GOAWAY (clients reconnect on their "
        f"next call); 0: never (default: {lim.DEFAULT_GRPC_MAX_CONNECTION_IDLE_S:g})",
    )
    g.add_argument(
        "--grpc-keepalive-secs",
        type=_positive_secs,
        default=lim.DEFAULT_GRPC_KEEPALIVE_S,
        metavar="SECONDS",
        help="interval of the server's keepalive pings on a gRPC connection, which find dead peers "
        f"(default: {lim.DEFAULT_GRPC_KEEPALIVE_S:g}, gRPC's and Triton's)",
    )
    g.add_argument(
        "--grpc-keepalive-timeout-secs",
        type=_positive_secs,
        default=lim.DEFAULT_GRPC_KEEPALIVE_TIMEOUT_S,
        metavar="SECONDS",
        help="a connection whose peer does not answer a keepalive ping within this is closed "
        f"(default: {lim.DEFAULT_GRPC_KEEPALIVE_TIMEOUT_S:g})",
    )


def _exit_timeout(value: str) -> float:
    secs = float(value)
    if not 0 <= secs < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a number of seconds >= 0")
    return secs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seqserve", description="Inference server for stateful models.")
    p.add_argument("--version", action="version", version=f"seqserve {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    s.add_argument(
        "--model-repository",
        type=Path,
        action="append",
        default=None,
        help="model repository directory; repeat it to serve several (a model name found in two of them "
        "fails to load, as in Triton) (default: the bundled demo models)",
    )
    s.add_argument(
        "--exit-on-error",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="exit when a model fails to load at startup, as Triton (default: true; false: log it, list it "
        "UNAVAILABLE and serve the others)",
    )
    s.add_argument(
        "--strict-readiness",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="/v2/health/ready (and gRPC ServerReady) answers ready only while every model that was asked to "
        "load is READY (default: true; false: ready once the server is up)",
    )
    s.add_argument(
        "--model-control-mode",
        type=str.lower,
        choices=[m.value for m in ModelControlMode],
        default=ModelControlMode.NONE.value,
        help="how the loaded models may change (as Triton's option). 'none' (default): every model of the "
        "repository loads at startup and nothing changes afterwards; load and unload requests over HTTP and "
        "gRPC are refused. 'poll': every model loads at startup, then the repository is polled every "
        "--repository-poll-secs and models are loaded, unloaded and reloaded as their folders appear, "
        "disappear and change; load and unload requests are refused. 'explicit': only the --load-model "
        "models load at startup, and clients load and unload models (uploaded files included, which runs "
        "code they send): open it only to trusted clients",
    )
    s.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="with --model-control-mode=explicit, a model to load at startup; repeat it for more models, or "
        "give '*' alone to load every model. Without it explicit mode starts with no model loaded",
    )
    s.add_argument(
        "--repository-poll-secs",
        type=_poll_secs,
        default=None,
        metavar="SECONDS",
        help="with --model-control-mode=poll, the interval between two scans of the model repository "
        f"(default: {DEFAULT_REPOSITORY_POLL_SECS:g}; 0: scan at startup only)",
    )
    s.add_argument(
        "--host",
        default="0.0.0.0",
        help="address both front-ends bind, unless --http-address or --grpc-address says otherwise (default: 0.0.0.0)",
    )
    s.add_argument("--http-address", metavar="ADDRESS", help="address the HTTP server binds (default: --host)")
    s.add_argument("--http-port", type=_port, default=8000, help="HTTP port, or 'off' (default: 8000)")
    s.add_argument("--grpc-address", metavar="ADDRESS", help="address the gRPC server binds (default: --host)")
    s.add_argument("--grpc-port", type=_port, default=8001, help="gRPC port, or 'off' (default: 8001)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument(
        "--log-verbose",
        type=_log_verbose,
        default=0,
        metavar="N",
        help="verbose logging, as Triton's option: 0 (default) keeps --log-level; 1 or more logs at debug level",
    )
    s.add_argument(
        "--exit-timeout-secs",
        type=_exit_timeout,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long running sequences and open requests get to finish; at the "
        "deadline the models are closed and the process exits, even if a model never returns from "
        "execute. A second SIGINT/SIGTERM exits at once (default: 30)",
    )
    s.add_argument(
        "--strict-sequence-ids",
        action="store_true",
        help="a request to a sequence model must name its sequence (Triton's behaviour); "
        "by default such a request starts a new sequence under a server-generated id",
    )
    s.add_argument(
        "--max-backlog-sequences",
        type=_count,
        default=DEFAULT_MAX_BACKLOG_SEQUENCES,
        metavar="N",
        help="admission control: how many sequences of one model may wait in its backlog for a slot; a START "
        "beyond it is refused at once (HTTP 503 with Retry-After, gRPC UNAVAILABLE). A model's "
        "sequence_batching.max_backlog_sequences overrides it. 0: no bound, as in Triton "
        f"(default: {DEFAULT_MAX_BACKLOG_SEQUENCES})",
    )
    s.add_argument(
        "--stream-scoped-sequences",
        action="store_true",
        help="sequences started on a gRPC stream (ModelStreamInfer) end when that stream closes, freeing their "
        "slots at once, as idle expiry would later; a stream may say otherwise with the header "
        "'seqserve-stream-scoped: true|false' (default: they live until their END or idle timeout, as in Triton)",
    )
    s.add_argument(
        "--http-server",
        choices=["auto", "builtin", "hypercorn", "granian"],
        default="auto",
        help="HTTP server for the ASGI app: 'auto' (default) picks 'builtin', seqserve's own HTTP/1.1 server on "
        "the event loop (httptools); 'granian' and 'hypercorn' select those servers",
    )
    s.add_argument(
        "--grpc-server",
        choices=["auto", "builtin", "grpcio"],
        default="auto",
        help="gRPC server: 'auto' (default) picks 'builtin', seqserve's own HTTP/2 gRPC server on the event "
        "loop; 'grpcio' selects grpc.aio",
    )
    s.add_argument(
        "--allow-metrics",
        type=_bool,
        default=True,
        metavar="BOOL",
        help="serve Prometheus metrics at http://<metrics-address>:<metrics-port>/metrics (default: true)",
    )
    s.add_argument(
        "--metrics-port",
        type=_tcp_port,
        default=DEFAULT_METRICS_PORT,
        help=f"port of the metrics endpoint (default: {DEFAULT_METRICS_PORT})",
    )
    s.add_argument(
        "--metrics-address", help="address the metrics endpoint binds (default: the HTTP address, as in Triton)"
    )
    s.add_argument(
        "--metrics-interval-ms",
        type=_positive_int,
        default=DEFAULT_INTERVAL_MS,
        metavar="MS",
        help="how often the per-interval metrics (CPU) are read again; the model metrics are read at "
        f"every scrape (default: {DEFAULT_INTERVAL_MS})",
    )
    s.add_argument(
        "--metrics-config",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="Triton's metric settings: counter_latencies=true|false (the *_duration_us counters, default "
        "true), histogram_latencies=true|false (nv_inference_first_response_histogram_ms, default false)",
    )
    s.add_argument(
        "--session-tombstone-secs",
        type=_poll_secs,
        default=DEFAULT_TOMBSTONE_S,
        metavar="SECONDS",
        help="how long an ended or expired session is remembered, so that its next request is refused "
        f"instead of starting a new session (default: {DEFAULT_TOMBSTONE_S:g}; 0: not remembered)",
    )
    s.add_argument(
        "--session-tombstone-max",
        type=_count,
        default=DEFAULT_TOMBSTONE_MAX,
        metavar="N",
        help="how many ended or expired sessions each model version remembers at most, the least recently "
        f"used forgotten first (default: {DEFAULT_TOMBSTONE_MAX}; 0: none)",
    )
    s.add_argument(
        "--python-isolation",
        choices=["thread", "process"],
        default="thread",
        help="where Python models' instances run unless their config says (parameter 'isolation'): in the "
        "server process, or each in its own child process that is restarted if it dies (default: thread)",
    )
    s.add_argument(
        "--inline-max-batch-us",
        type=_count,
        default=DEFAULT_INLINE_MAX_BATCH_US,
        metavar="US",
        help="in-process Python models whose batches cost at most this many microseconds run them on the event "
        "loop's thread instead of an executor thread, saving two thread hand-offs per batch; 4 slower batches among "
        "its last 32 (or one 8 times slower) move the model back to its threads. A model's parameter "
        "'inline_max_batch_us' overrides it. "
        f"0: never (default: {DEFAULT_INLINE_MAX_BATCH_US})",
    )
    s.add_argument("--tls-cert", help="PEM certificate for both front-ends")
    s.add_argument("--tls-key", help="PEM private key for both front-ends")
    s.add_argument("--http-tls-cert", help="PEM certificate for HTTP (overrides --tls-cert)")
    s.add_argument("--http-tls-key", help="PEM private key for HTTP (overrides --tls-key)")
    s.add_argument("--grpc-tls-cert", help="PEM certificate for gRPC (overrides --tls-cert)")
    s.add_argument("--grpc-tls-key", help="PEM private key for gRPC (overrides --tls-key)")
    s.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mutual TLS on both front-ends: clients must present a certificate signed by a CA of this PEM "
        "bundle (needs --tls-cert/--tls-key or the front-end's own)",
    )
    s.add_argument("--http-tls-client-ca", metavar="PEM", help="mutual TLS for HTTP (overrides --tls-client-ca)")
    s.add_argument("--grpc-tls-client-ca", metavar="PEM", help="mutual TLS for gRPC (overrides --tls-client-ca)")
    groups = ", ".join(security.GROUPS)
    s.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="API[,API...]:KEY=VALUE",
        help="as Triton's option: HTTP requests to these APIs must carry the header KEY with VALUE, or get "
        f"403. Repeat it for groups with other keys; an API may be in one group only. APIs: {groups}",
    )
    s.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="PROTOCOL[,PROTOCOL...]:KEY=VALUE",
        help="as Triton's option: gRPC calls to these protocols must carry the metadata "
        f"'{security.GRPC_HEADER_PREFIX}KEY' with VALUE, or get UNAVAILABLE. Repeatable, as "
        f"--http-restricted-api. Protocols: {groups}",
    )
    _limits_group(s)
    add_state_store_args(s)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level="DEBUG" if args.log_verbose > 0 else args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.http_port is None and args.grpc_port is None:
        print("seqserve: both front-ends are off; nothing to serve", file=sys.stderr)
        return 2
    http_cert = args.http_tls_cert or args.tls_cert
    http_key = args.http_tls_key or args.tls_key
    grpc_cert = args.grpc_tls_cert or args.tls_cert
    grpc_key = args.grpc_tls_key or args.tls_key
    for what, cert, key in (("HTTP", http_cert, http_key), ("gRPC", grpc_cert, grpc_key)):
        if bool(cert) != bool(key):
            print(f"seqserve: {what} TLS needs both a certificate and a key", file=sys.stderr)
            return 2
    http_ca = args.http_tls_client_ca or args.tls_client_ca
    grpc_ca = args.grpc_tls_client_ca or args.tls_client_ca
    for what, on, cert, ca in (
        ("HTTP", args.http_port, http_cert, http_ca),
        ("gRPC", args.grpc_port, grpc_cert, grpc_ca),
    ):
        if on is not None and ca and not cert:
            print(f"seqserve: {what} mutual TLS (a client CA) needs TLS: give a certificate and a key", file=sys.stderr)
            return 2
    if (
        args.http_port is not None
        and http_ca
        and resolve_http_server(args.http_server) == "granian"
        and not security.granian_client_verify_supported()
    ):
        if args.http_server == "granian":
            print(
                "seqserve: this granian cannot require client certificates (mutual TLS); "
                "use --http-server hypercorn or a granian with ssl_client_verify",
                file=sys.stderr,
            )
            return 2
        args.http_server = "hypercorn"  # auto: the server that can
    for what, on, cert, key, ca in (
        ("HTTP", args.http_port, http_cert, http_key, http_ca),
        ("gRPC", args.grpc_port, grpc_cert, grpc_key, grpc_ca),
    ):
        if on is not None and cert and key:
            try:
                security.check_tls(what, security.TlsFiles(cert, key, ca))
            except ValueError as e:
                print(f"seqserve: {e}", file=sys.stderr)
                return 2
    try:
        http_restricted = security.Restrictions.parse("http-restricted-api", args.http_restricted_api)
        grpc_restricted = security.Restrictions.parse("grpc-restricted-protocol", args.grpc_restricted_protocol)
    except security.RestrictionError as e:
        print(f"seqserve: {e}", file=sys.stderr)
        return 2
    mode = ModelControlMode.parse(args.model_control_mode)
    try:
        models = startup_models(mode, args.load_model)
    except ValueError as e:
        print(f"seqserve: {e}", file=sys.stderr)
        return 2
    if args.repository_poll_secs is not None and mode is not ModelControlMode.POLL:
        logging.getLogger("seqserve").warning(
            "--repository-poll-secs is ignored: the repository is polled with --model-control-mode=poll only"
        )
    try:
        metrics_config = MetricsConfig.parse(args.metrics_config)
    except ValueError as e:
        print(f"seqserve: {e}", file=sys.stderr)
        return 2
    repositories: list[Path] = args.model_repository or [DEMO_REPOSITORY]
    for repo in repositories:
        if not repo.is_dir():
            print(f"seqserve: model repository '{repo}' is not a directory", file=sys.stderr)
            return 2
    opts = ServeOptions(
        model_repository=repositories,
        host=args.host,
        http_address=args.http_address,
        grpc_address=args.grpc_address,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        exit_timeout_s=args.exit_timeout_secs,
        strict_sequence_ids=args.strict_sequence_ids,
        http_max_body_bytes=args.http_max_body_bytes,
        http_tls_cert=http_cert,
        http_tls_key=http_key,
        grpc_tls_cert=grpc_cert,
        grpc_tls_key=grpc_key,
        http_tls_client_ca=http_ca,
        grpc_tls_client_ca=grpc_ca,
        http_restricted=http_restricted,
        grpc_restricted=grpc_restricted,
        http_server=args.http_server,
        grpc_server=args.grpc_server,
        model_control=mode,
        startup_models=models,
        repository_poll_secs=(
            DEFAULT_REPOSITORY_POLL_SECS if args.repository_poll_secs is None else args.repository_poll_secs
        ),
        metrics_port=args.metrics_port if args.allow_metrics else None,
        metrics_address=args.metrics_address,
        metrics_interval_ms=args.metrics_interval_ms,
        metrics_config=metrics_config,
        session_tombstone_s=args.session_tombstone_secs,
        session_tombstone_max=args.session_tombstone_max,
        http_limits=lim.HttpLimits(
            header_timeout_s=args.http_header_timeout_secs,
            body_timeout_s=args.http_body_timeout_secs,
            keepalive_s=args.http_keepalive_secs,
            max_connections=args.http_max_connections,
        ),
        grpc_limits=lim.GrpcLimits(
            max_receive_message_bytes=args.grpc_max_receive_message_bytes or args.http_max_body_bytes,
            max_send_message_bytes=args.grpc_max_send_message_bytes or args.http_max_body_bytes,
            max_concurrent_streams=args.grpc_max_concurrent_streams,
            max_connections=args.grpc_max_connections,
            max_connection_idle_s=args.grpc_max_connection_idle_secs,
            keepalive_s=args.grpc_keepalive_secs,
            keepalive_timeout_s=args.grpc_keepalive_timeout_secs,
        ),
        python_isolation=args.python_isolation,
        inline_max_batch_us=args.inline_max_batch_us,
        max_backlog_sequences=args.max_backlog_sequences,
        stream_scoped_sequences=args.stream_scoped_sequences,
        state_store=args.state_store,
        replica_id=args.replica_id,
        spill_idle_s=args.spill_idle_secs,
        handover_timeout_s=args.handover_timeout_secs,
    )
    if args.spill_idle_secs and not args.state_store:
        print("seqserve: --spill-idle-secs needs --state-store (spilled sequences go there)", file=sys.stderr)
        return 2
    try:
        return run(opts)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
