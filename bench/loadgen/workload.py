"""What each step sends: tensors built from the model's metadata (random data of the right shape
and datatype) or read from a JSON file of per-sequence step data, and how replies are checked.

A payload is a tuple of ``(name, datatype, array)``, one per model input, ready for a transport.
Random payloads come from a pool built once (``POOL`` payloads), so the hot loop only picks
references. Verification (the demo ``accumulator``): the reply's output must equal the running
sum, in FP32 as the server computes it, of the sequence's ``verify_input`` values.

``--data FILE.json`` (perf_analyzer's layout for sequence models)::

    {"data": [
        [ {"INPUT": [1.0]}, {"INPUT": [2.0]}, {"INPUT": [3.0]} ],    <- sequence 0, 3 steps
        [ {"INPUT": {"content": [4.0], "shape": [1]}} ]             <- sequence 1, 1 step
    ]}

Each step names every input; a value is a (nested) list, a scalar or ``{"content": ..., "shape":
...}``, reshaped to the input's shape (``-1`` dims taken from the data; a batch dimension of 1 is
added when the model batches). Generator sequence ``i`` replays data sequence ``i % len(data)``
with the data's own length (``--seq-len`` does not apply). A flat list of steps is one sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

POOL = 256

# KServe v2 datatype -> numpy dtype
NP_DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}  # fmt: skip

Payload = tuple[tuple[str, str, np.ndarray], ...]
Step = tuple[Payload, "np.ndarray | None"]  # payload, the verify input's value (or None)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as sent: every -1 resolved


def resolve_shape(meta_shape: list[Any], override: list[int] | None = None) -> tuple[int, ...]:
    """A metadata shape with its variable (-1) dims set to 1 (the batch dimension included),
    unless the user gave the shape."""
    if override is not None:
        return tuple(override)
    return tuple(1 if int(d) < 0 else int(d) for d in meta_shape)


def _random(spec: TensorSpec, rng: np.random.Generator, exact: bool) -> np.ndarray:
    dt = spec.datatype
    if dt not in NP_DTYPES:
        raise ValueError(f"input {spec.name!r}: datatype {dt} is not supported by the generator (use --data)")
    shape = spec.shape
    if dt == "BYTES":
        flat = [bytes(rng.integers(97, 123, 8, dtype=np.uint8)) for _ in range(int(np.prod(shape)))]
        return np.array(flat, dtype=np.object_).reshape(shape)
    if dt == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    npdt = NP_DTYPES[dt]
    if np.issubdtype(npdt, np.floating):
        if exact:  # small integers: every running sum is exact in FP32
            return rng.integers(-9, 10, shape).astype(npdt)
        return rng.standard_normal(shape).astype(npdt)
    info = np.iinfo(npdt)
    return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(npdt)


@dataclass
class Workload:
    inputs: list[TensorSpec]
    output_name: str | None  # the output the transports return (None: the first the server sends)
    verify_input: str | None = None  # accumulator check on this input; None: replies are not checked
    source: str = "metadata"
    pool: list[Step] = field(default_factory=list)
    data: list[list[Step]] | None = None

    @property
    def verify(self) -> bool:
        return self.verify_input is not None

    def without_verify(self) -> Workload:
        """The same payloads, replies not checked (e.g. for a floor server, which only echoes)."""
        return Workload(self.inputs, self.output_name, None, self.source, self.pool, self.data)

    def sequence(self, rng: np.random.Generator, seq_no: int, seq_len: int, jitter: float) -> list[Step]:
        """The steps of one sequence: its data when a data file was given, else ``seq_len`` steps
        (varied by +-``jitter`` x seq_len, uniformly) of pool payloads from a random offset."""
        if self.data is not None:
            return self.data[seq_no % len(self.data)]
        n = seq_len
        if jitter > 0:
            lo = max(1, round(seq_len * (1.0 - jitter)))
            hi = max(lo, round(seq_len * (1.0 + jitter)))
            n = int(rng.integers(lo, hi + 1))
        pool = self.pool
        off = int(rng.integers(len(pool)))
        return [pool[(off + k) % len(pool)] for k in range(n)]

    def describe(self) -> str:
        ins = ", ".join(f"{t.name} {t.datatype} {list(t.shape)}" for t in self.inputs)
        check = f"verify: running sum of {self.verify_input}" if self.verify else "replies not verified"
        return f"inputs ({self.source}): {ins}; {check}"


def _step(inputs: list[TensorSpec], arrays: dict[str, np.ndarray], verify_input: str | None) -> Step:
    payload = tuple((t.name, t.datatype, arrays[t.name]) for t in inputs)
    vin = arrays[verify_input].astype(np.float32) if verify_input else None
    return payload, vin


def accumulator_like(meta: dict[str, Any], input_name: str, output_name: str) -> bool:
    """The demo accumulator's signature: one FP32 input, an FP32 output, one element per step."""
    ins = meta.get("inputs") or []
    outs = {o["name"]: o for o in meta.get("outputs") or []}
    if len(ins) != 1 or ins[0]["name"] != input_name or output_name not in outs:
        return False
    a, b = ins[0], outs[output_name]
    one = all(int(d) in (-1, 1) for d in a["shape"]) and all(int(d) in (-1, 1) for d in b["shape"])
    return bool(a["datatype"] == b["datatype"] == "FP32" and one)


