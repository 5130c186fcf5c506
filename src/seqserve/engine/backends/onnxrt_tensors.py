"""What both ONNX Runtime instance kinds (CPU: onnxrt.py, GPU: onnxrt_gpu.py) share: the feed
plan computed at load, and the string tensors' conversions between numpy's object arrays of
bytes (the engine's BYTES) and the str arrays ONNX Runtime takes and gives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class OnnxPlan:
    """How one instance feeds the graph and reads it back; computed once at load."""

    feeds: tuple[tuple[str, str, tuple[int, ...] | None, bool], ...]  # (name, where, reshape, is_string)
    outputs: tuple[str, ...]  # config outputs, then state outputs
    state_outputs: frozenset[str]
    string_outputs: frozenset[str]
    reshape_outputs: tuple[tuple[str, tuple[int, ...]], ...]


def to_text(arr: np.ndarray) -> np.ndarray:
    """A BYTES tensor (object array of bytes) as ONNX Runtime takes strings."""
    if arr.dtype.kind == "U":
        return arr.copy()  # padding rows may be overwritten
    flat = arr.reshape(-1)
    try:
        text = [bytes(v).decode() if isinstance(v, bytes | bytearray | memoryview) else str(v) for v in flat]
    except UnicodeDecodeError:
        return np.array([bytes(v) if not isinstance(v, str) else v.encode() for v in flat], dtype=np.bytes_).reshape(
            arr.shape
        )
    out = np.empty(flat.shape, dtype=object)
    out[:] = text
    return out.reshape(arr.shape)


def to_bytes(arr: np.ndarray) -> np.ndarray:
    flat = arr.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    out[:] = [v.encode() if isinstance(v, str) else v for v in flat]
    return out.reshape(arr.shape)
