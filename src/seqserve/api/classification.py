"""Triton's classification extension: a requested output with a class count comes back as its
top classes, BYTES strings "value:index" or "value:index:label", instead of its values.

As in Triton: the top ``class_count`` values of each batch entry (the first dimension, when the
model batches) or of the whole tensor, highest first; a count beyond the entry's element count
gives every element; the shape is ``[batch, k]`` or ``[k]``; floats are written with six
decimals (C++'s ``std::to_string``), integers as they are; labels are the lines of the
output's ``label_filename`` in the model's folder (a class beyond the last line has none);
numeric datatypes only (not BOOL, FP16, BF16, BYTES), refused before the request runs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.api.kserve import bad, clip, wire_datatype
from seqserve.engine import InferResult, Server, tensors

#: the request parameter (HTTP ``outputs[].parameters``, gRPC ``InferRequestedOutputTensor.parameters``)
CLASSIFICATION_PARAM = "classification"
#: the most elements of one batch entry that are ranked (Triton's bound)
MAX_CLASSIFICATION_ELEMENTS = 1_000_000
#: the datatypes that can be ranked, as Triton ranks them
CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})
#: the most bytes of a label file read
MAX_LABEL_FILE_BYTES = 64 << 20


def class_count(output: str, value: Any) -> int:
    """The class count a request gives an output; 0: no classification (as Triton reads it)."""
    if type(value) is not int or value < 0:
        raise bad(f"output '{clip(output)}': Unable to parse 'classification': expected a non-negative integer")
    return value


def check_classifiable(server: Server, model: str, version: str, counts: Mapping[str, int]) -> None:
    """Refuse, before the request runs, a class count on an output whose config datatype cannot
    be ranked (an output the config lacks is left to the engine's own refusal)."""
    cfg = server.model_config(model, version)
    types = {o.name: o.data_type for o in cfg.output}
    for name in counts:
        data_type = types.get(name)
        if data_type is None:
            continue
        datatype = tensors.wire_dtype_name(data_type)
        if datatype not in CLASSIFIABLE:
            raise bad(f"class result not available for output '{clip(name)}' due to unsupported type '{datatype}'")


def classify(server: Server, result: InferResult, counts: Mapping[str, int]) -> None:
    """Replace each output of ``result`` that has a class count by its top classes."""
    model = server.model(result.model_name, result.model_version)
    batched = model.config.max_batch_size > 0
    label_files = {o.name: o.label_filename for o in model.config.output if o.label_filename}
    for name, count in counts.items():
        arr = result.outputs.get(name)
        if arr is None or not count:
            continue
        label_file = label_files.get(name)
        labels = read_labels(str(Path(model.model_dir) / label_file)) if label_file else ()
        result.outputs[name] = top_classes(name, arr, count, batched, labels)


def top_classes(name: str, arr: np.ndarray, count: int, batched: bool, labels: tuple[str, ...]) -> np.ndarray:
    """The top ``count`` classes of each batch entry of ``arr`` as BYTES strings."""
    datatype = wire_datatype(arr)
    if datatype not in CLASSIFIABLE:
        raise bad(f"class result not available for output '{clip(name)}' due to unsupported type '{datatype}'")
    batch = int(arr.shape[0]) if batched and arr.ndim else 0
    width = int(np.prod(arr.shape[1:] if batch else arr.shape, dtype=np.int64))
    rows = arr.reshape(max(batch, 1), width)
    if width > MAX_CLASSIFICATION_ELEMENTS:
        raise bad(f"output '{clip(name)}': classification output tensor too large")
    k = min(count, width)
    out = np.empty((rows.shape[0], k), dtype=object)
    as_float = arr.dtype.kind == "f"
    for r, row in enumerate(rows):
        # highest first; equal values by index (a stable sort of the reversed row, reversed)
        order = (width - 1 - np.argsort(row[::-1], kind="stable")[::-1])[:k]
        for j, index in enumerate(order.tolist()):
            value = row[index]
            text = f"{float(value):.6f}:{index}" if as_float else f"{int(value)}:{index}"
            label = labels[index] if index < len(labels) else ""
            out[r, j] = (f"{text}:{label}" if label else text).encode()
    return out if batch else out.reshape(k)


@functools.lru_cache(maxsize=64)
def _labels_at(path: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    with open(path, "rb") as f:
        data = f.read(MAX_LABEL_FILE_BYTES + 1)
    if len(data) > MAX_LABEL_FILE_BYTES:
        raise bad(f"label file '{clip(os.path.basename(path))}' is over {MAX_LABEL_FILE_BYTES} bytes")
    return tuple(line.rstrip("\r") for line in data.decode("utf-8", "replace").split("\n"))


def read_labels(path: str) -> tuple[str, ...]:
    """The lines of a label file, read again when it changes (size and modification time)."""
    try:
        info = os.stat(path)
    except OSError:
        return ()  # a missing file: no labels, as for a class beyond the last line
    return _labels_at(path, (info.st_size, info.st_mtime_ns))
