"""The state store's command-line flags (docs/state-store.md, docs/cli.md)."""

from __future__ import annotations

import argparse


def _secs(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not a number of seconds") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"'{value}' must be a finite number of seconds >= 0")
    return v


def _positive_secs(value: str) -> float:
    v = _secs(value)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"'{value}' must be > 0 seconds")
    return v


def _store_url(value: str) -> str:
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme not in ("redis", "rediss", "unix", "dir"):
        raise argparse.ArgumentTypeError(f"'{value}' is not a state store: use redis://host:port/db or dir:///path")
    return value


def add_state_store_args(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("state store", "sequences shared by replicas (docs/state-store.md)")
    g.add_argument(
        "--state-store",
        type=_store_url,
        metavar="URL",
        help="share sequences of models with implicit state with other replicas: redis://host:port/db "
        "(needs pip install 'seqserve[redis]') or dir:///path (one host). Sequences are handed off at "
        "shutdown and taken over from the store by the replica their next step reaches (default: off)",
    )
    g.add_argument(
        "--replica-id",
        metavar="ID",
        help="this replica's name in the state store (default: hostname-pid-random, unique per process)",
    )
    g.add_argument(
        "--spill-idle-secs",
        type=_secs,
        default=0.0,
        metavar="SECONDS",
        help="with --state-store: sequences idle this long move to the store and free their slot; their "
        "next step brings them back (default: 0, off)",
    )
    g.add_argument(
        "--handover-timeout-secs",
        type=_positive_secs,
        default=2.0,
        metavar="SECONDS",
        help="with --state-store: how long a step waits for another live replica to hand its sequence over "
        "before it is answered 503 + Retry-After (default: 2)",
    )
