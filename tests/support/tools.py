"""Outside programs a test runs (h2load, wrk, go, ...): present, or the test skips and says how
to install them; under CI (`CI=true`) a missing program fails the test instead, so that CI
cannot pass by skipping what it exists to run (.ci/run installs them when it runs as root)."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing_programs(*programs: str) -> list[str]:
    return [p for p in programs if shutil.which(p) is None]


def require_programs(*programs: str, install: str) -> None:
    """Skip (fail under CI=true) unless every one of `programs` is on PATH; `install` says how to
    get them (an apt-get line)."""
    missing = missing_programs(*programs)
    if not missing:
        return
    why = f"{' and '.join(missing)} not on PATH ({install})"
    if in_ci():
        pytest.fail(f"CI=true but {why}: .ci/run installs it when it runs as root")
    pytest.skip(why)


def require_python_module(module: str, install: str) -> None:
    """`require_programs` for an importable Python module (a test extra)."""
    try:
        __import__(module)
    except ImportError:
        why = f"Python module {module} is not installed ({install})"
        if in_ci():
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
