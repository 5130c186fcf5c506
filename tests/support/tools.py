"""Outside programs a test runs (h2load, wrk, go, ...): present, or the test skips and says how
to install them; under CI (`CI=true`) a missing program fails the test instead, so that CI
cannot pass by skipping what it exists to run (.ci/run installs them when it runs as root)."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(why: str) -> None:
    """Skip the test because of `why`, or fail it under CI=true."""
    if in_ci():
        pytest.fail(f"CI=true but {why}: .ci/run installs it when it runs as root")
    pytest.skip(why)


def require_programs(*programs: str, install: str) -> None:
    """Skip (fail under CI=true) unless every one of `programs` is on PATH; `install` says how to
    get them (an apt-get line)."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        unavailable(f"{' and '.join(missing)} not on PATH ({install})")


def require_paths(*paths: Path, install: str) -> None:
    """`require_programs` for files or folders a package installs (Go sources, say)."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        unavailable(f"{' and '.join(missing)} missing ({install})")


def require_python_module(module: str, install: str) -> None:
    """`require_programs` for an importable Python module (a test extra)."""
    try:
        importlib.import_module(module)
    except ImportError:
        unavailable(f"Python module {module} is not installed ({install})")
