"""The in-process API: what the HTTP/gRPC front-ends and embedding applications call.

server = Server("models/")
await server.start()
result = await server.infer("accumulator", {"INPUT": x}, sequence_id=7, sequence_start=True)
await server.shutdown()

``Server`` is assembled from parts a reader can hold in their head: this module (construction,
start, load of one model, health, metadata, statistics, the request path, the sequence API),
``repository_control`` (model control, load/unload/poll), ``drain`` (shutdown) and
``keyword_api`` (the keyword helpers), ``server_checkpoints`` (checkpoint and restore of live
sequences); what they share is in ``server_state``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqserve import __version__
from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.config import (
    config_to_json,
    finish_model_config,
    parse_config_json,
    parse_model_config,
    validate_paths,
)
from seqserve.engine.counters import ModelCounters
from seqserve.engine.drain import Drain
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.keyword_api import KeywordAPI
from seqserve.engine.model import LoadedModel
from seqserve.engine.model.execution import DEFAULT_INLINE_MAX_BATCH_US, check_mode
from seqserve.engine.model.loaded import DEFAULT_MAX_BACKLOG_SEQUENCES
from seqserve.engine.model_control import (
    DEFAULT_REPOSITORY_POLL_SECS,
    Fingerprint,
    ModelControlMode,
)
from seqserve.engine.repository import discover_models, select_versions
from seqserve.engine.repository_control import RepositoryControl
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.server_checkpoints import CheckpointAPI
from seqserve.engine.server_state import (
    MODEL_DUPLICATE_REASON,
    SERVER_STOPPING,
    ModelState,
    _autocomplete,
    _check_model_name,
    _shielded,
    log,
)
from seqserve.engine.sessions import EndedSequence, SequenceInfo, SequenceList, SessionPolicy
from seqserve.engine.uploads import UploadDirs

if TYPE_CHECKING:
    from seqserve.engine.handoff import Handoff
    from seqserve.engine.statestore import StateStore


class Server(RepositoryControl, Drain, KeywordAPI, CheckpointAPI):
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
        max_backlog_sequences: int = DEFAULT_MAX_BACKLOG_SEQUENCES,
        inline_max_batch_us: int = DEFAULT_INLINE_MAX_BATCH_US,
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
        per instance; see docs/isolation.md).

        max_backlog_sequences: admission control, how many sequences of one model may wait in
        its backlog for a slot (0: no bound, as in Triton); a START beyond it is refused at once
        with UNAVAILABLE. A model's ``sequence_batching.max_backlog_sequences`` overrides it.

        inline_max_batch_us: in-process Python models whose batches cost at most this many
        microseconds run them on the event loop's thread instead of handing each batch to an
        executor thread (0: never; a model's parameter ``inline_max_batch_us`` overrides it;
        docs/architecture.md, "Inline execution")."""
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
        if max_backlog_sequences < 0:
            raise ValueError(f"max_backlog_sequences must be >= 0 (0: no bound), got {max_backlog_sequences}")
        self.max_backlog_sequences = max_backlog_sequences
        if inline_max_batch_us < 0:
            raise ValueError(f"inline_max_batch_us must be >= 0 (0: never inline), got {inline_max_batch_us}")
        self.inline_max_batch_us = inline_max_batch_us
        self.sessions = sessions or SessionPolicy()
        self._models: dict[str, ModelState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live = False
        self._exiting = False
        self.last_refusal_at = 0.0  # time.monotonic() of the latest request refused while exiting
        # Loads, unloads and polls change the set of models one at a time (Triton's poll_mu_).
        self._control_lock = asyncio.Lock()
        self._uploads = UploadDirs()
        self._fingerprints: dict[str, Fingerprint] = {}  # poll mode: each model folder as last loaded
        self._poll_task: asyncio.Task[None] | None = None
        self._shutdown_deadline: float | None = None  # time.monotonic() when the drain ends
        #: (model, instance) of executors left running in execute when their model was closed
        self.hung_instances: list[tuple[str, str]] = []
        self._handoff: Handoff | None = None  # the shared state store's coordinator, when enabled

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
                    max_backlog_sequences=self.max_backlog_sequences,
                    inline_max_batch_us=self.inline_max_batch_us,
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

    # ----------------------------------------------------------- load / unload / poll

    @property
    def shutdown_deadline(self) -> float | None:
        """When the drain ends (time.monotonic()); None until the shutdown begins."""
        return self._shutdown_deadline

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
            if self._exiting:  # with a state store, its sequences went on elsewhere: worth a retry there
                self.last_refusal_at = time.monotonic()  # see linger_while_requested
                raise InferenceError(
                    Code.UNAVAILABLE, SERVER_STOPPING, retry_after_s=None if self._handoff is None else 1.0
                )
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
        if self._handoff is not None and m.is_sequence:
            return self._handoff.enqueue(m, request, response_parameters)
        return m.submit(request, response_parameters=response_parameters)

    def enqueue_streaming(self, request: InferRequest, on_response: ResponseCallback) -> Callable[[], None]:
        """Queue one request now; ``on_response(response, final)`` gets its responses on the
        event loop: an InferResult, an InferenceError, or None (a final flag alone, from
        decoupled models). Most models answer once, with final=True; decoupled models any
        number of times, the last with final=True. Works for every model. Raises
        InferenceError at once for requests the scheduler refuses (no callback then).
        Returns ``cancel()``, to call when the client is gone (models see ``is_cancelled()``)."""
        m, response_parameters = self._route(request)
        if self._handoff is not None and m.is_sequence:
            return self._handoff.enqueue_streaming(m, request, response_parameters, on_response)
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

    async def enable_state_store(
        self, store: StateStore, *, spill_idle_s: float = 0.0, handover_timeout_s: float = 2.0
    ) -> Handoff:
        """Share sequences with other replicas through ``store`` (docs/state-store.md): this
        replica records the sequences it runs, hands them off at shutdown (and, with
        ``spill_idle_s``, when idle that long), hands one over when another replica asks, and
        takes over a step's sequence from the store when it does not hold it. Call once, after
        ``start``."""
        from seqserve.engine.handoff import Handoff

        if self._handoff is not None:
            raise RuntimeError("a state store is already enabled")
        handoff = Handoff(self, store, spill_idle_s=spill_idle_s, handover_timeout_s=handover_timeout_s)
        await handoff.start()
        self._handoff = handoff
        return handoff

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
