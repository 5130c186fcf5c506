"""The `seqserve` command: parse the flags (parser.py, one function per flag group; the value
types in values.py), turn them into ServeOptions (arguments.py), and run the server."""

from __future__ import annotations

import sys

from seqserve.api.app import run
from seqserve.api.cli.arguments import DEMO_REPOSITORY, UsageError, serve_options
from seqserve.api.cli.log_flags import log_settings
from seqserve.api.cli.parser import build_parser
from seqserve.api.logs import log_control
from seqserve.api.serve_options import ServeOptions

__all__ = ["DEMO_REPOSITORY", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 after a clean stop, 1 when startup fails, 2 for a command line that cannot
    run, 130 on a KeyboardInterrupt, 128 + N on a second signal N."""
    args = build_parser().parse_args(argv)
    settings = log_settings(args)
    try:
        log_control.configure(settings)
    except OSError as e:
        print(f"seqserve: --log-file: cannot open {settings.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        opts = serve_options(args)
    except UsageError as e:
        print(f"seqserve: {e}", file=sys.stderr)
        return 2
    _redact_secrets(opts)
    try:
        return run(opts)
    except KeyboardInterrupt:
        return 130


def _redact_secrets(opts: ServeOptions) -> None:
    """The restricted APIs' header values never reach the log, whatever logs them."""
    for front_end in (opts.http, opts.grpc):
        if front_end is not None:
            restricted = front_end.restricted
            log_control.redact.add(*(restricted[group].value for group in restricted))
