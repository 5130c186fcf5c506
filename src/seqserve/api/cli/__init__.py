"""The `seqserve` command: parse the flags (parser.py, one function per flag group; the value
types in values.py), turn them into ServeOptions (arguments.py), and run the server."""

from __future__ import annotations

import logging
import sys

from seqserve.api.app import run
from seqserve.api.cli.arguments import DEMO_REPOSITORY, UsageError, serve_options
from seqserve.api.cli.parser import build_parser

__all__ = ["DEMO_REPOSITORY", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 after a clean stop, 1 when startup fails, 2 for a command line that cannot
    run, 130 on a KeyboardInterrupt, 128 + N on a second signal N."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level="DEBUG" if args.log_verbose > 0 else args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        opts = serve_options(args)
    except UsageError as e:
        print(f"seqserve: {e}", file=sys.stderr)
        return 2
    try:
        return run(opts)
    except KeyboardInterrupt:
        return 130
