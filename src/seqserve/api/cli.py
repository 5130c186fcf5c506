"""The `seqserve` command."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from seqserve import __version__
from seqserve.api.app import ServeOptions, run
from seqserve.api.http import DEFAULT_MAX_BODY_BYTES

DEMO_REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "models"


def _port(value: str) -> int | None:
    """A TCP port, or 'off' to disable that front-end."""
    if value.lower() in ("off", "none", "-1"):
        return None
    port = int(value)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535) or 'off'")
    return port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seqserve", description="Inference server for stateful models.")
    p.add_argument("--version", action="version", version=f"seqserve {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model repository over HTTP and gRPC")
    s.add_argument(
        "--model-repository",
        type=Path,
        default=DEMO_REPOSITORY,
        help="model repository directory (default: the bundled demo models)",
    )
    s.add_argument("--host", default="0.0.0.0", help="address to bind (default: 0.0.0.0)")
    s.add_argument("--http-port", type=_port, default=8000, help="HTTP port, or 'off' (default: 8000)")
    s.add_argument("--grpc-port", type=_port, default=8001, help="gRPC port, or 'off' (default: 8001)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        help="on SIGINT/SIGTERM, how long running sequences may take to finish (default: 30)",
    )
    s.add_argument(
        "--strict-sequence-ids",
        action="store_true",
        help="a request to a sequence model must name its sequence (Triton's behaviour); "
        "by default such a request starts a new sequence under a server-generated id",
    )
    s.add_argument(
        "--http-max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest accepted HTTP request body (default: {DEFAULT_MAX_BODY_BYTES})",
    )
    s.add_argument(
        "--http-server",
        choices=["auto", "hypercorn", "granian"],
        default="auto",
        help="HTTP server for the ASGI app (default: granian when installed, else hypercorn)",
    )
    s.add_argument(
        "--python-isolation",
        choices=["thread", "process"],
        default="thread",
        help="where Python models' instances run unless their config says (parameter 'isolation'): in the "
        "server process, or each in its own child process that is restarted if it dies (default: thread)",
    )
    s.add_argument("--tls-cert", help="PEM certificate for both front-ends")
    s.add_argument("--tls-key", help="PEM private key for both front-ends")
    s.add_argument("--http-tls-cert", help="PEM certificate for HTTP (overrides --tls-cert)")
    s.add_argument("--http-tls-key", help="PEM private key for HTTP (overrides --tls-key)")
    s.add_argument("--grpc-tls-cert", help="PEM certificate for gRPC (overrides --tls-cert)")
    s.add_argument("--grpc-tls-key", help="PEM private key for gRPC (overrides --tls-key)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
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
    if not args.model_repository.is_dir():
        print(f"seqserve: model repository '{args.model_repository}' is not a directory", file=sys.stderr)
        return 2
    opts = ServeOptions(
        model_repository=args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        exit_timeout_s=args.exit_timeout_secs,
        strict_sequence_ids=args.strict_sequence_ids,
        http_max_body_bytes=args.http_max_body_bytes,
        http_tls_cert=http_cert,
        http_tls_key=http_key,
        grpc_tls_cert=grpc_cert,
        grpc_tls_key=grpc_key,
        http_server=args.http_server,
        python_isolation=args.python_isolation,
    )
    try:
        return run(opts)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
