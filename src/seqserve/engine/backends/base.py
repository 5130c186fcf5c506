"""The interface every backend implements.

A backend is created once per loaded model version and creates one instance per model
instance (instance_group). The engine calls ``execute`` from that instance's executor thread,
one call per batch, never concurrently for the same instance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.bls import ModelCaller, ModelCalls
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.responses import InferResult


@dataclass(slots=True)
class ModelContext:
    """What a backend knows about the model it serves."""

    name: str
    version: int
    config: mc.ModelConfig
    model_dir: Path
    version_dir: Path
    parameters: dict[str, str] = field(default_factory=dict)
    #: the server's calls between models (BLS); None where there is none (an isolated child)
    calls: ModelCalls | None = None

    def caller(self) -> ModelCaller:
        """This model version's calls to other models (engine/backends/bls.py)."""
        if self.calls is None:
            raise InferenceError(
                Code.UNSUPPORTED, f"model '{self.name}' cannot call other models here (process-isolated models cannot)"
            )
        return self.calls.caller(self.name, self.version)


@dataclass(slots=True)
class InstanceContext:
    model: ModelContext
    index: int
    name: str
    device: str  # "cpu", "model", or "cuda:N"
    #: the CUDA stream (cudaStream_t, as an int) a GPU instance runs on: the engine issues the
    #: state copies of its batches on it, so a model that runs on it needs no synchronization
    #: with them. 0 off the GPU.
    cuda_stream: int = 0

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], **options: Any) -> InferResult:
        """Call another model from ``execute`` and wait for its result (BLS; docs/pipelines.md):
        ``version``, ``sequence_id``, ``sequence_start``, ``sequence_end``, ``outputs``,
        ``request_id``, ``parameters``, ``timeout_s``. Raises InferenceError on its error."""
        return self.model.caller().infer(model, inputs, **options)

    def stream(self, model: str, inputs: Mapping[str, np.ndarray], **options: Any) -> Iterator[InferResult]:
        """Call a model (a decoupled one, typically) and iterate over its responses."""
        return self.model.caller().stream(model, inputs, **options)


#: Triton's default for --backend-config=default-max-batch-size
DEFAULT_MAX_BATCH_SIZE = 4


class RequestResults(dict[str, np.ndarray]):
    """A batch's results given request by request, for request-level APIs (Triton-style
    Python models), which answer each request on its own and may fail one alone.

    ``execute`` may return one instead of a plain mapping. As a mapping it still holds the
    batched arrays, in practice the output states ([B, ...], taken as from a plain result).
    ``outcomes`` has one entry per request of the batch, aligned with ``batch.request_rows``:
    either a dict of that request's outputs, shaped as its reply (no batch slicing; the
    dtype must match the config; a requested output that is absent is left out of the
    reply, as Triton does), an ``InferenceError`` that fails that request only, or
    ``DEFERRED`` when the request is answered through its responder (instances with
    ``uses_responders``). Entries of rows that get no reply (padding, final END steps) are
    ignored.
    """

    __slots__ = ("outcomes",)

    def __init__(
        self,
        outcomes: list[Mapping[str, np.ndarray] | InferenceError | None],
        batched: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        super().__init__(batched or {})
        self.outcomes = outcomes


class BackendInstance(ABC):
    #: true when ``execute`` may answer requests through ``batch.responder`` (late, or
    #: several times for decoupled models); the engine then provides one per batch
    uses_responders: ClassVar[bool] = False

    @abstractmethod
    def execute(self, batch: ExecuteBatch) -> Mapping[str, np.ndarray]:
        """Run one batch; return every output and every output state, batched [B, ...].

        Raising fails every request of the batch. To answer request by request (and fail
        requests one by one) return a ``RequestResults``.
        """

    def finalize(self) -> None:  # noqa: B027 - optional hook
        """Release what the instance holds; called once at unload."""


class Backend(ABC):
    #: the config `backend` names and `platform` names this backend serves
    names: ClassVar[tuple[str, ...]] = ()
    platforms: ClassVar[tuple[str, ...]] = ()
    supports_implicit_state: ClassVar[bool] = False
    #: its instances answer decoupled models' requests through responders (``uses_responders``)
    supports_decoupled: ClassVar[bool] = False
    #: its instances handle ragged inputs (``allow_ragged_batch``): 1-D, every request's
    #: elements end to end, with ``batch.ragged`` giving each request's extent
    supports_ragged_batch: ClassVar[bool] = False

    def __init__(self, ctx: ModelContext) -> None:
        self.ctx = ctx

    def gpu_unsupported_reason(self) -> str:
        """Why this backend's instances cannot run on a GPU ("" when they can); named in the load
        error of a KIND_GPU group."""
        return f"the '{self.names[0] if self.names else type(self).__name__}' backend does not run on a GPU"

    @classmethod  # noqa: B027 - optional hook
    def autocomplete_config(
        cls, cfg: mc.ModelConfig, model_dir: Path, *, default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    ) -> None:
        """Complete ``cfg`` in place from the model files (e.g. inputs and outputs read from
        the graph) before defaults are applied and the config is validated. Called for every
        load of a model this backend serves; the default does nothing. A model that can batch
        and sets no max_batch_size gets ``default_max_batch_size`` (Triton's
        --backend-config=default-max-batch-size)."""

    @classmethod
    def check(cls, cfg: mc.ModelConfig) -> None:
        """Refuse (INVALID_ARG) a config that asks for what this backend cannot do: implicit
        state, ragged batching, decoupled responses."""
        backend = cfg.backend or cfg.platform
        if cfg.sequence_batching.state and not cls.supports_implicit_state:
            raise InferenceError(Code.INVALID_ARG, f"backend '{backend}' does not support implicit state")
        ragged = ragged_inputs(cfg)
        if ragged and not cls.supports_ragged_batch:
            raise InferenceError(
                Code.INVALID_ARG,
                f"model '{cfg.name}': input '{ragged[0]}' has allow_ragged_batch, which backend "
                f"'{backend}' does not support (it would need Triton's batch_input "
                "tensors to find each request's extent); the python backend supports it",
            )
        if cfg.model_transaction_policy.decoupled and not cls.supports_decoupled:
            raise InferenceError(
                Code.INVALID_ARG,
                f"backend '{backend}' does not support decoupled models "
                "(model_transaction_policy { decoupled: true }); the python backend does",
            )

    @abstractmethod
    def create_instance(self, ictx: InstanceContext) -> BackendInstance: ...

    def describe(self) -> dict[str, Any]:
        return {"backend": self.names[0] if self.names else type(self).__name__}


def ragged_inputs(cfg: mc.ModelConfig) -> list[str]:
    """The inputs batched ragged (``allow_ragged_batch`` on a batched model)."""
    return [t.name for t in cfg.input if t.allow_ragged_batch] if cfg.max_batch_size > 0 else []
