"""The GPUs of one model version's instances: a CUDA stream per GPU instance and, for sequence
models with implicit state, its device state table (engine/device). A model without GPU
instances has an empty one and never imports CUDA."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from seqserve.engine._core import Batch, ModelSpec
from seqserve.engine.backends.base import RequestResults
from seqserve.engine.batch import StateViews
from seqserve.engine.device.arrays import is_device_array, to_host
from seqserve.engine.device.placement import InstancePlace

if TYPE_CHECKING:
    from seqserve.engine.device.cuda import CudaStream
    from seqserve.engine.device.state_table import DeviceStateTable


class InstanceDevices:
    """Streams and state tables by instance index (only GPU instances have them)."""

    def __init__(self, places: list[InstancePlace]) -> None:
        self._streams: dict[int, CudaStream] = {}
        self._tables: dict[int, DeviceStateTable] = {}
        gpu = [(i, p.gpu) for i, p in enumerate(places) if p.gpu is not None]
        if gpu:
            from seqserve.engine.device.cuda import CudaStream

            try:
                for index, ordinal in gpu:
                    assert ordinal is not None
                    self._streams[index] = CudaStream(ordinal)
            except Exception:
                self.close()
                raise

    @property
    def any(self) -> bool:
        return bool(self._streams)

    @property
    def holds_state(self) -> bool:
        """Some instance keeps implicit state in device memory (the host store cannot see it)."""
        return bool(self._tables)

    def stream(self, index: int) -> int:
        """The CUDA stream handle of instance ``index`` (0 for a CPU instance)."""
        s = self._streams.get(index)
        return s.handle if s is not None else 0

    def attach_states(self, spec: ModelSpec) -> None:
        """A device state table for every GPU instance, when the model has fixed-shape states."""
        from seqserve.engine.device.state_table import DeviceStateTable, device_held

        if not any(device_held(s) for s in spec.states):
            return
        rows = max(1, spec.max_batch_size)
        for index, stream in self._streams.items():
            self._tables[index] = DeviceStateTable(
                spec.states,
                slots=max(1, spec.slots_per_instance),
                max_rows=rows,
                batched=spec.max_batch_size > 0,
                memory=stream,
            )

    def table(self, index: int) -> DeviceStateTable | None:
        return self._tables.get(index)

    def begin(self, index: int, slots: np.ndarray, ready: np.ndarray, start: np.ndarray) -> Mapping[str, Any]:
        table = self._tables[index]
        self._streams[index].make_current()
        return table.begin(slots, ready, start)

    def close(self) -> None:
        for table in self._tables.values():
            table.close()
        self._tables.clear()
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()


def device_states(devices: InstanceDevices, cb: Batch, names: tuple[str, ...]) -> dict[str, Any]:
    """A GPU instance's ``batch.states``: device-held states as DLPack views of device memory,
    the others (variable-shape, BYTES) from the core's host store."""
    views = devices.begin(cb.instance, cb.slots, cb.ready, cb.start)
    host = [n for n in names if n not in views]
    out: dict[str, Any] = dict(StateViews(tuple(host), cb)) if host else {}
    out.update(views)
    return out


def host_outputs(produced: Mapping[str, Any], state_outputs: list[tuple[int, str]]) -> Mapping[str, Any]:
    """The outputs a reply carries, on the host: a device array (a GPU model's output) is copied
    once; state outputs are left out of the copy (they stay on the device)."""
    states = {name for _, name in state_outputs}
    moved = {k: to_host(v) for k, v in produced.items() if k not in states and is_device_array(v)}
    if not moved:
        return produced
    if isinstance(produced, RequestResults):  # keeps its per-request outcomes
        produced.update(moved)
        return produced
    return {**produced, **moved}
