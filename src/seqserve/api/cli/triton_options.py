"""tritonserver's options that seqserve implements under Triton's own names and units
(docs/cli.md, "Triton's flags"); their meaning is Triton's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from seqserve.api.cli.triton_flags import bool_flag
from seqserve.api.cli.values import int32_size, milliseconds_or_zero_as_seconds, positive_int


def config_name(value: str) -> str:
    """--model-config-name: a file name under each model's configs/ folder, without .pbtxt."""
    if not value or any(c.isspace() for c in value) or "/" in value or value in (".", ".."):
        raise argparse.ArgumentTypeError(f"'{value}' is not a config name (a file name under configs/, no spaces)")
    return value


def header_pattern(value: str) -> re.Pattern[str]:
    """A header-forwarding pattern: case-insensitive as Triton's, unless it starts with (?-i)."""
    case_sensitive = value.startswith("(?-i)")
    try:
        return re.compile(value.removeprefix("(?-i)"), 0 if case_sensitive else re.IGNORECASE)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"'{value}' is not a regular expression: {e}") from None


def backend_setting(value: str) -> tuple[str, str, str]:
    """--backend-config: ``<backend>,<setting>=<value>`` or a global ``<setting>=<value>``."""
    backend, _, setting = value.rpartition(",")
    key, eq, text = setting.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"'{value}' is not <backend>,<setting>=<value> or <setting>=<value>")
    return backend.strip(), key.strip(), text.strip()


def add_triton_options(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("Triton's options", "tritonserver's options that seqserve implements")
    add = g.add_argument
    add("--model-store", dest="model_repository", type=Path, action="append", help="Triton's --model-repository")
    add(
        "--http-max-input-size",
        dest="http_max_body_bytes",
        type=int32_size,
        default=argparse.SUPPRESS,
        metavar="BYTES",
        help="Triton's name for --http-max-body-bytes",
    )
    add("--id", metavar="ID", help="this server's name in the server metadata (default: seqserve)")
    add(
        "--model-config-name",
        type=config_name,
        metavar="NAME",
        help="load each model's configs/NAME.pbtxt where it has one, else its config.pbtxt (as Triton)",
    )
    add(
        "--model-load-thread-count",
        type=positive_int,
        default=4,
        metavar="N",
        help="how many models load at once at startup and in a repository load (default: 4, Triton's)",
    )
    add(
        "--backend-config",
        type=backend_setting,
        action="append",
        default=[],
        metavar="[BACKEND,]SETTING=VALUE",
        help="Triton's backend settings: default-max-batch-size=N (the batch size given to a model whose config "
        "does not set one, default 4); other settings are accepted with a warning where they do not apply",
    )
    add(
        "--backend-directory",
        type=Path,
        metavar="DIR",
        help="third-party backends: DIR/<name>/backend.py defines a seqserve Backend subclass, served for "
        'models whose config says backend: "<name>" (beside the seqserve.backends entry points; off unless given)',
    )
    bool_flag(add, "--allow-cpu-metrics", True, "serve the CPU and memory metrics (default: true)")
    bool_flag(add, "--reuse-http-port", False, "SO_REUSEPORT on the HTTP port: several servers may share it")
    bool_flag(add, "--reuse-grpc-port", False, "SO_REUSEPORT on the gRPC port: several servers may share it")
    add(
        "--http-header-forward-pattern",
        type=header_pattern,
        metavar="REGEX",
        help="HTTP headers whose name matches are passed to the model as request parameters (string values)",
    )
    add(
        "--grpc-header-forward-pattern",
        type=header_pattern,
        metavar="REGEX",
        help="gRPC metadata whose key matches is passed to the model as request parameters (string values)",
    )
    add(
        "--grpc-max-connection-age",
        type=milliseconds_or_zero_as_seconds,
        default=0.0,
        metavar="MS",
        help="a gRPC connection older than this gets a GOAWAY and no new calls (0, default: no limit)",
    )
    add(
        "--grpc-max-connection-age-grace",
        type=milliseconds_or_zero_as_seconds,
        default=None,
        metavar="MS",
        help="after the GOAWAY of --grpc-max-connection-age, how long its open calls get before the connection "
        "closes (default: no limit)",
    )
