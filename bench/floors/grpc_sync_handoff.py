"""``grpc_sync.py --handoff`` as a floor of its own (``--spawn-floor grpc-sync-handoff``)."""

from __future__ import annotations

import sys

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.floors.grpc_sync import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--handoff"]))
