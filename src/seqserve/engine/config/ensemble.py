"""Ensemble configs (``platform: "ensemble"``), checked in Triton's two stages and with its
messages: the config alone (``validate_ensemble_scheduling``: steps, tensor maps, the data
flow from the ensemble's inputs to its outputs), then against the configs of the loaded step
models (``validate_ensemble_steps``: inputs and outputs of each step, datatypes and shapes
that agree, batch sizes, decoupled steps)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from seqserve._proto.model_config_pb2 import DataType, ModelConfig, ModelEnsembling
from seqserve.engine.errors import ModelConfigError

#: the platform name of an ensemble
ENSEMBLE_PLATFORM = "ensemble"


def is_ensemble(cfg: ModelConfig) -> bool:
    return cfg.platform == ENSEMBLE_PLATFORM or cfg.HasField("ensemble_scheduling")


def step_model_names(cfg: ModelConfig) -> list[str]:
    """The models an ensemble's steps name, each once, in step order."""
    return list(dict.fromkeys(s.model_name for s in cfg.ensemble_scheduling.step if s.model_name))


# --------------------------------------------------------------------- the config alone


@dataclass(eq=False)
class _Node:
    """One ensemble tensor of the data-flow graph."""

    name: str
    is_output: bool  # written by a step
    ready: bool = False
    prev: list[_Node] = field(default_factory=list)
    next: list[_Node] = field(default_factory=list)


def validate_ensemble_scheduling(cfg: ModelConfig) -> None:
    """Triton's checks of an ensemble config on its own (before any step model is known)."""
    m = cfg.name
    if cfg.platform != ENSEMBLE_PLATFORM:
        raise ModelConfigError(
            f"ensemble scheduling cannot be set for model '{m}' whose platform is not {ENSEMBLE_PLATFORM}"
        )
    if not cfg.HasField("ensemble_scheduling"):
        raise ModelConfigError(
            f"ensemble scheduling must be set for ensemble {m} whose platform is {ENSEMBLE_PLATFORM}"
        )
    if cfg.instance_group:
        raise ModelConfigError(f"instance group should not be specified for ensemble '{m}'")
    if cfg.HasField("optimization"):
        raise ModelConfigError(f"optimization should not be specified for ensemble '{m}'")
    if cfg.model_warmup:
        raise ModelConfigError(f"model_warmup can not be specified for ensemble '{m}'")
    if not cfg.ensemble_scheduling.step:
        raise ModelConfigError(f"must specify 'step' for ensemble '{m}'")
    tensors = _graph(cfg)
    queue: list[_Node] = []
    for t in cfg.input:
        node = tensors.get(t.name)
        if node is None:
            raise ModelConfigError(f"ensemble input '{t.name}' for ensemble {m}' is not used")
        node.ready = True
        queue.append(node)
    while queue:
        node = queue.pop(0)
        for nxt in node.next:
            if not nxt.ready and all(p.ready for p in nxt.prev):
                nxt.ready = True
                queue.append(nxt)
    outputs: set[str] = set()
    for out in cfg.output:
        node = tensors.get(out.name)
        if node is None:
            raise ModelConfigError(f"ensemble output '{out.name}' for ensemble {m}' is not used")
        if not node.ready:
            raise ModelConfigError(_not_written(out.name, m, node))
        outputs.add(out.name)
    for name, node in tensors.items():
        if name not in outputs and (not node.ready or not node.next):
            raise ModelConfigError(f"ensemble tensor '{name}' is unused in ensemble '{m}'")


def _graph(cfg: ModelConfig) -> dict[str, _Node]:
    m = cfg.name
    tensors: dict[str, _Node] = {}
    for index, step in enumerate(cfg.ensemble_scheduling.step):
        required = (("model_name", step.model_name), ("input_map", step.input_map), ("output_map", step.output_map))
        for what, present in required:
            if not present:
                raise ModelConfigError(f"must specify '{what}' in step {index} of ensemble '{m}'")
        written: list[_Node] = []
        for tensor in step.output_map.values():
            node = tensors.get(tensor)
            if node is None:
                node = tensors[tensor] = _Node(tensor, True)
            elif node.is_output:
                raise ModelConfigError(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{m}' step {index}"
                )
            else:
                node.is_output = True
            written.append(node)
        for tensor in step.input_map.values():
            node = tensors.get(tensor)
            if node is None:
                node = tensors[tensor] = _Node(tensor, False)
            for out in written:
                out.prev.append(node)
                node.next.append(out)
    return tensors


def _not_written(output: str, ensemble: str, node: _Node) -> str:
    msg = f"output '{output}' for ensemble '{ensemble}' is not written"
    last = node
    seen: set[str] = set()
    prev: list[_Node] | None = node.prev
    while prev:
        nodes, prev = prev, None
        for p in nodes:
            if not p.ready and p.name not in seen:
                seen.add(p.name)
                last = p
                prev = p.prev
                break
    if last is not node:
        msg += f": at least one of its depending tensors, '{last.name}', is not connected"
    return msg


# ------------------------------------------------------------- against the step models


@dataclass(eq=False)
class _Tensor:
    """What one model says an ensemble tensor is (Triton's TensorNode)."""

    model: str
    batching: bool
    dtype: int
    dims: tuple[int, ...]
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    sibling: _Sibling | None = None
    prev: list[_Tensor] = field(default_factory=list)
    next: list[_Tensor] = field(default_factory=list)

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims


@dataclass(eq=False)
class _Sibling:
    """The outputs of one step share their decoupled label."""

    visited: bool = False
    label: int = 0


