"""What a batch-level model sees: one object per executed batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from seqserve.engine.responses import Responder


class RaggedInput:
    """Where each request's part of a ragged input lies (``allow_ragged_batch: true``).

    A ragged input is not cut into equal rows: ``batch.inputs[name]`` holds every request's
    elements end to end, as a 1-D array (Triton's layout for ragged inputs), and request ``i``
    of the batch owns ``data[offsets[i]:offsets[i + 1]]``, which has shape ``shapes[i]``.
    Requests are those of ``batch.request_rows`` (padding rows count as one request of one
    row in the shape of a real one).
    """

    __slots__ = ("offsets", "shapes")

    def __init__(self, shapes: Sequence[tuple[int, ...]]) -> None:
        #: per request: its shape, batch dimension included (``[1, n]`` for one sequence step)
        self.shapes: tuple[tuple[int, ...], ...] = tuple(tuple(s) for s in shapes)
        counts = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        #: int64 [R + 1]: request i's elements are ``data[offsets[i]:offsets[i + 1]]``
        self.offsets: np.ndarray = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.offsets[1:])

    @property
    def lengths(self) -> np.ndarray:
        """int64 [R]: the element count of each request."""
        return np.diff(self.offsets)

    def split(self, data: np.ndarray) -> list[np.ndarray]:
        """Each request's part of ``data`` (the input's 1-D array), in its own shape (views)."""
        off = self.offsets
        return [data[off[i] : off[i + 1]].reshape(shape) for i, shape in enumerate(self.shapes)]

    def __repr__(self) -> str:
        return f"RaggedInput(shapes={list(self.shapes)})"


class _EngineStates(Protocol):
    def state(self, name: str) -> np.ndarray: ...
    def next_state(self, name: str) -> np.ndarray | None: ...


class StateViews(Mapping[str, np.ndarray]):
    """``batch.states`` of an engine batch: a state's array is made on first access (for an
    Oldest batch whose rows are not in slot order, that is when its rows are copied out of the
    state store), so a model that never reads a state pays nothing for it. It also hands out
    the engine's next-state buffers (``ExecuteBatch.next_state``)."""

    __slots__ = ("_batch", "_got", "_names")

    def __init__(self, names: tuple[str, ...], batch: _EngineStates) -> None:
        self._names = names
        self._batch = batch
        self._got: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        arr = self._got.get(name)
        if arr is None:
            if name not in self._names:
                raise KeyError(name)
            arr = self._got[name] = self._batch.state(name)
        return arr

    def next_buffer(self, name: str) -> np.ndarray | None:
        """The engine's buffer for the next value of state ``name``, or None where it has none."""
        return self._batch.next_state(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass(slots=True)
class ExecuteBatch:
    """One batch formed by the scheduler.

    Arrays are read-only views onto the engine's reused buffers and are only valid during
    ``execute``: copy what must outlive the call. Row ``i`` of every array belongs to the same
    request; rows whose ``ready`` is false are padding (Direct strategy) and their data is
    meaningless. Ragged inputs (``allow_ragged_batch``) are the exception: see ``ragged``.
    """

    size: int
    instance: int
    inputs: dict[str, np.ndarray]
    #: implicit state, keyed by the state's input name; [B, ...]. Read-only, except a state with
    #: ``use_same_buffer_for_input_output: true``, whose array is also its next state (see
    #: ``next_state``). A mapping (``StateViews`` for engine batches); ``dict(batch.states)``
    #: gives a dict
    states: Mapping[str, np.ndarray]
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
    #: per request, the client's parameters (forwarded headers among them; {} when none)
    request_parameters: list[dict[str, Any]] = field(default_factory=list)
    #: for instances with ``uses_responders``: request i's Responder (see
    #: ``seqserve.engine.responses``); usable during ``execute`` and after it returns, from any thread
    responder: Callable[[int], Responder] | None = None
    #: ragged inputs (``allow_ragged_batch: true`` on a batched model), keyed by input name:
    #: ``inputs[name]`` is then 1-D, every request's elements end to end, and this tells each
    #: request's extent and shape
    ragged: dict[str, RaggedInput] = field(default_factory=dict)
    #: the model has a batch dimension (``max_batch_size > 0``)
    batched: bool = True
    _next_states: dict[str, np.ndarray] = field(default_factory=dict)

    def next_state(self, name: str) -> np.ndarray:
        """A writable array for the next value of implicit state ``name`` (its input name, as in
        ``states``), shaped like ``states[name]``, its contents unspecified. Write the next state
        into it and return it as the output state: where the engine can, it then becomes the
        state without being copied (otherwise it is copied once, like any returned array).

        Returning it is what updates the state: written but not returned, it is discarded (a
        state with ``use_same_buffer_for_input_output: true`` is the exception: its buffer is
        ``states[name]`` itself, and what is written there is kept). Variable-shape and BYTES
        states get a new array each time; so do isolated models. Valid during ``execute`` only.
        """
        buf = self._next_states.get(name)
        if buf is None:
            buf = self.states.next_buffer(name) if isinstance(self.states, StateViews) else None
            if buf is None:
                buf = np.empty_like(self.states[name])
            self._next_states[name] = buf
        return buf

    def request_inputs(self, name: str) -> list[np.ndarray]:
        """Input ``name`` of each request of the batch, in its own shape (views): a ragged
        input split by its extents, any other input sliced by ``request_rows`` (without a
        batch dimension, ``max_batch_size: 0``, the one request gets the whole array)."""
        data = self.inputs[name]
        ragged = self.ragged.get(name)
        if ragged is not None:
            return ragged.split(data)
        if not self.batched:
            return [data]
        out: list[np.ndarray] = []
        row = 0
        for rows in self.request_rows:
            out.append(data[row : row + rows])
            row += rows
        return out
