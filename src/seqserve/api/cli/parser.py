"""The `seqserve` argument parser: `serve`'s flags, one function per flag group, in the order
`seqserve serve --help` lists them (docs/cli.md shows that page)."""

from __future__ import annotations

import argparse
from pathlib import Path

from seqserve import __version__
from seqserve.api.cli.limit_flags import add_limit_flags
from seqserve.api.cli.log_flags import add_log_flags
from seqserve.api.cli.security_flags import add_restriction_flags, add_tls_flags
from seqserve.api.cli.state_store_flags import add_state_store_flags
from seqserve.api.cli.trace_flags import add_trace_flags
from seqserve.api.cli.triton_flags import add_triton_flags
from seqserve.api.cli.triton_options import add_triton_options
from seqserve.api.cli.usage import CommandParser
from seqserve.api.cli.values import (
    AUTO_WORKERS_CAP,
    boolean,
    finite_seconds,
    non_negative_int,
    port_or_off,
    positive_int,
    seconds,
    tcp_port,
    worker_count,
)
from seqserve.api.metrics import DEFAULT_INTERVAL_MS, DEFAULT_METRICS_PORT
from seqserve.engine import (
    DEFAULT_INLINE_MAX_BATCH_US,
    DEFAULT_MAX_BACKLOG_SEQUENCES,
    DEFAULT_PER_CLIENT_DIVISOR,
    DEFAULT_REPOSITORY_POLL_SECS,
    DEFAULT_TOMBSTONE_MAX,
    DEFAULT_TOMBSTONE_S,
    WORKERS_INLINE_MAX_BATCH_US,
    ModelControlMode,
)


def build_parser() -> argparse.ArgumentParser:
    """No flag of any command may be abbreviated (CommandParser); a refusal is one line."""
    p = CommandParser(prog="seqserve", description="Inference server for stateful models.")
    p.add_argument("-V", "--version", action="version", version=f"seqserve {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    for add_flags in (
        _add_model_flags,
        _add_address_flags,
        add_log_flags,
        _add_sequence_flags,
        _add_server_flags,
        _add_metrics_flags,
        _add_session_flags,
        _add_execution_flags,
        add_tls_flags,
        add_restriction_flags,
        add_limit_flags,
        add_state_store_flags,
        add_triton_options,
        add_triton_flags,
        add_trace_flags,
    ):
        add_flags(s)
    return p


def _add_model_flags(s: argparse.ArgumentParser) -> None:
    """The repositories, which models load, and what a model that fails to load does."""
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
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="exit when a model fails to load at startup, as Triton (default: true; false: log it, list it "
        "UNAVAILABLE and serve the others)",
    )
    s.add_argument(
        "--strict-readiness",
        type=boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="/v2/health/ready (and gRPC ServerReady) answers ready only while every model that was asked to "
        "load is READY (default: true; false: ready once the server is up)",
    )
    _add_model_control_flags(s)


def _add_model_control_flags(s: argparse.ArgumentParser) -> None:
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
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="with --model-control-mode=poll, the interval between two scans of the model repository "
        f"(default: {DEFAULT_REPOSITORY_POLL_SECS:g}; 0: scan at startup only)",
    )


def _add_address_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--host",
        default="0.0.0.0",
        help="address both front-ends bind, unless --http-address or --grpc-address says otherwise (default: 0.0.0.0)",
    )
    s.add_argument("--http-address", metavar="ADDRESS", help="address the HTTP server binds (default: --host)")
    s.add_argument("--http-port", type=port_or_off, default=8000, help="HTTP port, or 'off' (default: 8000)")
    s.add_argument("--grpc-address", metavar="ADDRESS", help="address the gRPC server binds (default: --host)")
    s.add_argument("--grpc-port", type=port_or_off, default=8001, help="gRPC port, or 'off' (default: 8001)")


