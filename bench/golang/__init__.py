"""Go programs of the bench (``seqload``, a grpc-go sequence load generator), built offline from
Debian's Go packages by ``tools/build_go.sh``."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEQLOAD_SOURCE = Path(__file__).resolve().parent / "seqload"
BUILD_SCRIPT = ROOT / "tools" / "build_go.sh"
BUILD_TIMEOUT_S = 600
TOOLCHAIN_MISSING = 3  # the script's exit status when go, protoc or Debian's Go sources are missing


class ToolchainMissing(RuntimeError):
    """The Go toolchain is not installed; the message says what is missing and how to install it."""


def build(source: Path, out_dir: Path) -> Path:
    """Builds the Go program in folder ``source`` into ``out_dir``; returns the binary."""
    run = subprocess.run(
        [str(BUILD_SCRIPT), str(source), str(out_dir)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    if run.returncode == TOOLCHAIN_MISSING:
        raise ToolchainMissing(run.stderr.strip())
    if run.returncode != 0:
        raise RuntimeError(f"tools/build_go.sh {source.name}: exit {run.returncode}\n{run.stdout}\n{run.stderr}")
    return Path(run.stdout.strip().splitlines()[-1])
