"""Which device rows a batch reads, resets and writes: the slot-to-row arithmetic of the device
state store, plain numpy so that it is tested on the CPU.

The store of a fixed-shape state holds one row per sequence slot. A batch of B rows reads each
row's slot (a view of the store when the rows are consecutive slots in order, else one gather
kernel), START rows are reset to the initial value first (one kernel), and afterwards only the
real rows (``ready``) write their slot back (one kernel): padding rows never change a state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: staged index lists start on this boundary, so the kernels may read them as aligned int32s
STAGING_ALIGN = 16


@dataclass(frozen=True, slots=True)
class RowPlan:
    """One batch's row traffic for one fixed-shape state."""

    #: the slot of row 0 when the batch's rows are the consecutive slots base..base+B-1 in order
    #: (the model may then read the store in place), else -1 (gathered)
    in_place_base: int
    #: int32 [B]: the slot each batch row reads (padding rows read their own slot, harmlessly)
    gather_slots: np.ndarray
    #: int32 [R]: slots reset to the initial value before the batch (START rows)
    reset_slots: np.ndarray
    #: int32 [W] each: the slots written after the batch and the batch rows they take
    scatter_slots: np.ndarray
    scatter_rows: np.ndarray

    @property
    def gathered(self) -> bool:
        return self.in_place_base < 0


def plan_rows(slots: np.ndarray, ready: np.ndarray, start: np.ndarray, *, in_place_allowed: bool) -> RowPlan:
    """The plan for a batch whose row i sits in slot ``slots[i]``. ``in_place_allowed`` is false
    for states the model may write in place (``use_same_buffer_for_input_output``): a view of the
    store would let padding rows change idle slots, so those are always gathered."""
    slots = np.ascontiguousarray(slots, dtype=np.int32)
    ready = np.asarray(ready, dtype=bool)
    start = np.asarray(start, dtype=bool)
    if not (slots.shape == ready.shape == start.shape) or slots.ndim != 1:
        shapes = f"{slots.shape}, {ready.shape}, {start.shape}"
        raise ValueError(f"slots, ready and start must be equal 1-D arrays, got {shapes}")
    if slots.size and int(slots.min()) < 0:
        raise ValueError("a batch row has no slot (-1)")
    base = -1
    if in_place_allowed and slots.size:
        first = int(slots[0])
        if np.array_equal(slots, np.arange(first, first + slots.size, dtype=np.int32)):
            base = first
    real = np.flatnonzero(ready).astype(np.int32)
    reset = slots[ready & start]
    return RowPlan(
        in_place_base=base,
        gather_slots=slots,
        reset_slots=np.ascontiguousarray(reset, dtype=np.int32),
        scatter_slots=np.ascontiguousarray(slots[real], dtype=np.int32),
        scatter_rows=real,
    )


@dataclass(frozen=True, slots=True)
class StagingLayout:
    """Where each of a batch's host arrays lies in the instance's pinned staging buffer, so
    that one pass fills it and each piece is copied to the device asynchronously from there."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    total: int

    @classmethod
    def of(cls, sizes: list[int], align: int = STAGING_ALIGN) -> StagingLayout:
        offsets: list[int] = []
        at = 0
        for n in sizes:
            if n < 0:
                raise ValueError("a staged piece has a negative size")
            at = -(-at // align) * align
            offsets.append(at)
            at += n
        return cls(tuple(offsets), tuple(sizes), at)

    def fill(self, buffer: np.ndarray, pieces: list[np.ndarray]) -> None:
        """Copy ``pieces`` (C-contiguous arrays, in layout order) into ``buffer`` (uint8)."""
        if len(pieces) != len(self.sizes):
            raise ValueError(f"{len(pieces)} pieces for a layout of {len(self.sizes)}")
        if buffer.nbytes < self.total:
            raise ValueError(f"staging buffer of {buffer.nbytes} B is smaller than the layout's {self.total} B")
        for off, n, piece in zip(self.offsets, self.sizes, pieces, strict=True):
            raw = np.ascontiguousarray(piece).view(np.uint8).reshape(-1)
            if raw.size != n:
                raise ValueError(f"piece of {raw.size} B where the layout has {n} B")
            buffer[off : off + n] = raw


def copy_rows_reference(dst: np.ndarray, dst_rows: np.ndarray, src: np.ndarray, src_rows: np.ndarray) -> None:
    """What the row-copy kernel does, on host arrays of shape [rows, row_bytes] (uint8): row
    ``dst_rows[i]`` of ``dst`` becomes row ``src_rows[i]`` of ``src``. The CPU tests check the
    plans against it; the device check checks the kernel against it."""
    if dst_rows.shape != src_rows.shape:
        raise ValueError("dst_rows and src_rows differ in length")
    dst[dst_rows] = src[src_rows]
