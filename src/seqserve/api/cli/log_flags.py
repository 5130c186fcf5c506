"""The logging flags, Triton's (--log-verbose, --log-info/warning/error, --log-format,
--log-file) and seqserve's --log-level and --log-tracebacks (docs/observability.md, "Logs")."""

from __future__ import annotations

import argparse

from seqserve.api.cli.triton_flags import bool_flag
from seqserve.api.cli.values import verbose_level
from seqserve.api.logs import FORMATS, LogSettings


def log_format(value: str) -> str:
    """default, ISO8601 or json, in any case."""
    for name in FORMATS:
        if value.lower() == name.lower():
            return name
    raise argparse.ArgumentTypeError(f"{value} is not a log format ({', '.join(FORMATS)})")


def add_log_flags(s: argparse.ArgumentParser) -> None:
    add = s.add_argument
    add(
        "--log-level",
        type=str.lower,
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="least severe messages logged: debug is --log-verbose 1; warning is --log-info=false; error is "
        "--log-info=false --log-warning=false (default: info)",
    )
    add(
        "--log-verbose",
        type=verbose_level,
        default=0,
        metavar="N",
        help="Triton's verbose levels: 0 (default) none; 1 adds a line per request (model, version, request and "
        "sequence ids, START/END, status, time); 2 adds a line per batch (instance, size, rows and slots). "
        "Only seqserve's own loggers become verbose, never the libraries'",
    )
    bool_flag(add, "--log-info", True, "log INFO messages (default: true)")
    bool_flag(add, "--log-warning", True, "log WARNING messages (default: true)")
    bool_flag(add, "--log-error", True, "log ERROR messages (default: true)")
    add(
        "--log-format",
        type=log_format,
        default="default",
        metavar="FORMAT",
        help="'default' (Triton's: I1128 06:52:44.000863 8420 app.py:130] \"message\"), 'ISO8601' (Triton's: "
        "2026-11-28T06:52:44Z I 8420 app.py:130] \"message\") or 'json' (one object per line) (default: default)",
    )
    add("--log-file", metavar="PATH", help="append the log to this file instead of standard error")
    bool_flag(
        add,
        "--log-tracebacks",
        False,
        "log the traceback of a model that raises, with its one-line error (default: false; clients never get "
        "a traceback)",
    )


def log_settings(args: argparse.Namespace) -> LogSettings:
    """The logging the command line asks for; --log-level folds into Triton's switches."""
    level = args.log_level
    return LogSettings(
        verbose=max(args.log_verbose, 1 if level == "debug" else 0),
        info=args.log_info and level not in ("warning", "error"),
        warning=args.log_warning and level != "error",
        error=args.log_error,
        format=args.log_format,
        file=args.log_file or "",
        tracebacks=args.log_tracebacks,
    )
