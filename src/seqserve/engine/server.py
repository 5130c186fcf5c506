"""The in-process API: what the HTTP/gRPC front-ends and embedding applications call.

server = Server("models/")
await server.start()
result = await server.infer("accumulator", {"INPUT": x}, sequence_id=7, sequence_start=True)
await server.shutdown()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqserve import __version__
from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import find_backend
from seqserve.engine.config import (
    config_to_json,
    finish_model_config,
    parse_config_json,
    parse_model_config,
    validate_paths,
)
from seqserve.engine.counters import ModelCounters
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation.settings import check_mode
from seqserve.engine.model import LoadedModel
from seqserve.engine.model_control import (
    DEFAULT_REPOSITORY_POLL_SECS,
    SERVER_NOT_READY,
    Fingerprint,
    ModelControlMode,
    model_control_refused,
    model_fingerprint,
    repository_fingerprints,
)
from seqserve.engine.repository import available_versions, discover_models, select_versions
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.sessions import EndedSequence, SequenceInfo, SequenceList, SessionPolicy
from seqserve.engine.uploads import UploadDirs

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


class Server:
    """Serves a model repository in this process. All methods run on one asyncio loop."""

    def __init__(
        self,
        model_repository: str | Path | Sequence[str | Path],
        *,
        exit_timeout_s: float = 30.0,
        auto_sequence_ids: bool = True,
        model_control: ModelControlMode | str = ModelControlMode.NONE,
        repository_poll_secs: float = DEFAULT_REPOSITORY_POLL_SECS,
        strict_readiness: bool = True,
        sessions: SessionPolicy | None = None,
        python_isolation: str = "thread",
    ) -> None:
        """auto_sequence_ids: a request to a sequence model that names no sequence starts a new
        one with a server-generated id (returned as the `sequence_id` response parameter).
        False gives Triton's strict behaviour: such a request is an error.

        model_control ("none", "explicit", "poll"; see ``seqserve.engine.model_control``):
        whether the model control API (``request_load_model`` / ``request_unload_model``,
        what the network front-ends call) may change the loaded models, and whether the
        repository is polled for changes (every ``repository_poll_secs``; 0: only at start).
        ``load_model`` / ``unload_model`` are this process's own and work in every mode.

        model_repository: one repository, or several (as Triton's repeated
        ``--model-repository``); a model name found in two of them loads from neither.

        strict_readiness (Triton's ``--strict-readiness``): ``is_ready`` is false while a
        model failed to load; False: ready once started, whatever the models.

        sessions: how long and how many ended or expired sessions each model version
        remembers (``seqserve.engine.sessions``).

        python_isolation: where Python models' instances run unless their config says
        (parameter `isolation`): "thread" (in this process) or "process" (one child process
        per instance; see docs/isolation.md)."""
        self.python_isolation = check_mode(python_isolation, "python_isolation")
        repos = [model_repository] if isinstance(model_repository, str | Path) else list(model_repository)
        if not repos:
            raise ValueError("at least one model repository is needed")
        self.repositories = [Path(r) for r in repos]
        self.repository = self.repositories[0]  # the first one; uploads and single-repository callers
        self.strict_readiness = strict_readiness
        self.exit_timeout_s = exit_timeout_s
        self.auto_sequence_ids = auto_sequence_ids
        self.model_control = ModelControlMode.parse(model_control)
        if repository_poll_secs < 0:
            raise ValueError(f"repository_poll_secs must be >= 0, got {repository_poll_secs}")
        self.repository_poll_secs = repository_poll_secs
        self.sessions = sessions or SessionPolicy()
        self._models: dict[str, ModelState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live = False
        self._exiting = False
        # Loads, unloads and polls change the set of models one at a time (Triton's poll_mu_).
        self._control_lock = asyncio.Lock()
        self._uploads = UploadDirs()
        self._fingerprints: dict[str, Fingerprint] = {}  # poll mode: each model folder as last loaded
        self._poll_task: asyncio.Task[None] | None = None
        self._shutdown_deadline: float | None = None  # time.monotonic() when the drain ends
        #: (model, instance) of executors left running in execute when their model was closed
        self.hung_instances: list[tuple[str, str]] = []

    # ------------------------------------------------------------------------ lifecycle

    async def start(self, models: Sequence[str] | None = None) -> None:
        """Load every model of the repository (or only `models`). A model that fails to
        load is reported with its reason and does not stop the others.

        In poll mode every model loads (``models`` must be None) and, when
        ``repository_poll_secs`` > 0, the repository is polled from then on."""
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
                # A model that fails is logged and listed UNAVAILABLE (with its reason) in the index.
                with contextlib.suppress(InferenceError):
                    await self.load_model(name)
        self._live = True

    def _load_sync(self, name: str, loop: asyncio.AbstractEventLoop, path: Path, config_json: str | None) -> ModelState:
        versions: dict[int, LoadedModel] = {}
        try:
            if not path.is_dir():
                raise InferenceError(Code.NOT_FOUND, f"failed to load '{name}', no version is available")
            # parse -> backend autocomplete -> defaults -> validation
            if config_json is not None:
                cfg = parse_config_json(config_json, name=name)
            else:
                cfg = parse_model_config(path, name=name)
            validate_paths(cfg)  # before the backend's autocomplete opens any file the config names
            _autocomplete(cfg, path)
            finish_model_config(cfg, path)
            for v in select_versions(path, cfg):
                versions[v] = LoadedModel(
                    cfg,
                    version=v,
                    model_dir=path,
                    loop=loop,
                    sessions=self.sessions,
                    python_isolation=self.python_isolation,
                )
        except Exception as e:
            for m in versions.values():
                m.close(force=True)
            reason = str(e) if isinstance(e, InferenceError) else f"{type(e).__name__}: {e}"
            log.error("failed to load model '%s': %s", name, reason)
            return ModelState(name, path, {}, "UNAVAILABLE", reason)
        log.info("loaded model '%s' versions %s", name, sorted(versions))
        return ModelState(name, path, versions, "READY")

    async def load_model(
        self, name: str, *, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load (or reload) a model; raises InferenceError with the reason when it fails.

        config_json overrides the repository's config.pbtxt (a ModelConfig in JSON);
        files ({"<version>/<file>": content}) replaces the model's directory, as in
        Triton's load API, and then needs config_json. The files go to a private temporary
        folder, removed when the model is unloaded or replaced and at shutdown.

        The model loads on a worker thread, so the event loop keeps serving meanwhile; a
        load goes on to its end even when the caller is cancelled. This is the in-process
        API: it works whatever ``model_control`` says (see ``request_load_model``)."""
        _check_model_name(name)
        if files and config_json is None:
            raise InferenceError(
                Code.INVALID_ARG, f"failed to load '{name}': model files were given without a 'config'"
            )
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        await _shielded(self._locked(self._load(name, config_json, files, loop)))

    async def unload_model(self, name: str) -> None:
        """Unload a model: running sequences get up to ``exit_timeout_s`` to finish. The
        in-process API: it works whatever ``model_control`` says (see ``request_unload_model``)."""
        await _shielded(self._locked(self._unload(name)))

    # ------------------------------------------------------------ model control API

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

    # ----------------------------------------------------------- load / unload / poll

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

    async def _retire(
        self, state: ModelState, timeout_s: float | None = None, *, deadline: float | None = None
    ) -> bool:
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
                    "exiting anyway" if self._exiting else "unloading anyway (its thread is left behind)",
                )
        return cut_off

    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """The synchronous first step of ``shutdown`` (an application calls it from its signal
        handler): from now on the server and its models are not ready, new sequences (and
        requests to models without sequences) get UNAVAILABLE, and the drain's deadline is set,
        ``timeout_s`` (default: exit_timeout_s) from now. Idempotent."""
        if self._shutdown_deadline is not None:
            return
        self._shutdown_deadline = time.monotonic() + (self.exit_timeout_s if timeout_s is None else timeout_s)
        self._exiting = True
        self._live = False
        for s in self._models.values():  # at once, even while a load holds the lock
            for m in s.versions.values():
                m.stop_accepting()

    @property
    def shutdown_deadline(self) -> float | None:
        """When the drain ends (time.monotonic()); None until the shutdown begins."""
        return self._shutdown_deadline

    def open_work(self) -> tuple[int, int, list[str]]:
        """(sequences, requests, per-model details) still open: sequences holding a slot (or
        backlogged) and requests not answered for good, over every loaded model version."""
        sequences = requests = 0
        details = []
        for s in self._models.values():
            for v, m in sorted(s.versions.items()):
                seq = m.inflight_sequences if m.is_sequence else 0
                req = m.open_requests
                if seq or req:
                    sequences += seq
                    requests += req
                    details.append(f"'{m.name}' version {v}: {_count(seq, 'sequence')}, {_count(req, 'request')}")
        return sequences, requests, details

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Orderly stop, bounded by ``timeout_s`` (default: exit_timeout_s) from the moment it
        begins (see ``begin_shutdown``): new STARTs get UNAVAILABLE, running sequences go on
        to their END, open requests get their answers; every second a log line says what is
        still open. At the deadline the models are closed anyway: what never ran fails with
        UNAVAILABLE, and an instance that does not return from execute is left behind (see
        ``hung_instances``). Polling stops; a load or unload in progress ends first (unless it
        outlasts the deadline). Upload folders are removed."""
        self.begin_shutdown(timeout_s)
        deadline = self._shutdown_deadline
        assert deadline is not None
        progress = asyncio.create_task(self._log_progress(deadline), name="seqserve-shutdown-progress")
        try:
            if self._poll_task is not None:
                self._poll_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._poll_task
                self._poll_task = None
            locked = await self._acquire_control_lock(deadline)
            try:
                await self._shutdown_models(deadline)
            finally:
                if locked:
                    self._control_lock.release()
        finally:
            progress.cancel()
        await asyncio.to_thread(self._uploads.remove_all)

    async def _acquire_control_lock(self, deadline: float) -> bool:
        """The control lock, unless a load or unload still holds it at the deadline (a model's
        initialize that never returns must not hold the shutdown)."""
        try:
            await asyncio.wait_for(self._control_lock.acquire(), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            log.warning("a model load or unload is still running at the exit timeout; not waiting for it")
            return False
        return True

    async def _log_progress(self, deadline: float) -> None:
        while True:
            await asyncio.sleep(1.0)
            sequences, requests, details = self.open_work()
            left = max(deadline - time.monotonic(), 0.0)
            log.info(
                "shutting down: %s and %s still open%s; %.0f s left",
                _count(sequences, "sequence"),
                _count(requests, "request"),
                f" ({'; '.join(details)})" if details else "",
                left,
            )

    async def _shutdown_models(self, deadline: float) -> None:
        states = [s for s in self._models.values() if s.versions]
        for s in states:
            for m in s.versions.values():
                m.stop_accepting()
        cut_off = await asyncio.gather(*(self._retire_at_exit(s, deadline) for s in states))
        if any(cut_off):
            log.warning("Exit timeout expired. Exiting immediately.")

    async def _retire_at_exit(self, state: ModelState, deadline: float) -> bool:
        """Each model goes as soon as its own sequences and requests are done; requests for it
        then get SERVER_STOPPING (see ``model``)."""
        cut_off = await self._retire(state, deadline=deadline)
        versions = sorted(state.versions)
        state.versions = {}
        state.state = "UNAVAILABLE"
        state.reason = "server is shut down"
        log.info("model '%s' versions %s stopped", state.name, versions)
        return cut_off

    # --------------------------------------------------------------------------- health

    @property
    def exiting(self) -> bool:
        """The shutdown has begun (``begin_shutdown``)."""
        return self._exiting

    def is_live(self) -> bool:
        return self._live and not self._exiting

    def is_ready(self) -> bool:
        """Live, and (with strict_readiness, as Triton's) every model that was asked to load
        is READY: one whose load failed makes the server not ready; unloaded ones do not."""
        if not self.is_live():
            return False
        if not self.strict_readiness:
            return True
        return all(s.state == "READY" or (not s.versions and s.reason == "unloaded") for s in self._models.values())

    def failed_models(self) -> dict[str, str]:
        """Models whose last load failed and that serve no version: name -> reason."""
        return {n: s.reason for n, s in self._models.items() if not s.versions and s.reason != "unloaded"}

    def _discover(self) -> list[Path]:
        """Every model folder of every repository, in repository order."""
        return [d for repo in self.repositories if repo.is_dir() for d in discover_models(repo)]

    def _model_dirs(self, name: str) -> list[Path]:
        """The folders named ``name`` in the repositories (more than one: a duplicate)."""
        return [repo / name for repo in self.repositories if (repo / name).is_dir()]

    def model(self, name: str, version: str | int = "") -> LoadedModel:
        """The loaded model version (the highest when version is empty). Once the shutdown has
        begun, a model that is not (or no longer) loaded is UNAVAILABLE (SERVER_STOPPING)."""
        state = self._models.get(name)
        if state is None or not state.versions:
            if self._exiting:
                raise InferenceError(Code.UNAVAILABLE, SERVER_STOPPING)
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

    def is_model_ready(self, name: str, version: str | int = "") -> bool:
        try:
            self.model(name, version)
        except InferenceError:
            return False
        return not self._exiting

    # ------------------------------------------------------------------------- metadata

    def metadata(self) -> dict[str, str]:
        """The server's name and version; the front-ends add the protocol extensions they serve."""
        return {"name": "seqserve", "version": __version__}

    def model_metadata(self, name: str, version: str | int = "") -> dict[str, Any]:
        m = self.model(name, version)
        meta = m.metadata()
        if version in ("", None):
            meta["versions"] = [str(v) for v in sorted(self._models[name].versions)]
        return meta

    def model_config(self, name: str, version: str | int = "") -> mc.ModelConfig:
        return self.model(name, version).config

    def model_config_json(self, name: str, version: str | int = "") -> dict[str, Any]:
        return config_to_json(self.model_config(name, version))

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

    def statistics(self, name: str = "", version: str | int = "") -> list[dict[str, Any]]:
        """Triton-shaped model statistics (durations in ns)."""
        if name and version not in ("", None):
            targets = [self.model(name, version)]
        elif name:
            self.model(name)  # NOT_FOUND when the model is unknown
            targets = [m for _, m in sorted(self._models[name].versions.items())]
        else:
            targets = [m for s in self._models.values() for m in s.versions.values()]
        out = []
        for m in targets:
            s = m.statistics()
            out.append(
                {
                    "name": m.name,
                    "version": m.version_str,
                    "last_inference": s["last_inference"],
                    "inference_count": s["inference_count"],
                    "execution_count": s["execution_count"],
                    "inference_stats": {
                        k: s[k]
                        for k in (
                            "success",
                            "fail",
                            "queue",
                            "compute_input",
                            "compute_infer",
                            "compute_output",
                        )
                    }
                    | {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
                    "batch_stats": s["batch_stats"],
                }
            )
        return out

    # ---------------------------------------------------------------------------- infer

    def enqueue(self, request: InferRequest) -> asyncio.Future[InferResult]:
        """Queue one request now and return its future (so callers keep arrival order).
        Raises InferenceError at once for requests the scheduler refuses.

        Sequence models need ``request.sequence_id`` (uint64 or str; 5 and "5" are different
        sequences) and START on the first request; without an id a new sequence starts under
        a generated id (see ``auto_sequence_ids``; the request is updated with it). Decoupled
        models refuse it (DecoupledModelError): use ``enqueue_streaming``."""
        m, response_parameters = self._route(request)
        return m.submit(request, response_parameters=response_parameters)

    def enqueue_streaming(self, request: InferRequest, on_response: ResponseCallback) -> Callable[[], None]:
        """Queue one request now; ``on_response(response, final)`` gets its responses on the
        event loop: an InferResult, an InferenceError, or None (a final flag alone, from
        decoupled models). Most models answer once, with final=True; decoupled models any
        number of times, the last with final=True. Works for every model. Raises
        InferenceError at once for requests the scheduler refuses (no callback then).
        Returns ``cancel()``, to call when the client is gone (models see ``is_cancelled()``)."""
        m, response_parameters = self._route(request)
        return m.submit_streaming(request, on_response, response_parameters=response_parameters)

    def _route(self, request: InferRequest) -> tuple[LoadedModel, dict[str, Any] | None]:
        """The model version a request goes to; a request to a sequence model that names no
        sequence starts a new one under a generated id when `auto_sequence_ids` is on."""
        m = self.model(request.model, request.version)
        if m.is_sequence and not request.sequence_id and self.auto_sequence_ids:
            request.sequence_id = m.new_sequence_id()
            request.sequence_start = True
            request.session = True  # its end or expiry is remembered, as a named session's
            return m, {"sequence_id": request.sequence_id}
        return m, None

    def session_sequence_id(self, model: str, version: str | int, session: str) -> SequenceId:
        """The sequence id a session id names: a string id, except for models whose CORRID
        control has an integer type (they cannot take string ids), where a decimal session id is
        the uint64 id, so the ids the server generates for them round-trip."""
        if not (session.isascii() and session.isdigit() and 0 < int(session) < 2**64):
            return session
        try:
            cfg = self.model_config(model, version)
        except InferenceError:
            return session
        for ci in cfg.sequence_batching.control_input:
            for c in ci.control:
                if c.kind == mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                    return session if c.data_type == mc.TYPE_STRING else int(session)
        return session

    # ---------------------------------------------------------------------- sequence API

    def sequences(self, model: str, version: str | int = "", *, limit: int = 1000) -> SequenceList:
        """The live sequences of a model version (holding a slot or backlogged): how many, and
        up to ``limit`` of them, the oldest first. INVALID_ARG for a model without sequences."""
        m = self._sequence_model(model, version)
        if limit < 0:
            raise InferenceError(Code.INVALID_ARG, f"limit must be >= 0, got {limit}")
        return m.sequences(limit)

    def sequence(self, model: str, sequence_id: SequenceId, version: str | int = "") -> SequenceInfo:
        """One live sequence (5 and "5" are different ids); NOT_FOUND when it is not live."""
        return self._sequence_model(model, version).sequence(sequence_id)

    def end_sequence(self, model: str, sequence_id: SequenceId, version: str | int = "") -> EndedSequence:
        """End a live sequence now, as idle expiry ends it (a final END step for
        ``TIMEOUT_COMPLETE`` models; a backlogged one's requests are cancelled). Its next
        session request gets SessionGoneError, its next ``sequence_id`` request without START
        the START error. NOT_FOUND when it is not live."""
        return self._sequence_model(model, version).end_sequence(sequence_id)

    def _sequence_model(self, model: str, version: str | int) -> LoadedModel:
        m = self.model(model, version)
        if not m.is_sequence:
            raise InferenceError(Code.INVALID_ARG, f"model '{model}' is not a sequence model: it has no sequences")
        return m

    # --------------------------------------------------------------------------- metrics

    def model_counters(self) -> list[ModelCounters]:
        """A snapshot of every loaded model version's counters, for metrics exporters: read at
        once from the counts the core keeps anyway."""
        return [m.counters() for _, s in sorted(self._models.items()) for _, m in sorted(s.versions.items())]

    # Keyword conveniences for embedding applications: each builds one InferRequest.

    def submit(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> asyncio.Future[InferResult]:
        """``enqueue`` with the request given as keywords."""
        return self.enqueue(
            InferRequest(
                model,
                dict(inputs),
                _version_str(version),
                request_id,
                sequence_id,
                sequence_start,
                sequence_end,
                tuple(outputs or ()),
                priority,
                timeout_us,
            )
        )

    def submit_streaming(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        on_response: ResponseCallback,
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> Callable[[], None]:
        """``enqueue_streaming`` with the request given as keywords."""
        return self.enqueue_streaming(
            InferRequest(
                model,
                dict(inputs),
                _version_str(version),
                request_id,
                sequence_id,
                sequence_start,
                sequence_end,
                tuple(outputs or ()),
                priority,
                timeout_us,
            ),
            on_response,
        )

    async def stream(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> AsyncIterator[InferResult]:
        """Run one request and yield its responses as they come (one for most models, any
        number for decoupled ones). An error response is raised, which ends the iteration.
        Leaving the iteration early cancels the request (models see ``is_cancelled()``)."""
        queue: asyncio.Queue[tuple[InferResult | InferenceError | None, bool]] = asyncio.Queue()
        cancel = self.submit_streaming(
            model,
            inputs,
            lambda response, final: queue.put_nowait((response, final)),
            version=version,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            outputs=outputs,
            request_id=request_id,
            timeout_us=timeout_us,
            priority=priority,
        )
        final = False
        try:
            while not final:
                response, final = await queue.get()
                if isinstance(response, InferenceError):
                    raise response
                if response is not None:
                    yield response
        finally:
            if not final:
                cancel()

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> InferResult:
        """Run one request and wait for its result; see `submit`."""
        return await self.submit(
            model,
            inputs,
            version=version,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            outputs=outputs,
            request_id=request_id,
            timeout_us=timeout_us,
            priority=priority,
        )


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
