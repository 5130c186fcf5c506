"""What a batch-level model sees: one object per executed batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from seqserve.engine.responses import Responder


@dataclass(slots=True)
class ExecuteBatch:
    """One batch formed by the scheduler.

    Arrays are read-only views onto the engine's reused buffers and are only valid during
    ``execute``: copy what must outlive the call. Row ``i`` of every array belongs to the same
    request; rows whose ``ready`` is false are padding (Direct strategy) and their data is
    meaningless.
    """

    size: int
    instance: int
    inputs: dict[str, np.ndarray]
    #: implicit state, keyed by the state's input name; [B, ...]
    states: dict[str, np.ndarray]
    #: the configured control tensors (START/END/READY/CORRID), keyed by their names; [B, 1]
    controls: dict[str, np.ndarray]
    start: np.ndarray  # bool [B]
    end: np.ndarray  # bool [B]
    ready: np.ndarray  # bool [B]; false on padding rows
    corrid: np.ndarray  # uint64 [B], or object [B] of str when string ids are in the batch
    #: rows each request occupies, in order (padding and final-END rows count 1); their sum is
    #: the batch's row count. Request-level APIs (Triton-style models) split the batch by it.
    request_rows: list[int]
    #: per request, the outputs it asked for; None for rows that get no reply
    request_outputs: list[tuple[str, ...] | None]
    #: per request, the client's request id ("" when none was given)
    request_ids: list[str] = field(default_factory=list)
    #: for instances with ``uses_responders``: request i's Responder (see
    #: ``seqserve.engine.responses``); usable during ``execute`` and after it returns, from any thread
    responder: Callable[[int], Responder] | None = None