def from_metadata(
    meta: dict[str, Any],
    *,
    input_name: str,
    output_name: str,
    verify: str,
    shapes: dict[str, list[int]] | None = None,
    seed: int = 0,
) -> Workload:
    """Random payloads of the right shape and datatype for the model ``meta`` describes.
    ``verify``: "on", "off" or "auto" (on for an accumulator-like model)."""
    shapes = shapes or {}
    inputs = [
        TensorSpec(t["name"], t["datatype"], resolve_shape(t["shape"], shapes.get(t["name"])))
        for t in meta.get("inputs") or []
    ]
    if not inputs:
        raise ValueError(f"model {meta.get('name')!r} has no inputs in its metadata")
    out_names = [o["name"] for o in meta.get("outputs") or []]
    vin = _verify_input(meta, inputs, input_name, output_name, verify)
    rng = np.random.default_rng(seed)
    exact = vin is not None
    pool = [_step(inputs, {t.name: _random(t, rng, exact) for t in inputs}, vin) for _ in range(POOL)]
    out = output_name if output_name in out_names else (out_names[0] if out_names else None)
    return Workload(inputs, out, vin, "metadata", pool)


def _verify_input(
    meta: dict[str, Any], inputs: list[TensorSpec], input_name: str, output_name: str, verify: str
) -> str | None:
    if verify == "off":
        return None
    ok = accumulator_like(meta, input_name, output_name)
    if verify == "on" and not ok:
        names = {t.name for t in inputs}
        outs = {o["name"] for o in meta.get("outputs") or []}
        if input_name not in names or output_name not in outs:
            raise ValueError(
                f"--verify on needs input {input_name!r} and output {output_name!r} "
                f"(the model has inputs {sorted(names)}, outputs {sorted(outs)})"
            )
    return input_name if (ok or verify == "on") else None


def _array(spec: TensorSpec, value: Any, batched: bool) -> np.ndarray:
    shape: list[int] | None = None
    if isinstance(value, dict):
        shape = value.get("shape")
        value = value.get("content", value.get("data"))
    npdt = NP_DTYPES.get(spec.datatype)
    if npdt is None:
        raise ValueError(f"input {spec.name!r}: datatype {spec.datatype} is not supported")
    if spec.datatype == "BYTES":
        flat = np.array([v.encode() if isinstance(v, str) else bytes(v) for v in np.ravel(value)], dtype=np.object_)
    else:
        flat = np.asarray(value, dtype=npdt).ravel()
    if shape is not None:
        arr = flat.reshape(shape)
        if batched and len(arr.shape) == len(spec.shape) - 1:
            arr = arr.reshape((1, *arr.shape))
        return arr
    if flat.size == int(np.prod(spec.shape)):
        return flat.reshape(spec.shape)
    return flat.reshape((1, -1) if batched else (-1,))


def from_data_file(
    path: Path,
    meta: dict[str, Any],
    *,
    input_name: str,
    output_name: str,
    verify: str,
    batched: bool,
    shapes: dict[str, list[int]] | None = None,
) -> Workload:
    """Per-sequence step data from ``path`` (see the module docstring)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--data {path}: {e}") from None
    seqs = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(seqs, list) or not seqs:
        raise ValueError(f"--data {path}: expected {{'data': [[step, ...], ...]}} with at least one sequence")
    if all(isinstance(s, dict) for s in seqs):
        seqs = [seqs]  # one sequence
    shapes = shapes or {}
    inputs = [
        TensorSpec(t["name"], t["datatype"], resolve_shape(t["shape"], shapes.get(t["name"])))
        for t in meta.get("inputs") or []
    ]
    vin = _verify_input(meta, inputs, input_name, output_name, verify)
    out: list[list[Step]] = []
    for i, seq in enumerate(seqs):
        if not isinstance(seq, list) or not seq:
            raise ValueError(f"--data {path}: sequence {i} is not a non-empty list of steps")
        steps: list[Step] = []
        for k, st in enumerate(seq):
            missing = [t.name for t in inputs if t.name not in st]
            if missing:
                raise ValueError(f"--data {path}: sequence {i} step {k} lacks input(s) {missing}")
            try:
                arrays = {t.name: _array(t, st[t.name], batched) for t in inputs}
            except (ValueError, TypeError) as e:
                raise ValueError(f"--data {path}: sequence {i} step {k}: {e}") from None
            steps.append(_step(inputs, arrays, vin))
        out.append(steps)
    out_names = [o["name"] for o in meta.get("outputs") or []]
    oname = output_name if output_name in out_names else (out_names[0] if out_names else None)
    sent = [TensorSpec(t.name, t.datatype, tuple(out[0][0][0][j][2].shape)) for j, t in enumerate(inputs)]
    return Workload(sent, oname, vin, f"data:{path.name}, {len(out)} sequences", out[0][:1], out)


def check(out: np.ndarray | None, expected: np.ndarray) -> bool:
    return out is not None and out.size == expected.size and bool((out.reshape(expected.shape) == expected).all())
