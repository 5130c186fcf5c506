"""Typed surface of the compiled core (csrc/, built by setup.py). Checked by mypy.stubtest."""

from collections.abc import Callable
from typing import Any, TypeAlias

import numpy as np

STATELESS: int
DIRECT: int
OLDEST: int
DYNAMIC: int

def serialize_bytes(array: np.ndarray) -> bytes:
    """Serialize a BYTES tensor (object array) to the 4-byte-length-prefixed wire format."""

def deserialize_bytes(data: Any, shape: list[int] | tuple[int, ...]) -> np.ndarray:
    """Parse wire-format BYTES data into an object array of bytes."""

class Batch:
    """One batch formed by the scheduler; valid only during the runner call."""

    @property
    def size(self) -> int: ...
    @property
    def instance(self) -> int: ...
    @property
    def handles(self) -> list[int]:
        """The request handle of every row; 0 for padding rows."""
    def inputs(self) -> dict[str, np.ndarray]: ...
    def controls(self) -> dict[str, np.ndarray]: ...
    def states(self) -> dict[str, np.ndarray]:
        """Implicit state keyed by state input name (read-only views)."""
    @property
    def start(self) -> np.ndarray: ...
    @property
    def end(self) -> np.ndarray: ...
    @property
    def ready(self) -> np.ndarray: ...
    @property
    def corrid(self) -> np.ndarray: ...
    def set_state(self, index: int, value: np.ndarray) -> None:
        """Store output state `index` for every real row of the batch."""
    def mark_executed(self) -> None: ...
    def finish(self, ok: bool) -> None:
        """Record this batch's statistics now, before its replies are sent."""

_InputArg: TypeAlias = np.ndarray | tuple[bytes | np.ndarray, tuple[int, ...] | list[int]]
_StateArg: TypeAlias = tuple[str, str, int, list[int], bool, bytes, list[int]]

class Scheduler:
    """Scheduler and executor threads of one model."""

    def __init__(
        self,
        *,
        name: str,
        strategy: int,
        max_batch_size: int,
        instance_count: int,
        slots_per_instance: int,
        idle_us: int,
        max_queue_delay_us: int,
        min_slot_utilization: float,
        inputs: list[tuple[str, int, bool, list[int]]],
        controls: list[tuple[str, int, int, float, float]],
        states: list[_StateArg],
        delay_requests: int,
        delay_backlog_requests: int,
        runner: Callable[[Batch], bool],
        on_fail: Callable[[list[int], int, str], None],
        on_warning: Callable[[str], None],
        preferred_batch_sizes: list[int] = ...,
        batch_delay_us: int = 0,
        priority_levels: int = 1,
        default_priority: int = 1,
        queue_policies: list[tuple[bool, int, bool, int]] = ...,
        timeout_complete: bool = False,
        on_expire: Callable[[dict[str, Any]], None] | None = None,
    ) -> None: ...
    def start(self) -> None: ...
    def submit(
        self,
        handle: int,
        inputs: tuple[_InputArg, ...],
        corrid: int | str = 0,
        start: bool = False,
        end: bool = False,
        timeout_us: int = 0,
        rows: int = 1,
        priority: int = 0,
    ) -> tuple[int, str] | None:
        """Queue a request. Returns None when accepted, else (code, message)."""
    def stop_accepting(self) -> None: ...
    def inflight_sequences(self) -> int: ...
    def pending_requests(self) -> int: ...
    def free_slots(self) -> int: ...
    def backlog_sequences(self) -> int: ...
    def sequences(self) -> list[tuple[str, int]]: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self, force: bool = False) -> None: ...
