"""What a worker knows of the engine without asking it: pushed by the engine process whenever
it changes (a model loaded or unloaded, readiness, the drain), so that the front-ends' sync
questions (is it exiting? is this model decoupled?) never wait on another process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqserve.engine import Server
from seqserve.engine.workers.records import BY_NAME


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One loaded model version, as a worker routes requests to it."""

    target: int  # the engine's number for it (never reused while the engine lives)
    decoupled: bool
    is_sequence: bool
    config: Any  # its ModelConfig (read-only here: validation, classification)
    model_dir: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    exiting: bool = False
    ready: bool = False
    tracing: bool = False
    #: model name -> version -> entry
    models: dict[str, dict[int, ModelEntry]] = field(default_factory=dict)


class Targets:
    """The engine's numbering of the model versions it serves through the rings."""

    def __init__(self) -> None:
        self._next = BY_NAME + 1
        self._of: dict[Any, int] = {}  # LoadedModel -> target

    def snapshot(self, server: Server) -> Snapshot:
        models: dict[str, dict[int, ModelEntry]] = {}
        live = {}
        for m in server.models.loaded():
            target = self._of.get(m)
            if target is None:
                target = self._of[m] = self._next
                self._next += 1
            live[m] = target
            models.setdefault(m.name, {})[int(m.version)] = ModelEntry(
                target, m.decoupled, m.is_sequence, m.config, str(m.model_dir)
            )
        self._of = live
        return Snapshot(server.exiting, server.is_ready(), server.tracer is not None, models)
