"""A model version's backend and its instances, started from the config: in this process,
or each in a child process (``isolation``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation import IsolatedBackend
from seqserve.engine.model.execution import ExecutionSettings

log = logging.getLogger("seqserve.model")


@dataclass(slots=True, frozen=True)
class StartedInstances:
    backend: Backend
    instances: list[BackendInstance]  # by instance index
    names: list[str]  # instance index -> its name


def start_instances(
    cfg: mc.ModelConfig, *, version: int, model_dir: Path, backend: type[Backend], execution: ExecutionSettings
) -> StartedInstances:
    """The backend (wrapped for process isolation when ``execution`` says so) and one
    instance per instance_group count, ready (isolated children load in parallel)."""
    ctx = ModelContext(
        name=cfg.name,
        version=version,
        config=cfg,
        model_dir=model_dir,
        version_dir=model_dir / str(version),
        parameters={k: v.string_value for k, v in cfg.parameters.items()},
    )
    started: Backend = (
        IsolatedBackend(ctx, backend, execute_timeout_s=execution.execute_timeout_s)
        if execution.process
        else backend(ctx)
    )
    instances, names = _create_instances(cfg, ctx, started)
    if isinstance(started, IsolatedBackend):
        started.wait_ready()  # the children load the model in parallel
    return StartedInstances(started, instances, names)


def _create_instances(
    cfg: mc.ModelConfig, ctx: ModelContext, backend: Backend
) -> tuple[list[BackendInstance], list[str]]:
    """One backend instance per (non-passive) instance_group count, and their names; no GPUs
    here yet."""
    instances: list[BackendInstance] = []
    names: list[str] = []
    warned_gpu = False
    for group in cfg.instance_group:
        if group.passive:
            continue
        kind = group.kind
        if kind == mc.ModelInstanceGroup.KIND_GPU and not warned_gpu:
            log.warning(
                "model '%s': instance group '%s' asks for KIND_GPU but no GPU is available; running on CPU",
                cfg.name,
                group.name,
            )
            warned_gpu = True
        elif kind == mc.ModelInstanceGroup.KIND_CPU and group.gpus:
            log.warning(
                "model '%s': instance group '%s' is KIND_CPU; its 'gpus' %s are ignored",
                cfg.name,
                group.name,
                list(group.gpus),
            )
        device = "model" if kind == mc.ModelInstanceGroup.KIND_MODEL else "cpu"
        for j in range(max(1, group.count)):
            iname = f"{group.name}_{j}"
            names.append(iname)
            ictx = InstanceContext(ctx, len(instances), iname, device)
            instances.append(backend.create_instance(ictx))
    if not instances:
        raise InferenceError(Code.INVALID_ARG, f"model '{cfg.name}' has no (non-passive) instances")
    return instances, names
