"""Model control: who may change the set of loaded models, as Triton's ``--model-control-mode``.

* ``none`` (the default): every model of the repository loads at startup; nothing changes
  afterwards. The model control API (load / unload over HTTP and gRPC) is refused.
* ``explicit``: only the models named at startup load (``--load-model``, ``*`` for all); the
  model control API loads and unloads models, ``file:`` uploads included.
* ``poll``: every model loads at startup, then the repository is scanned every
  ``repository_poll_secs``: new model folders load, removed ones unload, changed ones reload.
  The model control API is refused.

The policy applies to the model control API, which is what the network front-ends call
(``Server.request_load_model`` / ``request_unload_model``). An application that embeds
``seqserve.engine.Server`` owns its process and keeps ``Server.load_model`` /
``unload_model`` whatever the mode.

This module also scans the repository for poll mode: a model folder's fingerprint is the
list of its files with their sizes and modification times, so editing ``config.pbtxt``,
a model file or an initial state file, or adding or removing a version folder, reloads it.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from seqserve.engine.errors import Code, InferenceError

__all__ = [
    "DEFAULT_REPOSITORY_POLL_SECS",
    "MODEL_CONTROL_DISABLED",
    "SERVER_NOT_READY",
    "WILDCARD_MODEL",
    "Fingerprint",
    "ModelControlMode",
    "model_control_refused",
    "model_fingerprint",
    "startup_models",
]

#: Triton's message when a load or unload request comes and the mode is not explicit (it is
#: the same for ``none`` and ``poll``: Triton checks ``model_control_enabled_``), status
#: UNAVAILABLE: HTTP 503, gRPC UNAVAILABLE. From triton-inference-server/core,
#: src/model_repository_manager/model_repository_manager.cc, ``LoadUnloadModel``.
MODEL_CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"

#: Triton's message (UNAVAILABLE) for load / unload while the server is not ready
#: (core src/server.cc, ``InferenceServer::LoadModel`` / ``UnloadModel``).
SERVER_NOT_READY = "Server not ready"

#: ``--load-model=*`` loads every model of the repository at startup
WILDCARD_MODEL = "*"

#: Triton's default for ``--repository-poll-secs``
DEFAULT_REPOSITORY_POLL_SECS = 15.0

#: a folder holding more entries than this is not scanned further (its fingerprint then
#: covers the first ones only); a bound on the work one poll does
MAX_SCANNED_ENTRIES = 100_000


class ModelControlMode(str, enum.Enum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"

    @classmethod
    def parse(cls, value: str | ModelControlMode) -> ModelControlMode:
        """``"explicit"``, ``"EXPLICIT"``... (Triton accepts any case)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(f"invalid model control mode '{value}': expected one of none, poll, explicit") from None


def model_control_refused() -> InferenceError:
    """The error a load or unload request gets when model control is not explicit."""
    return InferenceError(Code.UNAVAILABLE, MODEL_CONTROL_DISABLED)


def startup_models(mode: ModelControlMode, load_models: Sequence[str]) -> list[str] | None:
    """The models to load at startup: None for every model of the repository.

    ``none`` and ``poll`` load every model and take no ``load_models`` (Triton: "Use of
    '--load-model' requires setting '--model-control-mode=explicit' as well."). ``explicit``
    loads ``load_models``, none when it is empty, and every model for ``["*"]`` alone.
    Raises ValueError with Triton's message for the wrong combinations."""
    names = list(load_models)
    if mode is not ModelControlMode.EXPLICIT:
        if names:
            raise ValueError("Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
        return None
    if WILDCARD_MODEL in names:
        if len(names) > 1:
            raise ValueError("Wildcard model name '*' must be the ONLY startup model if specified at all.")
        return None
    return list(dict.fromkeys(names))  # in order, once each


# ------------------------------------------------------------------------------- poll

#: (path relative to the model folder, kind, size, mtime_ns) of every entry, sorted
Fingerprint = tuple[tuple[str, str, int, int], ...]


def _skipped(name: str) -> bool:
    # Hidden entries (editors' swap files, .git) and the bytecode caches Python writes next
    # to a model.py when it imports it (which would otherwise reload every python model once).
    return name.startswith(".") or name == "__pycache__"


def model_fingerprint(model_dir: Path) -> Fingerprint:
    """What poll mode compares to tell that a model changed. Follows symlinks (a version
    folder linked from a model store counts by its contents), each directory once. Runs
    blocking file system calls: call it off the event loop."""
    entries: list[tuple[str, str, int, int]] = []
    seen: set[tuple[int, int]] = set()
    root = Path(model_dir)
    pending: list[tuple[Path, str]] = [(root, "")]
    while pending and len(entries) < MAX_SCANNED_ENTRIES:
        folder, prefix = pending.pop()
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            names = sorted(os.listdir(folder))
        except OSError:
            continue  # removed while scanning: the next poll sees the new state
        for name in names:
            if _skipped(name):
                continue
            path = folder / name
            rel = prefix + name
            try:
                st = path.stat()
            except OSError:
                entries.append((rel, "broken", 0, 0))
                continue
            if stat.S_ISDIR(st.st_mode):
                entries.append((rel, "dir", 0, 0))
                pending.append((path, rel + "/"))
            else:
                entries.append((rel, "file", st.st_size, st.st_mtime_ns))
    return tuple(sorted(entries))


def repository_fingerprints(model_dirs: Iterable[Path]) -> dict[str, Fingerprint]:
    """Fingerprint of each model folder, by model name (blocking: off the event loop)."""
    return {d.name: model_fingerprint(d) for d in model_dirs}
