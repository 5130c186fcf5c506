"""What a worker knows of the engine without asking it: pushed by the engine process whenever
it changes (a model loaded or unloaded, readiness, the drain), so that the front-ends' sync
questions (is it exiting? is this model decoupled?) never wait on another process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from seqserve.api.logs import log_control
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.engine import InferenceError, Server
from seqserve.engine.workers import BY_NAME, LoadedModel, RingFeeder


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One loaded model version, as a worker routes requests to it."""

    target: int  # the engine's number for it (never reused while the engine lives)
    decoupled: bool
    is_sequence: bool
    config: Any  # its ModelConfig (read-only here: validation, classification)
    model_dir: str
    #: on the engine's compiled path: the worker validates its plain requests and sends them
    #: without the meta block (api/workers/fast_requests.py)
    fast: bool = False
    #: its metadata (names, datatypes, shapes): the generate routes decode requests with it
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Snapshot:
    exiting: bool = False
    ready: bool = False
    tracing: bool = False
    #: model name -> version -> entry
    models: dict[str, dict[int, ModelEntry]] = field(default_factory=dict)
    #: the log settings the logging extension may change (Triton's names)
    log: dict[str, Any] = field(default_factory=dict)
    #: the system shared-memory regions registered with the engine: (name, key, offset, byte_size)
    regions: tuple[tuple[str, str, int, int], ...] = ()


class Targets:
    """The engine's numbering of the model versions it serves through the rings, and their
    registration with the feeder: on its compiled path when ``fast()`` says the server needs no
    Python per request (no tracing, state store or replicas) and the model agrees
    (``LoadedModel.serve_rings``), else the slow way. A model that closes takes its target off
    the compiled path itself; a target gone from the snapshot is removed here too."""

    def __init__(self, feeder: RingFeeder | None = None, fast: Callable[[], bool] = lambda: False) -> None:
        self._next = BY_NAME + 1
        self._of: dict[Any, tuple[int, bool, dict[str, Any]]] = {}  # model -> (target, fast, metadata)
        self._feeder = feeder
        self._fast = fast

    def _register(self, m: Any, target: int) -> bool:
        feeder = self._feeder
        if feeder is None:
            return False
        if isinstance(m, LoadedModel):
            return m.serve_rings(feeder, target, fast=self._fast())
        feeder.add_target(target, None, fast=False)  # an ensemble, say: Python runs it
        return False

    def snapshot(self, server: Server, shared_memory: SharedMemoryRegistry | None = None) -> Snapshot:
        models: dict[str, dict[int, ModelEntry]] = {}
        live = {}
        for m in server.models.loaded_by_name():  # ensembles too (their requests run in Python)
            known = self._of.get(m)
            if known is None:
                target = self._next
                self._next += 1
                known = (target, self._register(m, target), m.metadata())
            live[m] = known
            target, fast, metadata = known
            models.setdefault(m.name, {})[int(m.version)] = ModelEntry(
                target, m.decoupled, m.is_sequence, m.config, str(m.model_dir), fast, metadata
            )
        if self._feeder is not None:
            for m, (target, _, _) in self._of.items():
                if m not in live:
                    self._feeder.remove_target(target)
        self._of = live
        log = {k: v for k, v in log_control.settings.as_triton().items() if k != "log_file"}
        regions: tuple[tuple[str, str, int, int], ...] = ()
        if shared_memory is not None and len(shared_memory):
            regions = tuple((r["name"], r["key"], r["offset"], r["byte_size"]) for r in shared_memory.status())
        return Snapshot(server.exiting, server.is_ready(), server.tracer is not None, models, log, regions)


def mirror_regions(registry: SharedMemoryRegistry, regions: tuple[tuple[str, str, int, int], ...]) -> None:
    """A worker's registry made to hold the engine's system regions (a stream's request that
    names one is decoded in the worker)."""
    want = {r[0]: r for r in regions}
    have = {s["name"]: (s["name"], s["key"], s["offset"], s["byte_size"]) for s in registry.status()}
    for name, region in have.items():
        if want.get(name) != region:
            registry.unregister(name)
    for name, region in want.items():
        if have.get(name) != region:
            with contextlib.suppress(InferenceError):  # its client removed it meanwhile
                registry.register(*region)


@dataclass(frozen=True, slots=True)
class FrontEndCounts:
    """What a worker's front-ends counted (sent to the engine, which serves /metrics)."""

    connections: dict[str, tuple[int, dict[str, int]]]  # protocol -> (open now, refused by reason)
    streams: tuple[int, int] | None  # gRPC streams: (refused at once, reading paused)
    ring_full: tuple[int, float] = (0, 0.0)  # reading paused for a full request ring: (times, seconds)
