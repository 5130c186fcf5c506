"""What the parts of ``Server`` share: the repository view of a model, messages, helpers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import find_backend
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model import LoadedModel
from seqserve.engine.repository import available_versions

log = logging.getLogger("seqserve.server")


#: a default model file that names the backend of a model whose config names none
_BACKEND_BY_FILE = {"model.onnx": "onnxruntime"}


#: Triton's message (UNAVAILABLE) for a request to a model whose scheduler has stopped: during
#: the shutdown drain, for requests the models refuse and for models already retired
SERVER_STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"


#: Triton's answer (UNAVAILABLE) to the health checks once the server is exiting
SERVER_EXITING = "Server exiting"


#: how long executors get to finish the batch they run when a model is closed after its
#: drain used up the whole exit timeout
MIN_CLOSE_WAIT_S = 0.5


def _autocomplete(cfg: mc.ModelConfig, path: Path) -> None:
    """Let the model's backend complete its config (Triton's auto-complete): a config that
    names no backend gets one from a known model file in a version folder."""
    if not cfg.backend and not cfg.platform:
        for version in reversed(available_versions(path)):
            found = [b for f, b in _BACKEND_BY_FILE.items() if (path / str(version) / f).exists()]
            if found:
                cfg.backend = found[0]
                break
    try:
        backend = find_backend(cfg)
    except InferenceError:
        return  # no (usable) backend: LoadedModel reports it, after the config's own checks
    backend.autocomplete_config(cfg, path)


#: Triton's index reason for a model name found in two or more repositories
MODEL_DUPLICATE_REASON = "model appears in two or more repositories"


@dataclass(slots=True)
class ModelState:
    """Repository view of one model: its loaded versions, or why it failed to load."""

    name: str
    path: Path
    versions: dict[int, LoadedModel]
    state: str  # READY, UNAVAILABLE, UNLOADING
    reason: str = ""


def _check_model_name(name: str) -> None:
    """Triton's model name checks (core ``ValidateModelName``), and no NUL or backslash: the
    name is a folder of the repository."""
    if not name.strip():
        raise InferenceError(Code.INVALID_ARG, "Model name cannot be empty. Please enter a valid name to deploy.")
    if name.strip() in (".", "..") or any(c in name for c in "/\\\x00"):
        raise InferenceError(
            Code.INVALID_ARG,
            f"invalid model name '{name}', model name must not contain path traversal characters",
        )


async def _shielded(coro: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coro`` as a task that a cancelled caller does not cancel: a load half done
    would leave a model running that nobody retires."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(_retrieve)
    return await asyncio.shield(task)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # the caller may be gone: no "exception was never retrieved"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _version_str(version: str | int | None) -> str:
    return "" if version in ("", None, -1, "-1") else str(version)
