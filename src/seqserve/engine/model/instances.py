"""A model version's backend and its instances, started from the config: in this process,
or each in a child process (``isolation``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.backends.bls import ModelCalls
from seqserve.engine.device.placement import place_instances
from seqserve.engine.device.probe import GpuProbe, probe_gpus
from seqserve.engine.isolation import IsolatedBackend
from seqserve.engine.model.devices import InstanceDevices
from seqserve.engine.model.execution import ExecutionSettings

log = logging.getLogger("seqserve.model")


@dataclass(slots=True, frozen=True)
class StartedInstances:
    backend: Backend
    instances: list[BackendInstance]  # by instance index
    names: list[str]  # instance index -> its name
    devices: InstanceDevices  # the GPU instances' streams (and, later, state tables)


def start_instances(
    cfg: mc.ModelConfig,
    *,
    version: int,
    model_dir: Path,
    backend: type[Backend],
    execution: ExecutionSettings,
    calls: ModelCalls | None = None,
) -> StartedInstances:
    """The backend (wrapped for process isolation when ``execution`` says so) and one
    instance per instance_group count, ready (isolated children load in parallel).
    ``calls``: the server's calls between models, for models that call others (BLS)."""
    ctx = ModelContext(
        name=cfg.name,
        version=version,
        config=cfg,
        model_dir=model_dir,
        version_dir=model_dir / str(version),
        parameters={k: v.string_value for k, v in cfg.parameters.items()},
        calls=calls,
    )
    started: Backend = (
        IsolatedBackend(ctx, backend, execute_timeout_s=execution.execute_timeout_s)
        if execution.process
        else backend(ctx)
    )
    instances, names, devices = _create_instances(cfg, ctx, started, execution)
    if isinstance(started, IsolatedBackend):
        started.wait_ready()  # the children load the model in parallel
    return StartedInstances(started, instances, names, devices)


def _create_instances(
    cfg: mc.ModelConfig, ctx: ModelContext, backend: Backend, execution: ExecutionSettings
) -> tuple[list[BackendInstance], list[str], InstanceDevices]:
    """One backend instance per placed instance (engine/device/placement.py), their names, and
    the CUDA streams of the GPU ones."""
    places = place_instances(
        cfg,
        probe=probe_gpus() if _wants_gpu(cfg) else GpuProbe(reason="not asked"),
        backend_gpu=backend.gpu_unsupported_reason(),
        kind_gpu_on_cpu=execution.kind_gpu_on_cpu,
    )
    for warning in places.warnings:
        log.warning("%s", warning)
    devices = InstanceDevices(places.instances)
    instances: list[BackendInstance] = []
    try:
        for i, place in enumerate(places.instances):
            ictx = InstanceContext(ctx, i, place.name, place.device, cuda_stream=devices.stream(i))
            instances.append(backend.create_instance(ictx))
    except Exception:
        devices.close()
        raise
    return instances, [p.name for p in places.instances], devices


def _wants_gpu(cfg: mc.ModelConfig) -> bool:
    """Whether placing this model needs to know the GPUs (probing imports cuda-python)."""
    kinds = (mc.ModelInstanceGroup.KIND_GPU, mc.ModelInstanceGroup.KIND_AUTO)
    return any(g.kind in kinds and not g.passive for g in cfg.instance_group)
