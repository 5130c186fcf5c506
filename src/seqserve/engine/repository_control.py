"""Loading, unloading and polling the model repository, and the model-control policy
that the network front-ends go through."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model_control import (
    SERVER_NOT_READY,
    Fingerprint,
    ModelControlMode,
    model_control_refused,
    model_fingerprint,
    repository_fingerprints,
)
from seqserve.engine.server_state import (
    MODEL_DUPLICATE_REASON,
    ModelState,
    _shielded,
    log,
)
from seqserve.engine.uploads import UploadDirs


class RepositoryControl:
    """Part of ``Server``; see ``seqserve.engine.server``."""

    # Server's state and methods that this part uses (for type checkers; set in Server.__init__)
    if TYPE_CHECKING:
        _control_lock: asyncio.Lock
        _models: dict[str, ModelState]
        _uploads: UploadDirs
        _exiting: bool
        _fingerprints: dict[str, Fingerprint]
        _loop: asyncio.AbstractEventLoop | None
        model_control: ModelControlMode
        repository: Path
        repository_poll_secs: float

        def _discover(self) -> list[Path]: ...

        def _model_dirs(self, name: str) -> list[Path]: ...

        def _load_sync(
            self, name: str, loop: asyncio.AbstractEventLoop, path: Path, config_json: str | None
        ) -> ModelState: ...

        async def load_model(
            self, name: str, *, config_json: str | None = None, files: dict[str, bytes] | None = None
        ) -> None: ...

        async def unload_model(self, name: str) -> None: ...

        async def _retire(
            self, state: ModelState, timeout_s: float | None = None, *, deadline: float | None = None
        ) -> bool: ...

    def check_model_control(self) -> None:
        """Raise Triton's UNAVAILABLE error unless a load / unload request may proceed now:
        the server is up and ``model_control`` is explicit. The front-ends call it before
        they decode a load request's parameters."""
        if self._exiting:
            raise InferenceError(Code.UNAVAILABLE, SERVER_NOT_READY)
        if self.model_control is not ModelControlMode.EXPLICIT:
            raise model_control_refused()

    async def request_load_model(
        self, name: str, *, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """A load asked for through the model control API (HTTP ``.../load``, gRPC
        ``RepositoryModelLoad``): refused with Triton's UNAVAILABLE error unless
        ``model_control`` is explicit, then as ``load_model``."""
        self.check_model_control()
        await self.load_model(name, config_json=config_json, files=files)

    async def request_unload_model(self, name: str) -> None:
        """An unload asked for through the model control API; see ``request_load_model``."""
        self.check_model_control()
        await self.unload_model(name)

    async def _locked(self, op: Coroutine[Any, Any, Any]) -> Any:
        """Run one change of the model set with the control lock held."""
        try:
            async with self._control_lock:
                if self._exiting:
                    raise InferenceError(Code.UNAVAILABLE, SERVER_NOT_READY)
                return await op
        finally:
            op.close()  # never awaited when refused: no "coroutine was never awaited" warning

    async def _load(
        self, name: str, config_json: str | None, files: dict[str, bytes] | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        found = self._model_dirs(name)
        in_repository = bool(found)
        if len(found) > 1:  # as Triton: a name in two repositories loads from neither
            log.error("failed to poll model '%s': not unique across all model repositories", name)
            if name not in self._models or not self._models[name].versions:
                self._models[name] = ModelState(name, found[0], {}, "UNAVAILABLE", MODEL_DUPLICATE_REASON)
            raise InferenceError(
                Code.INVALID_ARG,
                f"failed to poll model '{name}': not unique across all model repositories "
                f"({', '.join(str(p) for p in found)})",
            )
        path = found[0] if found else self.repository / name
        if files:
            path = await asyncio.to_thread(self._uploads.create, name, files)
        old = self._models.get(name)
        state = await asyncio.to_thread(self._load_sync, name, loop, path, config_json)
        if state.state != "READY":
            self._uploads.remove(path)
            # A failed reload keeps the previous versions serving (as Triton does); a name that
            # is not in the repository leaves no trace.
            if old is not None and old.versions:
                old.reason = state.reason
            elif in_repository or old is not None:
                self._models[name] = state
            raise InferenceError(Code.INVALID_ARG, f"load failed for model '{name}': {state.reason}")
        self._models[name] = state
        if old is not None:
            await self._retire(old)
            if old.path != state.path:
                self._uploads.remove(old.path)

    async def _unload(self, name: str, *, forget: bool = False) -> None:
        state = self._models.get(name)
        if state is None:
            raise InferenceError(Code.INVALID_ARG, f"failed to unload '{name}', model is not loaded")
        state.state = "UNLOADING"
        await self._retire(state)
        state.versions = {}
        state.state = "UNAVAILABLE"
        state.reason = "unloaded"
        self._uploads.remove(state.path)
        if forget and self._models.get(name) is state:
            del self._models[name]
        log.info("unloaded model '%s'", name)

    async def poll_repository(self) -> dict[str, list[str]]:
        """Scan the repository once and apply what changed since the last scan: a new model
        folder loads, a removed one unloads (and leaves the index), a changed one reloads (a
        failed reload keeps the loaded versions serving). A model that failed to load is
        tried again once its folder changes. The scan runs on a worker thread.
        Returns the names of the models {"added": [...], "removed": [...], "modified": [...]}."""
        self._loop = self._loop or asyncio.get_running_loop()
        result: dict[str, list[str]] = await _shielded(self._locked(self._poll(self._loop)))
        return result

    async def _poll(self, loop: asyncio.AbstractEventLoop) -> dict[str, list[str]]:
        def scan() -> dict[str, Fingerprint]:
            dirs: dict[str, list[Path]] = {}
            for d in self._discover():
                dirs.setdefault(d.name, []).append(d)
            out = repository_fingerprints(found[0] for found in dirs.values() if len(found) == 1)
            # a name in two repositories: one fingerprint of all its folders, so that removing
            # one of them (or any change) loads it again; until then its load fails, as at startup
            for name, found in dirs.items():
                if len(found) > 1:
                    out[name] = tuple(e for d in found for e in model_fingerprint(d))
            return out

        current = await asyncio.to_thread(scan)
        known = self._fingerprints
        added = sorted(current.keys() - known.keys())
        removed = sorted(known.keys() - current.keys())
        modified = sorted(n for n in current.keys() & known.keys() if current[n] != known[n])
        for name in removed:
            del self._fingerprints[name]
            if name in self._models:
                log.info("model '%s' was removed from the repository: unloading", name)
                await self._unload(name, forget=True)
        for name in added + modified:
            self._fingerprints[name] = current[name]
            if name in modified:
                log.info("model '%s' changed in the repository: reloading", name)
            with contextlib.suppress(InferenceError):  # logged, and listed UNAVAILABLE with its reason
                await self._load(name, None, None, loop)
        return {"added": added, "removed": removed, "modified": modified}

    async def _poll_periodically(self) -> None:
        while not self._exiting:
            await asyncio.sleep(self.repository_poll_secs)
            try:
                await self.poll_repository()
            except InferenceError as e:
                if self._exiting:
                    return
                log.error("failed to poll model repository: %s", e)
            except Exception:
                log.exception("failed to poll model repository")
