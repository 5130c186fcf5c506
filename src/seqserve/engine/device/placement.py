"""Where each instance of a model runs: ``instance_group`` kinds and ``gpus`` against the GPUs
this process can use, decided once at load.

- ``KIND_CPU``: the CPU (a ``gpus`` list is ignored, with a warning).
- ``KIND_GPU``: ``count`` instances on each GPU of ``gpus`` (all GPUs when empty), as Triton
  places them. Without a usable GPU, or with a backend that cannot run on one, the model does
  not load and the error says why; ``--kind-gpu-on-cpu`` (``Server(kind_gpu_on_cpu=True)``)
  runs such groups on the CPU instead, with one warning per model.
- ``KIND_AUTO``: as ``KIND_GPU`` when there is a GPU and the backend can use it, else the CPU.
- ``KIND_MODEL``: where the model itself decides (device ``model``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.device.probe import GpuProbe
from seqserve.engine.errors import Code, InferenceError

KIND_GPU = mc.ModelInstanceGroup.KIND_GPU
KIND_CPU = mc.ModelInstanceGroup.KIND_CPU
KIND_AUTO = mc.ModelInstanceGroup.KIND_AUTO
KIND_MODEL = mc.ModelInstanceGroup.KIND_MODEL


@dataclass(frozen=True, slots=True)
class InstancePlace:
    name: str  # the instance's name: <group>_<j>
    device: str  # "cpu", "model" or "cuda:N"

    @property
    def gpu(self) -> int | None:
        """The CUDA ordinal, or None off the GPU."""
        return int(self.device[5:]) if self.device.startswith("cuda:") else None


@dataclass(slots=True)
class Placement:
    instances: list[InstancePlace] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def place_instances(
    cfg: mc.ModelConfig, *, probe: GpuProbe, backend_gpu: str, kind_gpu_on_cpu: bool = False
) -> Placement:
    """Every non-passive instance's place. ``backend_gpu``: "" when the backend can run on a
    GPU, else why it cannot (named in the error)."""
    out = Placement()
    fell_back = False
    for group in cfg.instance_group:
        if group.passive:
            continue
        count = max(1, group.count)
        kind = group.kind
        if kind == KIND_AUTO:
            kind = KIND_GPU if probe.count and not backend_gpu else KIND_CPU
        if kind == KIND_GPU:
            why = backend_gpu or (f"this server has no usable GPU: {probe.reason}" if not probe.count else "")
            if why:
                if not kind_gpu_on_cpu:
                    raise InferenceError(
                        Code.INVALID_ARG,
                        f"model '{cfg.name}': instance group '{group.name}' is KIND_GPU, but {why}. Use kind: "
                        "KIND_CPU, or start seqserve with --kind-gpu-on-cpu to run KIND_GPU groups on the CPU",
                    )
                if not fell_back:
                    out.warnings.append(
                        f"model '{cfg.name}': instance group '{group.name}' is KIND_GPU, but {why}; "
                        "running it on the CPU (--kind-gpu-on-cpu)"
                    )
                    fell_back = True
                _add(out, group.name, ["cpu"] * count)
                continue
            gpus = list(group.gpus) or list(range(probe.count))
            for g in gpus:
                if not 0 <= g < probe.count:
                    raise InferenceError(
                        Code.INVALID_ARG,
                        f"model '{cfg.name}': instance group '{group.name}' asks for GPU {g}, but this server "
                        f"has {probe.count} (ordinals 0-{probe.count - 1})",
                    )
            _add(out, group.name, [f"cuda:{g}" for g in gpus for _ in range(count)])
            continue
        if kind == KIND_CPU and group.gpus:
            out.warnings.append(
                f"model '{cfg.name}': instance group '{group.name}' is KIND_CPU; its 'gpus' {list(group.gpus)} "
                "are ignored"
            )
        _add(out, group.name, ["model" if kind == KIND_MODEL else "cpu"] * count)
    if not out.instances:
        raise InferenceError(Code.INVALID_ARG, f"model '{cfg.name}' has no (non-passive) instances")
    return out


def _add(out: Placement, group: str, devices: list[str]) -> None:
    for j, device in enumerate(devices):
        out.instances.append(InstancePlace(f"{group}_{j}", device))
