"""The one table of tensor data types, and the BYTES wire codec.

Every layer derives its view of a datatype from ``DATA_TYPES``: config parsing (the config
enum), the KServe codecs (the wire name), the Triton shim (``TYPE_*`` strings), the backends
(ONNX names) and the compiled core (item size and numpy dtype, passed in its specs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import seqserve.engine._core as _core
from seqserve._proto.model_config_pb2 import DataType as _DT


@dataclass(frozen=True, slots=True)
class DataType:
    """One tensor datatype as each layer names it."""

    config: int  # model_config.proto DataType value
    wire: str  # KServe v2 name: "FP32", "BYTES"
    numpy: np.dtype[Any] | None  # object for BYTES; None where numpy has no type (BF16)
    itemsize: int  # bytes per element; 0 for BYTES (variable size)
    onnx: str  # onnxruntime's type string

    @property
    def config_name(self) -> str:
        """Triton's config spelling: "TYPE_FP32", "TYPE_STRING"."""
        return _DT.Name(self.config)

    @property
    def is_bytes(self) -> bool:
        return self.config == _DT.TYPE_STRING


def _dt(config: int, wire: str, numpy: str | None, itemsize: int, onnx: str) -> DataType:
    return DataType(config, wire, None if numpy is None else np.dtype(numpy), itemsize, f"tensor({onnx})")


DATA_TYPES: tuple[DataType, ...] = (
    _dt(_DT.TYPE_BOOL, "BOOL", "?", 1, "bool"),
    _dt(_DT.TYPE_UINT8, "UINT8", "u1", 1, "uint8"),
    _dt(_DT.TYPE_UINT16, "UINT16", "<u2", 2, "uint16"),
    _dt(_DT.TYPE_UINT32, "UINT32", "<u4", 4, "uint32"),
    _dt(_DT.TYPE_UINT64, "UINT64", "<u8", 8, "uint64"),
    _dt(_DT.TYPE_INT8, "INT8", "i1", 1, "int8"),
    _dt(_DT.TYPE_INT16, "INT16", "<i2", 2, "int16"),
    _dt(_DT.TYPE_INT32, "INT32", "<i4", 4, "int32"),
    _dt(_DT.TYPE_INT64, "INT64", "<i8", 8, "int64"),
    _dt(_DT.TYPE_FP16, "FP16", "<f2", 2, "float16"),
    _dt(_DT.TYPE_FP32, "FP32", "<f4", 4, "float"),
    _dt(_DT.TYPE_FP64, "FP64", "<f8", 8, "double"),
    _dt(_DT.TYPE_STRING, "BYTES", "O", 0, "string"),
    _dt(_DT.TYPE_BF16, "BF16", None, 2, "bfloat16"),
)

BY_CONFIG: dict[int, DataType] = {d.config: d for d in DATA_TYPES}
BY_WIRE: dict[str, DataType] = {d.wire: d for d in DATA_TYPES}
BY_NUMPY: dict[np.dtype[Any], DataType] = {d.numpy: d for d in DATA_TYPES if d.numpy is not None}


def of_wire(name: str) -> DataType | None:
    return BY_WIRE.get(name)


def of_numpy(dtype: np.dtype[Any]) -> DataType | None:
    """The datatype of a numpy array; str/bytes arrays count as BYTES."""
    if dtype.byteorder == ">":  # the table is little-endian; a big-endian array has the same type
        dtype = dtype.newbyteorder("<")
    found = BY_NUMPY.get(dtype)
    if found is None and dtype.kind in "SU":
        return BY_CONFIG[_DT.TYPE_STRING]
    return found


def to_numpy_dtype(config: int) -> np.dtype[Any] | None:
    """numpy dtype for a config DataType; object for TYPE_STRING, None for BF16 (numpy has
    no bfloat16). ValueError for a value that is not a tensor datatype."""
    d = BY_CONFIG.get(config)
    if d is None:
        raise ValueError(f"no numpy dtype for {_config_name(config)}")
    return d.numpy


def wire_dtype_name(config: int) -> str:
    """Protocol datatype name: TYPE_STRING -> "BYTES", TYPE_FP32 -> "FP32"."""
    d = BY_CONFIG.get(config)
    return d.wire if d is not None else "INVALID"


def numpy_wire_name(dtype: np.dtype[Any]) -> str:
    """Protocol datatype name of a numpy dtype (str/bytes arrays are BYTES)."""
    d = of_numpy(dtype)
    return d.wire if d is not None else str(dtype)


def from_wire_dtype_name(name: str) -> int:
    """Config DataType for a protocol datatype name; TYPE_INVALID if unknown."""
    d = BY_WIRE.get(name)
    return d.config if d is not None else _DT.TYPE_INVALID


def serialize_bytes(arr: np.ndarray) -> bytes:
    """BYTES tensor -> wire format (4-byte little-endian length + data, per element)."""
    return _core.serialize_bytes(arr)


def deserialize_bytes(data: bytes | memoryview, shape: list[int]) -> np.ndarray:
    """Wire-format BYTES -> object array of bytes; ValueError when data and shape disagree."""
    return _core.deserialize_bytes(data, shape)


def _config_name(config: int) -> str:
    try:
        return _DT.Name(config)
    except ValueError:
        return str(config)