def validate_ensemble_steps(cfg: ModelConfig, step_config: Callable[[ModelEnsembling.Step], ModelConfig]) -> bool:
    """Triton's checks of an ensemble against its loaded step models (``step_config`` gives
    each step's config). Returns whether the ensemble is decoupled: a decoupled step lies on
    the way from its inputs to its outputs."""
    m = cfg.name
    batching = cfg.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for t in cfg.input:
        dims = t.reshape.shape if t.HasField("reshape") else t.dims
        tensors[t.name] = _Tensor(m, batching, t.data_type, tuple(dims))
    sink = _Tensor(m, False, 0, ())
    for out in cfg.output:
        dims = out.reshape.shape if out.HasField("reshape") else out.dims
        node = tensors.setdefault(out.name, _Tensor(m, batching, out.data_type, tuple(dims)))
        sink.prev.append(node)
        node.next.append(sink)
    for step in cfg.ensemble_scheduling.step:
        sc = step_config(step)
        if sc.max_batch_size != 0 and sc.max_batch_size < cfg.max_batch_size:
            raise ModelConfigError(
                f"ensemble {m} allows maximum batch size {cfg.max_batch_size}, but it contains model "
                f"{step.model_name} which only allows maximum batch size to be {sc.max_batch_size}"
            )
        _map_step(m, step, sc, tensors)
    return _decoupled_labels(m, cfg, tensors)


def _map_step(ensemble: str, step: ModelEnsembling.Step, sc: ModelConfig, tensors: dict[str, _Tensor]) -> None:
    model = step.model_name
    batching = sc.max_batch_size > 0
    where = f"in ensemble {ensemble}"
    inputs = {t.name for t in sc.input}
    for key, tensor in step.input_map.items():
        if key not in inputs:
            raise ModelConfigError(
                f"{where}, ensemble tensor {tensor} is mapping to non-existing input {key} in model {model}"
            )
    for t in sc.input:
        mapped = [tensor for key, tensor in step.input_map.items() if key == t.name]
        if not mapped:
            if t.optional:
                continue
            raise ModelConfigError(f"{where}, input {t.name} in model {model} is not mapped to any ensemble tensors")
        if len(mapped) > 1:
            raise ModelConfigError(f"{where}, input {t.name} in model {model} is mapped to multiple ensemble tensors")
        _agree(tensors, mapped[0], _Tensor(model, batching, t.data_type, tuple(t.dims)), where)
    outputs = {t.name for t in sc.output}
    for key, tensor in step.output_map.items():
        if key not in outputs:
            raise ModelConfigError(
                f"{where}, ensemble tensor {tensor} is mapped from non-existing output {key} in model {model}"
            )
    sibling = _Sibling()
    for key, tensor in step.output_map.items():
        out = next(o for o in sc.output if o.name == key)
        _agree(tensors, tensor, _Tensor(model, batching, out.data_type, tuple(out.dims)), where).sibling = sibling
    decoupled = sc.model_transaction_policy.decoupled
    for tensor in step.output_map.values():
        node = tensors[tensor]
        node.decoupled = decoupled
        for source in step.input_map.values():
            prev = tensors[source]
            node.prev.append(prev)
            prev.next.append(node)


def _agree(tensors: dict[str, _Tensor], name: str, found: _Tensor, where: str) -> _Tensor:
    """The tensor ``name`` as known so far, checked against what another model says of it."""
    known = tensors.get(name)
    if known is None:
        tensors[name] = found
        return found
    prefix = f"{where}, ensemble tensor {name}: "
    if known.dtype != found.dtype:
        raise ModelConfigError(
            f"{prefix}inconsistent data type: {DataType.Name(known.dtype)} is inferred from model {known.model} "  # type: ignore[arg-type]
            f"while {DataType.Name(found.dtype)} is inferred from model {found.model}"  # type: ignore[arg-type]
        )
    if not _dims_agree(known.dims, found.dims) and not _dims_agree(known.full_dims, found.full_dims):
        raise ModelConfigError(
            f"{prefix}inconsistent shape: {_dims_str(known.full_dims)} is inferred from model {known.model} "
            f"while {_dims_str(found.full_dims)} is inferred from model {found.model}"
        )
    return known


def _dims_agree(a: Iterable[int], b: Iterable[int]) -> bool:
    la, lb = list(a), list(b)
    return len(la) == len(lb) and all(x == y or x == -1 or y == -1 for x, y in zip(la, lb, strict=True))


def _dims_str(dims: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _decoupled_labels(ensemble: str, cfg: ModelConfig, tensors: dict[str, _Tensor]) -> bool:
    """Walk the data flow from the inputs; every step's inputs must come from the same
    decoupled step (or none). True when a decoupled step was met."""
    label = 0
    queue = [tensors[t.name] for t in cfg.input]
    for node in queue:
        node.visited = True
    while queue:
        node = queue.pop(0)
        for nxt in node.next:
            if nxt.visited or not all(p.visited for p in nxt.prev) or not nxt.prev:
                continue
            first = nxt.prev[0].label
            if any(p.label != first for p in nxt.prev):
                raise ModelConfigError(
                    f"in ensemble {ensemble}, step of model '{nxt.model}' receives inputs originated from "
                    "different decoupled models"
                )
            sibling = nxt.sibling
            if sibling is not None and sibling.visited:
                nxt.label = sibling.label
            else:
                if nxt.decoupled:
                    label += 1
                    nxt.label = label
                else:
                    nxt.label = first
                if sibling is not None:
                    sibling.label = nxt.label
                    sibling.visited = True
            nxt.visited = True
            queue.append(nxt)
    return label != 0
