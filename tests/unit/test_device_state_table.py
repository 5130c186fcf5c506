"""The device state table (engine/device/state_table.py) driven with host memory: the same
resets, in-place reads, gathers and scatters a GPU instance issues, checked value by value on
the CPU; and DLPackView, the engine's DLPack producer, consumed by numpy and torch."""

from __future__ import annotations

import ctypes
import gc
import sys

import numpy as np
import pytest

from seqserve.engine._core import DLPackView, StateSpec
from seqserve.engine.device.state_table import DeviceStateTable, device_held
from tests.support.host_memory import HostMemory


def spec(name: str, dims: list[int], initial: np.ndarray | None = None, *, same_buffer: bool = False) -> StateSpec:
    init = np.zeros(dims, np.float32) if initial is None else initial.astype(np.float32)
    return StateSpec(
        input_name=name,
        output_name=name + "_OUT",
        dtype=np.dtype(np.float32),
        dims=dims,
        initial=init.tobytes(),
        initial_dims=list(init.shape),
        same_buffer=same_buffer,
    )


def table(specs: list[StateSpec], slots: int = 4, rows: int = 4) -> tuple[DeviceStateTable, HostMemory]:
    mem = HostMemory()
    return DeviceStateTable(specs, slots=slots, max_rows=rows, batched=True, memory=mem), mem


def step(t: DeviceStateTable, slots, ready, start, add: float, name: str = "S") -> np.ndarray:
    """One batch: the model reads the state and returns state + add (a fresh host array)."""
    views = t.begin(np.array(slots, np.int32), np.array(ready), np.array(start))
    current = np.from_dlpack(views[name]).copy()
    t.commit(name, current + add)
    t.finish()
    return current


def test_every_slot_starts_from_the_initial_value():
    t, _ = table([spec("S", [2], np.array([1.5, -2.0]))])
    for slot in range(4):
        assert t.read_slot("S", slot).tolist() == [1.5, -2.0]


def test_direct_batches_read_the_store_in_place_and_write_real_rows_only():
    t, mem = table([spec("S", [2])])
    seen = step(t, [0, 1, 2, 3], [True, True, False, True], [True, True, False, True], 1.0)
    assert seen.tolist() == [[0, 0]] * 4
    # in place: no gather launch, only the scatter (reset rows are at the initial value already)
    assert [c[0] for c in mem.row_copies[-2:]] == [3, 3]  # reset 3 START rows, scatter 3 real rows
    assert t.read_slot("S", 2).tolist() == [0, 0]  # the padding row's slot is untouched
    seen = step(t, [0, 1, 2, 3], [True, True, True, True], [False, False, True, False], 2.0)
    assert seen.tolist() == [[1, 1], [1, 1], [0, 0], [1, 1]]
    assert [t.read_slot("S", s).tolist() for s in range(4)] == [[3, 3], [3, 3], [2, 2], [3, 3]]


def test_start_resets_a_slot_that_held_an_earlier_sequence():
    t, _ = table([spec("S", [1], np.array([10.0]))])
    step(t, [1], [True], [True], 5.0)
    assert t.read_slot("S", 1).tolist() == [15.0]
    seen = step(t, [1], [True], [True], 1.0)  # a new sequence in slot 1
    assert seen.tolist() == [[10.0]] and t.read_slot("S", 1).tolist() == [11.0]


def test_oldest_batches_out_of_slot_order_are_gathered_and_scattered_back():
    t, _ = table([spec("S", [3])], slots=6, rows=4)
    for s, v in ((5, 50.0), (2, 20.0), (4, 40.0)):
        step(t, [s], [True], [True], v)
    seen = step(t, [4, 2, 5], [True, True, True], [False, False, False], 1.0)
    assert seen[:, 0].tolist() == [40.0, 20.0, 50.0]
    assert [t.read_slot("S", s)[0] for s in (2, 4, 5)] == [21.0, 41.0, 51.0]
    assert t.read_slot("S", 0).tolist() == [0, 0, 0]


def test_same_buffer_state_keeps_in_place_writes_of_real_rows_only():
    t, _ = table([spec("S", [1], same_buffer=True)])
    views = t.begin(np.array([0, 1], np.int32), np.array([True, False]), np.array([True, False]))
    view = views["S"]
    arr = np.ctypeslib.as_array(ctypes.cast(view.address, ctypes.POINTER(ctypes.c_float)), tuple(view.shape))
    arr += 7.0  # written in place, as a model writes its device array; nothing returned
    t.finish()
    assert t.read_slot("S", 0).tolist() == [7.0]
    assert t.read_slot("S", 1).tolist() == [0.0]  # the padding row's write is not kept


def test_returning_the_store_rows_themselves_moves_nothing():
    t, mem = table([spec("S", [2])])
    views = t.begin(np.array([0, 1], np.int32), np.array([True, True]), np.array([False, False]))
    launches = len(mem.row_copies)

    class Same:  # a device array that is the in-place view itself
        __cuda_array_interface__ = {
            "shape": (2, 2),
            "typestr": "<f4",
            "data": (views["S"].address, False),
            "version": 3,
            "strides": None,
        }

    t.commit("S", Same())
    t.finish()
    assert len(mem.row_copies) == launches


def test_wrong_next_state_shape_is_an_error_that_names_the_state():
    t, _ = table([spec("S", [2])])
    t.begin(np.array([0], np.int32), np.array([True]), np.array([True]))
    with pytest.raises(ValueError, match="S_OUT"):
        t.commit("S", np.zeros((1, 3), np.float32))


def test_variable_shape_and_bytes_states_stay_on_the_host():
    assert device_held(spec("S", [2]))
    var = StateSpec(
        input_name="V", output_name="V", dtype=np.dtype(np.float32), dims=[-1], initial=b"", initial_dims=[0]
    )
    assert not device_held(var)
    t, _ = table([spec("S", [2]), var])
    assert t.names == ("S",) and t.output_of("S_OUT") == "S" and t.output_of("V") is None


def test_one_staging_copy_per_batch():
    t, mem = table([spec("A", [2]), spec("B", [4])])
    before = mem.copies_to_device
    t.begin(np.array([3, 0], np.int32), np.array([True, True]), np.array([True, False]))
    assert mem.copies_to_device - before == 1  # both states' index lists in one copy
    assert mem.fences > 0


def test_dlpack_view_is_read_by_numpy_and_torch_without_a_copy():
    data = np.arange(6, dtype=np.float32)
    view = DLPackView(data.ctypes.data, [2, 3], "float32", 1, 0, data)
    assert view.__dlpack_device__() == (1, 0)
    arr = np.from_dlpack(view)
    assert arr.shape == (2, 3) and arr[1, 2] == 5.0
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(view)
    t[0, 0] = 42.0
    assert data[0] == 42.0


def test_dlpack_view_keeps_its_owner_alive_and_refuses_unknown_types():
    owner = np.ones(4, np.int64)
    refs = sys.getrefcount(owner)
    view = DLPackView(owner.ctypes.data, [4], "int64", 1, 0, owner)
    arr = np.from_dlpack(view)
    del view
    gc.collect()
    assert sys.getrefcount(owner) > refs  # the export still holds it
    del arr
    gc.collect()
    assert sys.getrefcount(owner) == refs
    with pytest.raises(ValueError, match="no DLPack type"):
        DLPackView(owner.ctypes.data, [4], "complex64", 1, 0, owner)
    with pytest.raises(ValueError, match="device_type"):
        DLPackView(owner.ctypes.data, [4], "int64", 7, 0, owner)
