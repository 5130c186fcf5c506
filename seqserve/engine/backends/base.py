"""The interface every backend implements.

A backend is created once per loaded model version and creates one instance per model
instance (instance_group). The engine calls ``execute`` from that instance's executor thread,
one call per batch, never concurrently for the same instance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.batch import ExecuteBatch


@dataclass(slots=True)
class ModelContext:
    """What a backend knows about the model it serves."""

    name: str
    version: int
    config: mc.ModelConfig
    model_dir: Path
    version_dir: Path
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class InstanceContext:
    model: ModelContext
    index: int
    name: str
    device: str  # "cpu", or "cuda:N"


class BackendInstance(ABC):
    @abstractmethod
    def execute(self, batch: ExecuteBatch) -> Mapping[str, np.ndarray]:
        """Run one batch; return every output and every output state, batched [B, ...]."""

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds; called once at unload."""


class Backend(ABC):
    #: the config `backend` names and `platform` names this backend serves
    names: ClassVar[tuple[str, ...]] = ()
    platforms: ClassVar[tuple[str, ...]] = ()
    supports_implicit_state: ClassVar[bool] = False

    def __init__(self, ctx: ModelContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def create_instance(self, ictx: InstanceContext) -> BackendInstance: ...

    def describe(self) -> dict[str, Any]:
        return {"backend": self.names[0] if self.names else type(self).__name__}
