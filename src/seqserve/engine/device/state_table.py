"""The implicit state of one GPU instance's sequence slots, in device memory.

Each fixed-shape numeric state has a store of ``slots`` rows on the device, allocated once and
filled with the initial value. Per batch (``begin``): START rows are reset from the initial row,
then the model gets the batch's rows as device arrays (DLPack): the store itself when the rows
are consecutive slots in order (Direct, and Oldest batches that happen to be), else one gather
into a batch buffer. After ``execute`` (``commit``), the real rows of the returned next state are
scattered into the store. Each of those is one kernel launch on the instance's stream, with the
index lists staged in pinned memory and copied by one async copy; nothing synchronizes the
stream but the copies that bring outputs to the host.

Variable-shape and BYTES states are not held here: they stay in the core's host store (the
backend copies them like inputs). Checkpoints of device-held states are refused
(``LoadedModel``): the host store does not see them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve.engine._core import DLPackView, StateSpec
from seqserve.engine.device.memory import DeviceMemory
from seqserve.engine.device.rows import RowPlan, StagingLayout, plan_rows


@dataclass(slots=True)
class _HeldState:
    name: str  # the state's input name
    output_name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    row_bytes: int
    same_buffer: bool
    store: int = 0  # [slots, row_bytes]
    initial: int = 0  # [1, row_bytes]
    batch: int = 0  # [max_rows, row_bytes]: gathered rows, or a host-returned next state
    view_base: int = -1  # this batch: the slot of row 0 when the model reads the store in place
    committed: bool = False


def device_held(spec: StateSpec) -> bool:
    """Whether a state lives in device memory on GPU instances: fixed shape, not BYTES."""
    return spec.dtype.kind != "O" and all(d >= 0 for d in spec.dims)


class DeviceStateTable:
    """One GPU instance's device-held states. Its executor thread is its only user."""

    def __init__(self, specs: Sequence[StateSpec], *, slots: int, max_rows: int, batched: bool, memory: DeviceMemory):
        self._memory = memory
        self._slots = slots
        self._max_rows = max(1, max_rows)
        self._batched = batched
        self._states: dict[str, _HeldState] = {}
        for spec in specs:
            if not device_held(spec):
                continue
            dims = tuple(spec.initial_dims)
            row_bytes = int(np.prod(dims, dtype=np.int64)) * spec.dtype.itemsize
            if len(spec.initial) != row_bytes:
                raise ValueError(f"state '{spec.input_name}': initial value of {len(spec.initial)} B, not {row_bytes}")
            self._states[spec.input_name] = _HeldState(
                spec.input_name, spec.output_name, spec.dtype, dims, row_bytes, spec.same_buffer
            )
        # Index lists: reset (slots, zeros), gather (slots, 0..B-1), scatter (slots, rows), each
        # at most max(slots, max_rows) int32s; the layout is fixed so one pinned buffer serves.
        self._index_cap = max(self._slots, self._max_rows)
        self._index_layout = StagingLayout.of([4 * self._index_cap] * 6)
        self._index_host = memory.alloc_pinned(self._index_layout.total)
        self._index_dev = memory.alloc(self._index_layout.total)
        self._zeros_and_iota = np.concatenate(
            [np.zeros(self._index_cap, np.int32), np.arange(self._index_cap, dtype=np.int32)]
        )
        self._plan: RowPlan | None = None
        self._plan_in_place: RowPlan | None = None
        for st in self._states.values():
            st.store = memory.alloc(self._slots * st.row_bytes)
            st.initial = memory.alloc(st.row_bytes)
            st.batch = memory.alloc(self._max_rows * st.row_bytes)
            initial = next(s.initial for s in specs if s.input_name == st.name)
            self._upload(st.initial, np.frombuffer(initial, np.uint8))
        self._reset_all()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._states)

    def holds(self, name: str) -> bool:
        return name in self._states

    def output_of(self, output_name: str) -> str | None:
        """The input name of the held state whose next value is output ``output_name``."""
        for st in self._states.values():
            if st.output_name == output_name:
                return st.name
        return None

    # ---------------------------------------------------------------------------- per batch

    def begin(self, slots: np.ndarray, ready: np.ndarray, start: np.ndarray) -> dict[str, DLPackView]:
        """Reset the batch's START rows and present every held state's rows as device arrays."""
        rows = int(slots.size)
        if rows > self._max_rows:
            raise ValueError(f"a batch of {rows} rows exceeds this instance's {self._max_rows}")
        gathered = plan_rows(slots, ready, start, in_place_allowed=False)
        in_place = plan_rows(slots, ready, start, in_place_allowed=True)
        self._plan, self._plan_in_place = gathered, in_place
        self._stage(gathered)
        views: dict[str, DLPackView] = {}
        for st in self._states.values():
            st.committed = False
            plan = gathered if st.same_buffer else in_place
            self._copy_rows(st.store, self._index(0), st.initial, self._index(1), plan.reset_slots.size, st.row_bytes)
            if plan.gathered:
                st.view_base = -1
                self._copy_rows(st.batch, self._index(3), st.store, self._index(2), rows, st.row_bytes)
                address = st.batch
            else:
                st.view_base = plan.in_place_base
                address = st.store + plan.in_place_base * st.row_bytes
            views[st.name] = self._view(address, rows, st)
        return views

    def commit(self, name: str, value: Any) -> None:
        """The model's next value of held state ``name`` ([B, ...]): its real rows into the store.
        A device array (``__cuda_array_interface__``, C-contiguous) is read where it is; a host
        array is copied to the device first."""
        st = self._states[name]
        plan = self._plan
        if plan is None:
            raise RuntimeError("commit() outside a batch")
        address = self._source_address(st, value, int(plan.gather_slots.size))
        if st.view_base >= 0 and address == st.store + st.view_base * st.row_bytes:
            st.committed = True  # the model handed back the store's own rows: nothing moves
            return
        self._copy_rows(st.store, self._index(4), address, self._index(5), plan.scatter_slots.size, st.row_bytes)
        st.committed = True

    def finish(self) -> None:
        """After the model call: a same-buffer state's gathered rows (the model may have written
        them in place) go back to the store when it returned no next value."""
        plan = self._plan
        if plan is None:
            return
        for st in self._states.values():
            if st.same_buffer and not st.committed:
                pairs = plan.scatter_slots.size
                self._copy_rows(st.store, self._index(4), st.batch, self._index(5), pairs, st.row_bytes)
        self._plan = self._plan_in_place = None

    def read_slot(self, name: str, slot: int) -> np.ndarray:
        """Slot ``slot``'s current value of state ``name``, copied to the host (synchronizes the
        stream: for tests and diagnostics, never on the hot path)."""
        st = self._states[name]
        out = np.empty(st.dims, st.dtype)
        self._memory.copy_to_host(out.ctypes.data, st.store + slot * st.row_bytes, st.row_bytes)
        self._memory.synchronize()
        return out

    def close(self) -> None:
        memory = self._memory
        for st in self._states.values():
            for ptr in (st.store, st.initial, st.batch):
                memory.free(ptr)
        memory.free(self._index_dev)
        memory.free(self._index_host)
        self._states.clear()

    # ----------------------------------------------------------------------------- helpers

    def _index(self, k: int) -> int:
        return self._index_dev + self._index_layout.offsets[k]

    def _stage(self, plan: RowPlan) -> None:
        """The batch's index lists into pinned memory, then to the device in one copy."""
        memory = self._memory
        memory.wait_fence()  # the previous batch's copy out of the staging buffer is done
        cap, zi = self._index_cap, self._zeros_and_iota
        pieces = [
            plan.reset_slots,
            zi[: plan.reset_slots.size],
            plan.gather_slots,
            zi[cap : cap + plan.gather_slots.size],
            plan.scatter_slots,
            plan.scatter_rows,
        ]
        host = np.ctypeslib.as_array(
            ctypes.cast(self._index_host, ctypes.POINTER(ctypes.c_uint8)), (self._index_layout.total,)
        )
        for off, piece in zip(self._index_layout.offsets, pieces, strict=True):
            raw = np.ascontiguousarray(piece, np.int32).view(np.uint8)
            host[off : off + raw.size] = raw
        memory.copy_to_device(self._index_dev, self._index_host, self._index_layout.total)
        memory.fence()

    def _reset_all(self) -> None:
        """Every slot starts from the initial value (a slot's first use presents it)."""
        plan = plan_rows(
            np.arange(self._slots, dtype=np.int32),
            np.ones(self._slots, bool),
            np.ones(self._slots, bool),
            in_place_allowed=False,
        )
        self._stage(plan)
        for st in self._states.values():
            self._copy_rows(st.store, self._index(0), st.initial, self._index(1), self._slots, st.row_bytes)
        self._memory.synchronize()

    def _copy_rows(self, dst: int, dst_rows: int, src: int, src_rows: int, pairs: int, row_bytes: int) -> None:
        if pairs:
            self._memory.copy_rows(dst, dst_rows, src, src_rows, pairs, row_bytes)

    def _upload(self, dst: int, data: np.ndarray) -> None:
        staging = self._memory.alloc_pinned(data.nbytes)
        ctypes.memmove(staging, data.ctypes.data, data.nbytes)
        self._memory.copy_to_device(dst, staging, data.nbytes)
        self._memory.synchronize()
        self._memory.free(staging)

    def _view(self, address: int, rows: int, st: _HeldState) -> DLPackView:
        shape = [rows, *st.dims] if self._batched else list(st.dims)
        kind, ordinal = self._memory.dlpack_device
        return DLPackView(address, shape, st.dtype.name, kind, ordinal, self)

    def _source_address(self, st: _HeldState, value: Any, rows: int) -> int:
        want = (rows, *st.dims) if self._batched else st.dims
        iface: Mapping[str, Any] | None = getattr(value, "__cuda_array_interface__", None)
        if iface is not None:
            if tuple(iface["shape"]) != want or np.dtype(iface["typestr"]) != st.dtype:
                raise ValueError(
                    f"state '{st.output_name}': next value {tuple(iface['shape'])} {np.dtype(iface['typestr'])}, "
                    f"expected {want} {st.dtype}"
                )
            strides = iface.get("strides")
            if strides is not None and tuple(strides) != _contiguous_strides(want, st.dtype.itemsize):
                raise ValueError(f"state '{st.output_name}': the next value must be C-contiguous")
            return int(iface["data"][0])
        host = np.ascontiguousarray(np.asarray(value), st.dtype)
        if host.shape != want:
            raise ValueError(f"state '{st.output_name}': next value {host.shape}, expected {want}")
        self._memory.wait_fence()
        staging = self._memory.alloc_pinned(host.nbytes)
        ctypes.memmove(staging, host.ctypes.data, host.nbytes)
        self._memory.copy_to_device(st.batch, staging, host.nbytes)
        self._memory.synchronize()
        self._memory.free(staging)
        return st.batch


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out: list[int] = []
    step = itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(1, d)
    return tuple(reversed(out))
