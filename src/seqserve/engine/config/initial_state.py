"""Initial implicit state: the bytes a slot's state starts from."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from seqserve._proto.model_config_pb2 import (
    DataType,
    ModelSequenceBatching,
)
from seqserve.engine.config.names import INITIAL_STATE_DIR, WILDCARD_DIM, State
from seqserve.engine.errors import ModelConfigError
from seqserve.engine.paths import inside
from seqserve.engine.tensors import BY_CONFIG


def read_initial_state(model_dir: Path, state: State, max_batch_size: int) -> tuple[bytes, tuple[int, ...]]:
    """Bytes and shape (without the batch dim) a slot's state starts from.

    ``zero_data`` gives zeros; ``data_file`` gives the leading bytes of
    ``<model_dir>/initial_state/<file>`` (the whole file for TYPE_STRING,
    which must already be in the 4-byte-length serialized form). A state
    without ``initial_state`` starts as zeros of its dims with -1 -> 1
    (Triton leaves it uninitialized; zeros are a safe choice of garbage).
    The data is the same with or without a batch dim of 1, so
    ``max_batch_size`` only matters to the caller's final shape.
    """
    del max_batch_size  # the per-sequence data does not depend on it
    if not state.initial_state:
        shape = tuple(1 if d == WILDCARD_DIM else int(d) for d in state.dims)
        return _zero_bytes(state.data_type, shape), shape
    init = state.initial_state[0]
    shape = tuple(int(d) for d in init.dims)
    if init.WhichOneof("state_data") != "data_file":
        return _zero_bytes(init.data_type, shape), shape
    path = initial_state_path(Path(model_dir), init.data_file)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelConfigError(f"failed to read initial state from {path}: {e}") from e
    if init.data_type == DataType.TYPE_STRING:
        return data, shape
    check_initial_data_size(init, len(data))
    return data[: initial_byte_size(init.data_type, shape)], shape


def initial_state_path(model_dir: Path, data_file: str) -> Path:
    # A config can arrive over the load API, so the name must not lead out of
    # the folder. Symlinks the repository owner placed there are fine (see engine.paths).
    folder = model_dir / INITIAL_STATE_DIR
    return inside(folder, data_file, "initial_state data_file", f"{folder}")


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as e:
        raise ModelConfigError(f"failed to read initial state from {path}: {e}") from e


def _zero_bytes(dt: int, shape: Sequence[int]) -> bytes:
    # An empty string serializes as a 4-byte zero length.
    return bytes(initial_byte_size(dt, shape))


def initial_byte_size(dt: int, shape: Iterable[int]) -> int:
    count = math.prod(int(d) for d in shape)
    if dt == DataType.TYPE_STRING:
        return 4 * count
    dtype = BY_CONFIG.get(dt)
    return (dtype.itemsize if dtype is not None else 0) * count


def check_initial_data_size(init: ModelSequenceBatching.InitialState, have: int) -> None:
    need = initial_byte_size(init.data_type, init.dims)
    if have < need:
        # The missing space before "only" is Triton's; clients may match it.
        raise ModelConfigError(
            f"initial_state setting expects {need} bytes, but the data provided from "
            f"{init.data_file}only has {have} bytes."
        )