def _add_sequence_flags(s: argparse.ArgumentParser) -> None:
    """How sequences are admitted, named, scoped, and drained at exit."""
    s.add_argument(
        "--exit-timeout-secs",
        type=finite_seconds,
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
        type=non_negative_int,
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


def _add_server_flags(s: argparse.ArgumentParser) -> None:
    """Which HTTP and gRPC servers run the front-ends."""
    s.add_argument(
        "--http-server",
        choices=["auto", "builtin", "hypercorn", "granian"],
        default="auto",
        help="HTTP server: 'auto' (default) picks 'builtin', seqserve's own HTTP/1.1 server on "
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
        "--workers",
        type=worker_count,
        default=1,
        metavar="N",
        help="front-end worker processes: N processes run the HTTP and gRPC front-ends on the same ports and "
        "feed one engine process through shared-memory rings; 1 (default) serves everything in one process; "
        f"'auto' starts one per CPU, up to {AUTO_WORKERS_CAP}. Needs the builtin gRPC server and the "
        "builtin or hypercorn HTTP server",
    )


def _add_metrics_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--allow-metrics",
        type=boolean,
        default=True,
        metavar="BOOL",
        help="serve Prometheus metrics at http://<metrics-address>:<metrics-port>/metrics (default: true)",
    )
    s.add_argument(
        "--metrics-port",
        type=tcp_port,
        default=DEFAULT_METRICS_PORT,
        help=f"port of the metrics endpoint (default: {DEFAULT_METRICS_PORT})",
    )
    s.add_argument(
        "--metrics-address", help="address the metrics endpoint binds (default: the HTTP address, as in Triton)"
    )
    s.add_argument(
        "--metrics-interval-ms",
        type=positive_int,
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
        "true), histogram_latencies=true|false (nv_inference_first_response_histogram_ms, default false), "
        "summary_latencies=true|false (the *_summary_us summaries, default false), "
        "summary_quantiles=Q:E,... (default 0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.0001)",
    )


def _add_session_flags(s: argparse.ArgumentParser) -> None:
    """How ended and expired sessions are remembered."""
    s.add_argument(
        "--session-tombstone-secs",
        type=seconds,
        default=DEFAULT_TOMBSTONE_S,
        metavar="SECONDS",
        help="how long an ended or expired session is remembered, so that its next request is refused "
        f"instead of starting a new session (default: {DEFAULT_TOMBSTONE_S:g}; 0: not remembered)",
    )
    s.add_argument(
        "--session-tombstone-max",
        type=non_negative_int,
        default=DEFAULT_TOMBSTONE_MAX,
        metavar="N",
        help="how many ended or expired sessions each model version remembers at most, the least recently "
        f"used forgotten first (default: {DEFAULT_TOMBSTONE_MAX}; 0: none)",
    )
    s.add_argument(
        "--session-tombstone-max-per-client",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="how many of those one client (peer address) holds at most, its own least recently used "
        "forgotten first; a client that has many forgotten lately gets its new sessions refused, others do not "
        f"(default: a {DEFAULT_PER_CLIENT_DIVISOR}th of --session-tombstone-max; 0: no bound but the total, "
        "for clients that all come through one proxy)",
    )


def _add_execution_flags(s: argparse.ArgumentParser) -> None:
    """Where Python models run."""
    s.add_argument(
        "--python-isolation",
        choices=["thread", "process"],
        default="thread",
        help="where Python models' instances run unless their config says (parameter 'isolation'): in the "
        "server process, or each in its own child process that is restarted if it dies (default: thread)",
    )
    s.add_argument(
        "--inline-max-batch-us",
        type=non_negative_int,
        default=None,
        metavar="US",
        help="in-process Python models whose batches cost at most this many microseconds run them on the event "
        "loop's thread (under --workers, on the engine's ring drain thread) instead of an executor thread, saving "
        "two thread hand-offs per batch; 4 slower batches among its last 32 (or one 8 times slower) move the model "
        "back to its threads. A model's parameter 'inline_max_batch_us' overrides it. "
        f"0: never (default: {DEFAULT_INLINE_MAX_BATCH_US}; {WORKERS_INLINE_MAX_BATCH_US} with --workers 2 or more)",
    )
    s.add_argument(
        "--kind-gpu-on-cpu",
        action="store_true",
        help="run KIND_GPU instance groups on the CPU (one warning per model) when there is no usable GPU or the "
        "backend cannot use one; without it such a model fails to load and says why (docs/gpu.md)",
    )
