"""An ensemble's steps as the runs read them: which ensemble tensors each step takes and
writes, which steps consume each tensor, and the checks of a request against the ensemble's
own inputs (Triton's messages; shapes are checked by the steps that take them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import InferRequest
from seqserve.engine.tensors import numpy_wire_name, to_numpy_dtype, wire_dtype_name


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model: str
    version: str  # "" for the highest loaded version (model_version -1)
    inputs: tuple[tuple[str, str], ...]  # (step model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (step model output, ensemble tensor)


class EnsemblePlan:
    """The compiled ``ensemble_scheduling`` of one ensemble config."""

    def __init__(self, cfg: mc.ModelConfig) -> None:
        self.name = cfg.name
        self.max_batch_size = cfg.max_batch_size
        self.max_inflight = cfg.ensemble_scheduling.max_inflight_requests
        self.steps = tuple(
            Step(
                index=i,
                model=s.model_name,
                version="" if s.model_version < 0 else str(s.model_version),
                inputs=tuple(sorted(s.input_map.items())),
                outputs=tuple(sorted(s.output_map.items())),
            )
            for i, s in enumerate(cfg.ensemble_scheduling.step)
        )
        consumers: dict[str, list[Step]] = {}
        for step in self.steps:
            for _, tensor in step.inputs:
                consumers.setdefault(tensor, []).append(step)
        self.consumers: Mapping[str, tuple[Step, ...]] = {k: tuple(v) for k, v in consumers.items()}
        self.outputs = tuple(t.name for t in cfg.output)
        self._inputs = {t.name: t for t in cfg.input}
        self._optional = frozenset(t.name for t in cfg.input if t.optional)

    def check(self, request: InferRequest) -> tuple[str, ...]:
        """Raise Triton's error for a request the ensemble refuses; returns the outputs it gets."""
        name = self.name
        for key, arr in request.inputs.items():
            spec = self._inputs.get(key)
            if spec is None:
                raise InferenceError(Code.INVALID_ARG, f"unexpected inference input '{key}' for model '{name}'")
            want = spec.data_type
            got = np.asarray(arr).dtype
            if want == mc.TYPE_STRING:
                ok = got.kind in "OSU"
            else:
                expected = to_numpy_dtype(want)
                ok = expected is None or got == np.dtype(expected)
            if not ok:
                raise _bad(
                    request,
                    f"inference input '{key}' data-type is '{numpy_wire_name(got)}', but model '{name}' expects "
                    f"'{wire_dtype_name(want)}'",
                )
            if self.max_batch_size > 0 and np.ndim(arr) > 0 and np.shape(arr)[0] > self.max_batch_size:
                raise _bad(request, f"inference request batch-size must be <= {self.max_batch_size} for '{name}'")
        missing = [n for n in self._inputs if n not in request.inputs and n not in self._optional]
        if missing:
            got_names = [n for n in request.inputs if n in self._inputs]
            raise _bad(
                request,
                f"expected {len(self._inputs)} inputs but got {len(got_names)} inputs for model '{name}'. "
                f"Got input(s) {_names(got_names)}, but missing required input(s) {_names(missing)}. "
                "Please provide all required input(s).",
            )
        for o in request.outputs:
            if o not in self.outputs:
                raise InferenceError(Code.INVALID_ARG, f"unexpected inference output '{o}' for model '{name}'")
        return request.outputs or self.outputs

    def rows(self, request: InferRequest) -> int:
        """The batch rows of a request (1 for an ensemble that does not batch)."""
        if self.max_batch_size <= 0:
            return 1
        for arr in request.inputs.values():
            shape: Any = np.shape(arr)
            if shape:
                return int(shape[0])
        return 1


def _bad(request: InferRequest, msg: str) -> InferenceError:
    return InferenceError(Code.INVALID_ARG, f"[request id: {request.id or '<id_unknown>'}] {msg}")


def _names(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"
