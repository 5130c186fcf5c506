"""ONNX Runtime instances on a GPU (``KIND_GPU`` with ``onnxruntime-gpu``): the CUDA execution
provider with IOBinding, so the engine's device-held states are read where they are (bound by
pointer) and the next states the graph writes stay on the device; inputs and the outputs a
reply carries are bound on the CPU.

ONNX Runtime runs on a stream of its own, so the instance's stream (the engine's state copies)
is synchronized before the run: one wait per batch that the TorchScript path does not need.
Not verified on the project's GPU machine, which has no onnxruntime-gpu (docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from seqserve.engine.backends.base import BackendInstance
from seqserve.engine.backends.onnxrt_tensors import OnnxPlan, to_bytes, to_text
from seqserve.engine.batch import ExecuteBatch

#: ONNX Runtime's element type names (OrtValue.data_type()) as numpy dtypes
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


def cuda_provider_missing(ort: Any) -> str:
    """Why this onnxruntime cannot run a GPU instance ("" when it can)."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return ""
    return "this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"


class OrtDeviceArray:
    """An OrtValue in device memory, seen as a CUDA array (``__cuda_array_interface__``) by the
    engine's state table; it keeps the OrtValue alive."""

    __slots__ = ("__cuda_array_interface__", "_value")

    def __init__(self, value: Any) -> None:
        self._value = value
        dtype = np.dtype(_ORT_TYPES[value.data_type()])
        self.__cuda_array_interface__ = {
            "shape": tuple(value.shape()),
            "typestr": dtype.str,
            "data": (int(value.data_ptr()), False),
            "strides": None,
            "version": 3,
        }


class OnnxGpuInstance(BackendInstance):
    def __init__(self, session: Any, plan: OnnxPlan, run_options: Any, batched: bool, *, ordinal: int, stream: int):
        self._session = session
        self._plan = plan
        self._run_options = run_options
        self._batched = batched
        self._ordinal = ordinal
        self._stream = stream

    def execute(self, batch: ExecuteBatch) -> Mapping[str, Any]:
        from cuda.bindings import runtime

        plan = self._plan
        binding = self._session.io_binding()
        sources = {"inputs": batch.inputs, "controls": batch.controls, "states": batch.states}
        device_states: set[str] = set()
        for name, where, reshape, is_string in plan.feeds:
            arr = sources[where][name]
            if not isinstance(arr, np.ndarray):  # a device-held state (DLPackView)
                shape = list(arr.shape)
                if reshape is not None:
                    shape = [shape[0], *reshape] if self._batched else list(reshape)
                binding.bind_input(name, "cuda", self._ordinal, np.dtype(arr.dtype), shape, arr.address)
                device_states.add(name)
                continue
            if is_string:
                arr = to_text(arr)
            if reshape is not None:
                arr = arr.reshape((arr.shape[0], *reshape) if self._batched else reshape)
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        wanted: set[str] = set(plan.state_outputs)
        for outs in batch.request_outputs:
            if outs:
                wanted.update(outs)
        names = [n for n in plan.outputs if n in wanted] or list(plan.outputs)
        on_device = {n for n in names if n in plan.state_outputs and device_states}
        for name in names:
            if name in on_device:
                binding.bind_output(name, "cuda", self._ordinal)
            else:
                binding.bind_output(name)
        (status,) = runtime.cudaStreamSynchronize(self._stream)  # the state copies are done
        if status != runtime.cudaError_t.cudaSuccess:
            raise RuntimeError(f"cudaStreamSynchronize failed: {status}")
        self._session.run_with_iobinding(binding, self._run_options)
        result: dict[str, Any] = {}
        for name, value in zip(names, binding.get_outputs(), strict=True):
            result[name] = OrtDeviceArray(value) if name in on_device else value.numpy()
        for name in plan.string_outputs:
            if name in result:
                result[name] = to_bytes(result[name])
        for name, dims in plan.reshape_outputs:
            if name in result and name not in on_device:
                value = result[name]
                result[name] = value.reshape((value.shape[0], *dims) if self._batched else dims)
        return result

    def finalize(self) -> None:
        self._session = None
