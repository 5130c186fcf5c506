"""The model table: the loaded model versions of one server and every change to them (load,
unload, repository poll, retirement), the model-control policy the network front-ends go
through, and the checkpoint and restore of live sequences (what a replica coordinator calls).

Nothing else changes the set of models: loads, unloads and polls run one at a time under the
table's control lock (Triton's poll_mu_), and the drain closes the table when the shutdown
begins (``close``), after which the set no longer changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqserve.engine.backends.base import DEFAULT_MAX_BATCH_SIZE
from seqserve.engine.backends.bls import ModelCalls
from seqserve.engine.config import finish_model_config, parse_config_json, parse_model_config, validate_paths
from seqserve.engine.config.ensemble import is_ensemble
from seqserve.engine.ensemble import EnsembleModel
from seqserve.engine.ensemble.loading import build_ensemble, circular_dependency, ensemble_step_names
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model import LoadedModel
from seqserve.engine.replicas.checkpoint import SequenceCheckpoint
from seqserve.engine.request import SequenceId
from seqserve.engine.server.model_control import (
    SERVER_NOT_READY,
    Fingerprint,
    ModelControlMode,
    model_control_refused,
    model_fingerprint,
    repository_fingerprints,
)
from seqserve.engine.server.repository import autocomplete_config, discover_models, select_versions
from seqserve.engine.server.uploads import UploadDirs
from seqserve.engine.sessions import SessionPolicy

log = logging.getLogger("seqserve.server")

#: what the table serves: a model version, or an ensemble version (engine/ensemble)
ServedModel = LoadedModel | EnsembleModel

#: Triton's message (UNAVAILABLE) for a request to a model whose scheduler has stopped: during
#: the shutdown drain, for requests the models refuse and for models already retired
SERVER_STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"

#: Triton's index reason for a model name found in two or more repositories
MODEL_DUPLICATE_REASON = "model appears in two or more repositories"

#: how long executors get to finish the batch they run when a model is closed after its
#: drain used up the whole exit timeout
MIN_CLOSE_WAIT_S = 0.5

#: a default model file that names the backend of a model whose config names none


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """What every model version of a table is loaded with (see ``Server``)."""

    sessions: SessionPolicy
    python_isolation: str
    max_backlog_sequences: int
    inline_max_batch_us: int
    config_name: str | None = None  # Triton's --model-config-name: configs/<name>.pbtxt
    auto_complete: bool = True  # backends complete configs (Triton's default)
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE  # for a completed config that can batch
    kind_gpu_on_cpu: bool = False
    calls: ModelCalls | None = None  # calls between models (BLS)


@dataclass(slots=True)
class ModelState:
    """Repository view of one model: its loaded versions, or why it failed to load."""

    name: str
    path: Path
    versions: dict[int, ServedModel]
    state: str  # READY, UNAVAILABLE, UNLOADING
    reason: str = ""


class ModelTable:
    """The models of one server. Event-loop only (loads run on worker threads)."""

    def __init__(
        self,
        repositories: Sequence[Path],
        settings: LoadSettings,
        *,
        model_control: ModelControlMode,
        repository_poll_secs: float,
        exit_timeout_s: float,
    ) -> None:
        self.repositories = list(repositories)
        self.settings = settings
        self.model_control = model_control
        self.repository_poll_secs = repository_poll_secs
        self.exit_timeout_s = exit_timeout_s
        #: (model, instance) of executors left running in execute when their model was closed
        self.hung_instances: list[tuple[str, str]] = []
        self.last_refusal_at = 0.0  # time.monotonic() of the latest request refused once closed
        self._models: dict[str, ModelState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._control_lock = asyncio.Lock()
        self._uploads = UploadDirs()
        self._fingerprints: dict[str, Fingerprint] = {}  # poll mode: each model folder as last loaded
        self._poll_task: asyncio.Task[None] | None = None
        self._closed = False
        self._retry_after_s: float | None = None  # what requests refused once closed are told
        self._loading: list[str] = []  # the loads in progress: an ensemble's steps load first

    # ----------------------------------------------------------------- start and close

    async def start(self, models: Sequence[str] | None) -> None:
        """Load every model of the repositories (or only ``models``); see ``Server.start``."""
        self._loop = asyncio.get_running_loop()
        for repo in self.repositories:
            if not repo.is_dir():
                raise InferenceError(Code.INVALID_ARG, f"model repository '{repo}' is not a directory")
        if self.model_control is ModelControlMode.POLL:
            if models is not None:
                raise ValueError("in poll mode every model of the repository loads: start() takes no model list")
            await self.poll_repository()
            if self.repository_poll_secs > 0:
                self._poll_task = asyncio.create_task(self._poll_periodically(), name="seqserve-repository-poll")
        else:
            names = models if models is not None else sorted({p.name for p in self._discover()})
            for name in names:
                if self._models.get(name) is not None and self._models[name].versions:
                    continue  # loaded already, as the step of an ensemble loaded before it
                # A model that fails is logged and listed UNAVAILABLE (with its reason) in the index.
                with contextlib.suppress(InferenceError):
                    await self.load_model(name)

    @property
    def closed(self) -> bool:
        """The shutdown has begun: the set of models no longer changes."""
        return self._closed

    def close(self, retry_after_s: float | None) -> None:
        """The shutdown began: from now on no load, unload or poll starts, every model stops
        accepting new work, and a request for a model that is not (or no longer) loaded gets
        UNAVAILABLE (SERVER_STOPPING) with ``retry_after_s``. Synchronous: it takes effect
        even while a load holds the control lock."""
        self._closed = True
        self._retry_after_s = retry_after_s
        for m in self.loaded():
            m.stop_accepting()

    async def stop_polling(self) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
            self._poll_task = None

    async def retire_all(self, deadline: float) -> bool:
        """Retire every model by ``deadline`` (a time.monotonic()), each as soon as its own
        sequences and requests are done; requests for it then get SERVER_STOPPING. A load or
        unload in progress ends first, unless it still runs at the deadline. True when the
        deadline cut a drain short."""
        locked = await self._acquire_control_lock(deadline)
        try:
            states = [s for s in self._models.values() if s.versions]
            for s in states:
                for m in s.versions.values():
                    m.stop_accepting()
            return any(await asyncio.gather(*(self._retire_at_exit(s, deadline) for s in states)))
        finally:
            if locked:
                self._control_lock.release()

    async def remove_uploads(self) -> None:
        await asyncio.to_thread(self._uploads.remove_all)

    async def _acquire_control_lock(self, deadline: float) -> bool:
        """The control lock, unless a load or unload still holds it at the deadline (a model's
        initialize that never returns must not hold the shutdown)."""
        if not self._control_lock.locked():  # free: take it now (a wait of 0 s would time out even so)
            return await self._control_lock.acquire()
        try:
            await asyncio.wait_for(self._control_lock.acquire(), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            log.warning("a model load or unload is still running at the exit timeout; not waiting for it")
            return False
        return True

    async def _retire_at_exit(self, state: ModelState, deadline: float) -> bool:
        cut_off = await self.retire(state, deadline=deadline)
        versions = sorted(state.versions)
        state.versions = {}
        state.state = "UNAVAILABLE"
        state.reason = "server is shut down"
        log.info("model '%s' versions %s stopped", state.name, versions)
        return cut_off

    async def retire(self, state: ModelState, timeout_s: float | None = None, *, deadline: float | None = None) -> bool:
        """Let running sequences finish (bounded), then stop the model. The bound is ``deadline``
        (a time.monotonic()), or ``timeout_s`` (default: exit_timeout_s) from now; it bounds the
        wait for the executors too (at least MIN_CLOSE_WAIT_S): an instance still in execute
        then is left behind and its requests fail. True when the bound cut the drain short."""
        models = list(state.versions.values())
        for m in models:
            m.stop_accepting()
        if deadline is None:
            deadline = time.monotonic() + (self.exit_timeout_s if timeout_s is None else timeout_s)
        # running sequences, and requests whose responses are still streaming
        while any(m.inflight_sequences or m.open_responses for m in models) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        forced = any(m.inflight_sequences for m in models)
        cut_off = forced or any(m.open_responses for m in models)
        for m in models:
            wait = max(deadline - time.monotonic(), MIN_CLOSE_WAIT_S)
            for instance in await asyncio.to_thread(m.close, force=forced, timeout_s=wait):
                self.hung_instances.append((m.name, instance))
                log.error(
                    "model '%s' instance '%s' did not return from execute within the exit timeout; %s",
                    m.name,
                    instance,
                    "exiting anyway" if self._closed else "unloading anyway (its thread is left behind)",
                )
        return cut_off

    # ----------------------------------------------------------------------- lookups

    def model(self, name: str, version: str | int = "") -> ServedModel:
        """The loaded model version (the highest when version is empty). Once closed, a model
        that is not (or no longer) loaded is UNAVAILABLE (SERVER_STOPPING)."""
        state = self._models.get(name)
        if state is None or not state.versions:
            if self._closed:  # with a state store, its sequences went on elsewhere: worth a retry there
                self.last_refusal_at = time.monotonic()  # see Drain.linger_while_requested
                raise InferenceError(Code.UNAVAILABLE, SERVER_STOPPING, retry_after_s=self._retry_after_s)
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if version in ("", None, -1, "-1"):
            return state.versions[max(state.versions)]
        try:
            v = int(version)
        except (TypeError, ValueError):
            raise InferenceError(Code.INVALID_ARG, f"failed to parse version '{version}' for model '{name}'") from None
        m = state.versions.get(v)
        if m is None:
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{name}' version {v} is not found")
        return m

    def sequence_model(self, model: str, version: str | int) -> LoadedModel:
        """``model``, refused with INVALID_ARG unless it is a sequence model."""
        m = self.model(model, version)
        if not isinstance(m, LoadedModel) or not m.is_sequence:
            raise InferenceError(Code.INVALID_ARG, f"model '{model}' is not a sequence model: it has no sequences")
        return m

    def versions(self, name: str) -> list[int]:
        """The loaded versions of a model, ascending."""
        state = self._models.get(name)
        return sorted(state.versions) if state is not None else []

    def loaded(self) -> list[LoadedModel]:
        """Every loaded model version (ensembles aside: they hold no requests or sequences of
        their own): models in the order they first loaded, versions ascending."""
        return [m for s in self._models.values() for _, m in sorted(s.versions.items()) if isinstance(m, LoadedModel)]

    def loaded_by_name(self) -> list[ServedModel]:
        """Every loaded model version, by name then version."""
        return [m for _, s in sorted(self._models.items()) for _, m in sorted(s.versions.items())]

    def select(self, name: str = "", version: str | int = "") -> list[ServedModel]:
        """One version, every version of one model (NOT_FOUND when it is unknown), or every
        loaded version of every model (no name)."""
        if name and version not in ("", None):
            return [self.model(name, version)]
        if name:
            self.model(name)  # NOT_FOUND when the model is unknown
            return [m for _, m in sorted(self._models[name].versions.items())]
        return self.loaded_by_name()  # not in load order: an ensemble loads its steps first

    def all_ready(self) -> bool:
        """Every model that was asked to load is READY (unloaded ones do not count)."""
        return all(s.state == "READY" or (not s.versions and s.reason == "unloaded") for s in self._models.values())

    def failed_models(self) -> dict[str, str]:
        """Models whose last load failed and that serve no version: name -> reason."""
        return {n: s.reason for n, s in self._models.items() if not s.versions and s.reason != "unloaded"}

    def repository_index(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        found: dict[str, int] = {}
        for p in self._discover():
            found[p.name] = found.get(p.name, 0) + 1
        for name in sorted(found.keys() | self._models.keys()):
            state = self._models.get(name)
            if found.get(name, 0) > 1 and (state is None or not state.versions):
                out.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": MODEL_DUPLICATE_REASON})
            elif state is None:
                out.append({"name": name, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"})
            elif state.versions:
                for v in sorted(state.versions):
                    out.append({"name": name, "version": str(v), "state": state.state, "reason": ""})
            else:
                out.append({"name": name, "version": "", "state": state.state, "reason": state.reason})
        return out

    def _discover(self) -> list[Path]:
        """Every model folder of every repository, in repository order."""
        return [d for repo in self.repositories if repo.is_dir() for d in discover_models(repo)]

    def _model_dirs(self, name: str) -> list[Path]:
        """The folders named ``name`` in the repositories (more than one: a duplicate)."""
        return [repo / name for repo in self.repositories if (repo / name).is_dir()]

    # ------------------------------------------------------------ checkpoint, restore

    def checkpoint_sequence(
        self, model: str, version: str | int, sequence_id: SequenceId, *, release: bool
    ) -> SequenceCheckpoint | None:
        """See ``Server.checkpoint_sequence``."""
        return self.sequence_model(model, version).checkpoint_sequence(sequence_id, release=release)

    def restore_sequence(self, ckpt: SequenceCheckpoint) -> None:
        """See ``Server.restore_sequence``."""
        self.sequence_model(ckpt.model, ckpt.version).restore_sequence(ckpt)

    def live_sequences(self) -> list[tuple[str, int, SequenceId, float]]:
        """See ``Server.live_sequences``."""
        return [
            (name, version, sequence_id, idle_s)
            for name, state in list(self._models.items())
            for version, m in list(state.versions.items())
            for sequence_id, idle_s in m.slot_sequences()
        ]

    # ------------------------------------------------------------- load, unload, poll

    async def load_model(
        self, name: str, *, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """See ``Server.load_model``."""
        check_model_name(name)
        if files and config_json is None:
            raise InferenceError(
                Code.INVALID_ARG, f"failed to load '{name}': model files were given without a 'config'"
            )
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        await _shielded(self._locked(self._load(name, config_json, files, loop)))

    async def unload_model(self, name: str) -> None:
        """See ``Server.unload_model``."""
        await _shielded(self._locked(self._unload(name)))

    def check_model_control(self) -> None:
        """Raise Triton's UNAVAILABLE error unless a load / unload request may proceed now:
        the server is up and ``model_control`` is explicit. The front-ends call it before
        they decode a load request's parameters."""
        if self._closed:
            raise InferenceError(Code.UNAVAILABLE, SERVER_NOT_READY)
        if self.model_control is not ModelControlMode.EXPLICIT:
            raise model_control_refused()

    async def request_load_model(
        self, name: str, *, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """See ``Server.request_load_model``."""
        self.check_model_control()
        await self.load_model(name, config_json=config_json, files=files)

    async def request_unload_model(self, name: str) -> None:
        """See ``Server.request_unload_model``."""
        self.check_model_control()
        await self.unload_model(name)

    async def poll_repository(self) -> dict[str, list[str]]:
        """See ``Server.poll_repository``."""
        self._loop = self._loop or asyncio.get_running_loop()
        result: dict[str, list[str]] = await _shielded(self._locked(self._poll(self._loop)))
        return result

    async def _locked(self, op: Coroutine[Any, Any, Any]) -> Any:
        """Run one change of the model set with the control lock held."""
        try:
            async with self._control_lock:
                if self._closed:
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
        path = found[0] if found else self.repositories[0] / name
        if files:
            path = await asyncio.to_thread(self._uploads.create, name, files)
        await self._load_steps(name, path, config_json, loop)
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
            await self.retire(old)
            if old.path != state.path:
                self._uploads.remove(old.path)

    async def _load_steps(
        self, name: str, path: Path, config_json: str | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        """An ensemble's step models load first, those not loaded yet (as Triton loads an
        ensemble's composing models with it). A step that fails leaves the ensemble to fail."""
        steps = await asyncio.to_thread(ensemble_step_names, name, path, config_json, self.settings.config_name)
        if not steps:
            return
        self._loading.append(name)
        try:
            for step in steps:
                if step in self._loading:  # remembered as this model's failure: the ensemble above says so
                    error = circular_dependency([*self._loading[self._loading.index(step) :], step])
                    if name not in self._models or not self._models[name].versions:
                        self._models[name] = ModelState(name, path, {}, "UNAVAILABLE", error.message)
                    raise error
                if self._models.get(step) is not None and self._models[step].versions:
                    continue
                with contextlib.suppress(InferenceError):  # logged; the ensemble's own load says why
                    await self._load(step, None, None, loop)
        finally:
            self._loading.pop()

    def _load_sync(self, name: str, loop: asyncio.AbstractEventLoop, path: Path, config_json: str | None) -> ModelState:
        """Parse, complete and validate the config, then load each version (a worker thread)."""
        versions: dict[int, ServedModel] = {}
        settings = self.settings
        try:
            if not path.is_dir():
                raise InferenceError(Code.NOT_FOUND, f"failed to load '{name}', no version is available")
            # parse -> backend autocomplete -> defaults -> validation
            if config_json is not None:
                cfg = parse_config_json(config_json, name=name)
            else:
                cfg = parse_model_config(path, name=name, config_name=settings.config_name)
            validate_paths(cfg)  # before the backend's autocomplete opens any file the config names
            if is_ensemble(cfg):
                finish_model_config(cfg, path)
                for v in select_versions(path, cfg):
                    versions[v] = build_ensemble(
                        cfg, version=v, path=path, loop=loop, lookup=self.model, load_failure=self._load_failure
                    )
                log.info("loaded ensemble '%s' versions %s", name, sorted(versions))
                return ModelState(name, path, versions, "READY")
            if settings.auto_complete:
                autocomplete_config(cfg, path, settings.default_max_batch_size)
            finish_model_config(cfg, path)
            for v in select_versions(path, cfg):
                versions[v] = LoadedModel(
                    cfg,
                    version=v,
                    model_dir=path,
                    loop=loop,
                    sessions=settings.sessions,
                    python_isolation=settings.python_isolation,
                    max_backlog_sequences=settings.max_backlog_sequences,
                    inline_max_batch_us=settings.inline_max_batch_us,
                    kind_gpu_on_cpu=settings.kind_gpu_on_cpu,
                    calls=settings.calls,
                )
        except Exception as e:
            for m in versions.values():
                m.close(force=True)
            reason = str(e) if isinstance(e, InferenceError) else f"{type(e).__name__}: {e}"
            log.error("failed to load model '%s': %s", name, reason)
            return ModelState(name, path, {}, "UNAVAILABLE", reason)
        log.info("loaded model '%s' versions %s", name, sorted(versions))
        return ModelState(name, path, versions, "READY")

    def _load_failure(self, name: str) -> str:
        state = self._models.get(name)
        return state.reason if state is not None and not state.versions else ""

    async def _unload(self, name: str, *, forget: bool = False) -> None:
        state = self._models.get(name)
        if state is None:
            raise InferenceError(Code.INVALID_ARG, f"failed to unload '{name}', model is not loaded")
        state.state = "UNLOADING"
        await self.retire(state)
        state.versions = {}
        state.state = "UNAVAILABLE"
        state.reason = "unloaded"
        self._uploads.remove(state.path)
        if forget and self._models.get(name) is state:
            del self._models[name]
        log.info("unloaded model '%s'", name)

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
            if name in added and name in self._models and self._models[name].versions:
                continue  # loaded in this pass already, as the step of an ensemble
            if name in modified:
                log.info("model '%s' changed in the repository: reloading", name)
            with contextlib.suppress(InferenceError):  # logged, and listed UNAVAILABLE with its reason
                await self._load(name, None, None, loop)
        return {"added": added, "removed": removed, "modified": modified}

    async def _poll_periodically(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.repository_poll_secs)
            try:
                await self.poll_repository()
            except InferenceError as e:
                if self._closed:
                    return
                log.error("failed to poll model repository: %s", e)
            except Exception:
                log.exception("failed to poll model repository")


def check_model_name(name: str) -> None:
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
