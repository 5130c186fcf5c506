"""Checks and waits shared by the engine tests: expected errors, and waiting on observable state.

Tests wait for what they can observe (a scheduler's slot table, a model's statistics, a reply,
a record the model keeps) with `wait_until`, under a deadline far beyond what a loaded machine
needs, never for a fixed time that merely tends to be long enough. A fixed sleep is left only
where a test checks that something does *not* happen, after the thing it waits for did.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from seqserve.engine import Code, InferenceError

# Generous: a deadline only matters when the awaited thing never happens (a failing test).
WAIT_S = 10.0

# ------------------------------------------------------------------------ errors


def start_error(seq_id: object, model: str = "m") -> str:
    """The refusal of a non-START request for a sequence the model does not know (or forgot)."""
    return (
        f"inference request for sequence {seq_id} to model '{model}' must specify the START flag on the "
        "first request of the sequence"
    )


async def expect_error(coro: object, code: Code, message: str | None = None) -> InferenceError:
    """Await `coro` and check it fails with `code` (and exactly `message`, when given)."""
    with pytest.raises(InferenceError) as ei:
        await coro  # type: ignore[misc]
    assert ei.value.code == code, repr(ei.value)
    if message is not None:
        assert str(ei.value) == message
    return ei.value


# ------------------------------------------------------------------------ waiting


async def wait_until(predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    """Poll `predicate` until it is true; fail the test, naming `what`, after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what}")
        await asyncio.sleep(0.01)


def wait_until_sync(predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> None:
    """`wait_until` for synchronous tests."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what}")
        time.sleep(0.02)


def holds_sequence(server: Any, seq_id: object, model: str = "m") -> bool:
    """Whether the model's scheduler still knows `seq_id` (in a slot or in the backlog)."""
    return str(seq_id) in server.model(model).scheduler_state()["sequences"]


async def wait_reaped(server: Any, seq_id: object, model: str = "m", timeout: float = WAIT_S) -> None:
    """Until the idle reaper has forgotten sequence `seq_id` (max_sequence_idle_microseconds)."""
    await wait_until(lambda: not holds_sequence(server, seq_id, model), f"sequence {seq_id} is reaped", timeout)


# ------------------------------------------------------------------------ optional torch


def import_torch() -> Any:
    """torch, for the TorchScript tests. torch is an optional extra: without it they skip, unless
    SEQSERVE_REQUIRE_TORCH=1 (.ci/run sets it, after installing torch's CPU build), where a
    torch that does not import is an error."""
    if os.environ.get("SEQSERVE_REQUIRE_TORCH") == "1":
        try:
            import torch
        except ImportError as e:
            raise ImportError(f"SEQSERVE_REQUIRE_TORCH=1, but torch does not import: {e}") from e
        return torch
    return pytest.importorskip(
        "torch",
        reason="torch is an optional extra (pip install '.[torch]'); SEQSERVE_REQUIRE_TORCH=1 makes this an error",
    )
