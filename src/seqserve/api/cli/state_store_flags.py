"""The "state store" flags: sequences shared by replicas (docs/state-store.md)."""

from __future__ import annotations

import argparse

from seqserve.api.cli.values import state_store_url, store_positive_seconds, store_seconds


def add_state_store_flags(s: argparse.ArgumentParser) -> None:
    g = s.add_argument_group("state store", "sequences shared by replicas (docs/state-store.md)")
    g.add_argument(
        "--state-store",
        type=state_store_url,
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
        type=store_seconds,
        default=0.0,
        metavar="SECONDS",
        help="with --state-store: sequences idle this long move to the store and free their slot; their "
        "next step brings them back (default: 0, off)",
    )
    g.add_argument(
        "--handover-timeout-secs",
        type=store_positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="with --state-store: how long a step waits for another live replica to hand its sequence over "
        "before it is answered 503 + Retry-After (default: 2)",
    )
