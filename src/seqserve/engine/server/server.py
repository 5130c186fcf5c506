"""The in-process API: what the HTTP/gRPC front-ends and embedding applications call.

server = Server("models/")
await server.start()
result = await server.infer("accumulator", {"INPUT": x}, sequence_id=7, sequence_start=True)
await server.shutdown()

``Server`` is a façade over the parts it owns: ``models`` (the model table: loading, unloading,
polling, lookups, checkpoints), ``drain`` (the shutdown) and, with a state store, the replica
coordinator. It keeps construction, start, health, metadata, the request path and the sequence
API; everything else is one line handing the call to the part that owns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from seqserve import __version__
from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import add_backend_directory
from seqserve.engine.backends.base import DEFAULT_MAX_BATCH_SIZE
from seqserve.engine.backends.bls import ModelCalls
from seqserve.engine.config import config_to_json
from seqserve.engine.counters import ModelCounters
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model import LoadedModel
from seqserve.engine.model.execution import DEFAULT_INLINE_MAX_BATCH_US, check_mode
from seqserve.engine.model.loaded import DEFAULT_MAX_BACKLOG_SEQUENCES
from seqserve.engine.replicas.checkpoint import SequenceCheckpoint
from seqserve.engine.replicas.coordinator import ReplicaCoordinator
from seqserve.engine.replicas.store import StateStore
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.server.drain import LINGER_CAP_S, LINGER_QUIET_S, Drain
from seqserve.engine.server.keywords import RequestOptions, keyword_request
from seqserve.engine.server.model_control import DEFAULT_REPOSITORY_POLL_SECS, ModelControlMode
from seqserve.engine.server.models import LoadSettings, ModelTable, ServedModel
from seqserve.engine.sessions import EndedSequence, SequenceInfo, SequenceList, SessionPolicy
from seqserve.engine.statistics import ModelStatistics
from seqserve.engine.tracing import RequestTracer

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("seqserve.server")


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
        max_backlog_sequences: int = DEFAULT_MAX_BACKLOG_SEQUENCES,
        inline_max_batch_us: int = DEFAULT_INLINE_MAX_BATCH_US,
        server_id: str = "seqserve",
        model_config_name: str | None = None,
        auto_complete_config: bool = True,
        default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        backend_directory: str | Path | None = None,
        kind_gpu_on_cpu: bool = False,
    ) -> None:
        """server_id: the name the server metadata reports (Triton's --id).
        model_config_name: load each model's ``configs/<name>.pbtxt`` where it has one
        (Triton's --model-config-name). auto_complete_config: backends may complete a config
        from the model file (Triton's default; --disable-auto-complete-config turns it off);
        a completed config that can batch gets ``default_max_batch_size``.
        backend_directory: third-party backends, ``<dir>/<name>/backend.py`` (Triton's
        --backend-directory; see ``seqserve.engine.backends``).

        auto_sequence_ids: a request to a sequence model that names no sequence starts a new
        one with a server-generated id (returned as the `sequence_id` response parameter).
        False gives Triton's strict behaviour: such a request is an error.

        model_control ("none", "explicit", "poll"; see ``seqserve.engine.server.model_control``):
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
        docs/architecture.md, "Inline execution").

        kind_gpu_on_cpu: a ``KIND_GPU`` instance group that cannot run on a GPU (none usable, or
        a backend without GPU support) runs on the CPU with one warning per model, instead of
        failing to load (docs/gpu.md)."""
        python_isolation = check_mode(python_isolation, "python_isolation")
        repos = [model_repository] if isinstance(model_repository, str | Path) else list(model_repository)
        if not repos:
            raise ValueError("at least one model repository is needed")
        mode = ModelControlMode.parse(model_control)
        if repository_poll_secs < 0:
            raise ValueError(f"repository_poll_secs must be >= 0, got {repository_poll_secs}")
        if max_backlog_sequences < 0:
            raise ValueError(f"max_backlog_sequences must be >= 0 (0: no bound), got {max_backlog_sequences}")
        if inline_max_batch_us < 0:
            raise ValueError(f"inline_max_batch_us must be >= 0 (0: never inline), got {inline_max_batch_us}")
        self.server_id = server_id
        if backend_directory is not None:
            added = add_backend_directory(Path(backend_directory))
            log.info("backends from %s: %s", backend_directory, ", ".join(added) or "none")
        self.strict_readiness = strict_readiness
        self.auto_sequence_ids = auto_sequence_ids
        self.sessions = sessions or SessionPolicy()
        #: calls between models (BLS): its models' requests to each other go through this server
        self.calls = ModelCalls(self)
        #: the loaded models and every change to them
        self.models = ModelTable(
            [Path(r) for r in repos],
            LoadSettings(
                self.sessions,
                python_isolation,
                max_backlog_sequences,
                inline_max_batch_us,
                config_name=model_config_name,
                auto_complete=auto_complete_config,
                default_max_batch_size=default_max_batch_size,
                kind_gpu_on_cpu=kind_gpu_on_cpu,
                calls=self.calls,
            ),
            model_control=mode,
            repository_poll_secs=repository_poll_secs,
            exit_timeout_s=exit_timeout_s,
        )
        #: the shutdown
        self.drain = Drain(self.models)
        #: the state store's coordinator, once ``enable_state_store`` attached one
        self.replicas: ReplicaCoordinator | None = None
        #: decides which requests are traced (engine/tracing.py); None: tracing is off
        self.tracer: RequestTracer | None = None

    @property
    def exit_timeout_s(self) -> float:
        return self.models.exit_timeout_s

    @property
    def model_control(self) -> ModelControlMode:
        return self.models.model_control

    @property
    def hung_instances(self) -> list[tuple[str, str]]:
        """(model, instance) of executors left running in execute when their model was closed."""
        return self.models.hung_instances

    # ------------------------------------------------------------------------ lifecycle

    async def start(self, models: Sequence[str] | None = None) -> None:
        """Load every model of the repository (or only `models`). A model that fails to
        load is reported with its reason and does not stop the others.

        In poll mode every model loads (``models`` must be None) and, when
        ``repository_poll_secs`` > 0, the repository is polled from then on."""
        self.calls.bind(asyncio.get_running_loop())
        await self.models.start(models)
        self.drain.started()

    async def enable_state_store(
        self, store: StateStore, *, spill_idle_s: float = 0.0, handover_timeout_s: float = 2.0
    ) -> ReplicaCoordinator:
        """Share sequences with other replicas through ``store`` (docs/state-store.md): this
        replica records the sequences it runs, hands them off at shutdown (and, with
        ``spill_idle_s``, when idle that long), hands one over when another replica asks, and
        takes over a step's sequence from the store when it does not hold it. Call once, after
        ``start``."""
        if self.replicas is not None:
            raise RuntimeError("a state store is already enabled")
        replicas = ReplicaCoordinator(
            self.models, self.sessions, store, spill_idle_s=spill_idle_s, handover_timeout_s=handover_timeout_s
        )
        await replicas.start()
        self.replicas = replicas
        self.drain.attach(replicas)
        return replicas

    def begin_shutdown(self, timeout_s: float | None = None) -> None:
        """The synchronous first step of ``shutdown`` (an application calls it from its signal
        handler): from now on the server and its models are not ready, new sequences (and
        requests to models without sequences) get UNAVAILABLE, and the drain's deadline is set,
        ``timeout_s`` (default: exit_timeout_s) from now. Idempotent."""
        self.drain.begin_shutdown(timeout_s)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Orderly stop, bounded by ``timeout_s`` (default: exit_timeout_s) from the moment it
        begins (see ``begin_shutdown``): new STARTs get UNAVAILABLE, running sequences go on
        to their END, open requests get their answers; every second a log line says what is
        still open. At the deadline the models are closed anyway: what never ran fails with
        UNAVAILABLE, and an instance that does not return from execute is left behind (see
        ``hung_instances``). Polling stops; a load or unload in progress ends first (unless it
        outlasts the deadline). Upload folders are removed."""
        await self.drain.shutdown(timeout_s)

    async def linger_while_requested(self, quiet_s: float = LINGER_QUIET_S, cap_s: float = LINGER_CAP_S) -> None:
        """With a state store, after ``shutdown``: keep the front-ends up, answering UNAVAILABLE
        (whose clients and balancer retry on another replica), while requests still come. A
        balancer sees this replica not ready only at its next health checks, and a request it
        sends to a connection that closes meanwhile fails as CANCELLED (gRPC through HAProxy),
        which no client retries. Returns once no request was refused for ``quiet_s``, or after
        ``cap_s``, or at the exit deadline. Without a store, returns at once."""
        await self.drain.linger_while_requested(quiet_s, cap_s)

    def open_work(self) -> tuple[int, int, list[str]]:
        """(sequences, requests, per-model details) still open: sequences holding a slot (or
        backlogged) and requests not answered for good, over every loaded model version."""
        return self.drain.open_work()

    @property
    def shutdown_deadline(self) -> float | None:
        """When the drain ends (time.monotonic()); None until the shutdown begins."""
        return self.drain.deadline

    @property
    def exiting(self) -> bool:
        """The shutdown has begun (``begin_shutdown``)."""
        return self.drain.exiting

    # ------------------------------------------------------------------- model control

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
        await self.models.load_model(name, config_json=config_json, files=files)

    async def unload_model(self, name: str) -> None:
        """Unload a model: running sequences get up to ``exit_timeout_s`` to finish. The
        in-process API: it works whatever ``model_control`` says (see ``request_unload_model``)."""
        await self.models.unload_model(name)

    def check_model_control(self) -> None:
        """Raise Triton's UNAVAILABLE error unless a load / unload request may proceed now:
        the server is up and ``model_control`` is explicit. The front-ends call it before
        they decode a load request's parameters."""
        self.models.check_model_control()

    async def request_load_model(
        self, name: str, *, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """A load asked for through the model control API (HTTP ``.../load``, gRPC
        ``RepositoryModelLoad``): refused with Triton's UNAVAILABLE error unless
        ``model_control`` is explicit, then as ``load_model``."""
        await self.models.request_load_model(name, config_json=config_json, files=files)

    async def request_unload_model(self, name: str) -> None:
        """An unload asked for through the model control API; see ``request_load_model``."""
        await self.models.request_unload_model(name)

    async def poll_repository(self) -> dict[str, list[str]]:
        """Scan the repository once and apply what changed since the last scan: a new model
        folder loads, a removed one unloads (and leaves the index), a changed one reloads (a
        failed reload keeps the loaded versions serving). A model that failed to load is
        tried again once its folder changes. The scan runs on a worker thread.
        Returns the names of the models {"added": [...], "removed": [...], "modified": [...]}."""
        return await self.models.poll_repository()

    # --------------------------------------------------------------------------- health

    def is_live(self) -> bool:
        return self.drain.live

    def is_ready(self) -> bool:
        """Live, and (with strict_readiness, as Triton's) every model that was asked to load
        is READY: one whose load failed makes the server not ready; unloaded ones do not."""
        if not self.is_live():
            return False
        return not self.strict_readiness or self.models.all_ready()

    def failed_models(self) -> dict[str, str]:
        """Models whose last load failed and that serve no version: name -> reason."""
        return self.models.failed_models()

    def model(self, name: str, version: str | int = "") -> ServedModel:
        """The loaded model version (the highest when version is empty). Once the shutdown has
        begun, a model that is not (or no longer) loaded is UNAVAILABLE (SERVER_STOPPING)."""
        return self.models.model(name, version)

    def is_model_ready(self, name: str, version: str | int = "") -> bool:
        try:
            self.models.model(name, version)
        except InferenceError:
            return False
        return not self.drain.exiting

    # ------------------------------------------------------------------------- metadata

    def metadata(self) -> dict[str, str]:
        """The server's name and version; the front-ends add the protocol extensions they serve."""
        return {"name": self.server_id, "version": __version__}

    def model_metadata(self, name: str, version: str | int = "") -> dict[str, Any]:
        meta = self.models.model(name, version).metadata()
        if version in ("", None):
            meta["versions"] = [str(v) for v in self.models.versions(name)]
        return meta

    def model_config(self, name: str, version: str | int = "") -> mc.ModelConfig:
        return self.models.model(name, version).config

    def model_config_json(self, name: str, version: str | int = "") -> dict[str, Any]:
        return config_to_json(self.model_config(name, version))

    def repository_index(self) -> list[dict[str, str]]:
        return self.models.repository_index()

    def statistics(self, name: str = "", version: str | int = "") -> list[ModelStatistics]:
        """One model version's statistics, every version of one model's (NOT_FOUND when it is
        unknown), or every loaded version's (no name)."""
        return [ModelStatistics.of(m.name, m.version_str, m.statistics()) for m in self.models.select(name, version)]

    def model_counters(self) -> list[ModelCounters]:
        """A snapshot of every loaded model version's counters, for metrics exporters: read at
        once from the counts the core keeps anyway."""
        return [m.counters() for m in self.models.loaded_by_name()]

    # ---------------------------------------------------------------------------- infer

    def enqueue(self, request: InferRequest) -> asyncio.Future[InferResult]:
        """Queue one request now and return its future (so callers keep arrival order).
        Raises InferenceError at once for requests the scheduler refuses.

        Sequence models need ``request.sequence_id`` (uint64 or str; 5 and "5" are different
        sequences) and START on the first request; without an id a new sequence starts under
        a generated id (see ``auto_sequence_ids``; the request is updated with it). Decoupled
        models refuse it (DecoupledModelError): use ``enqueue_streaming``."""
        m, response_parameters = self._route(request)
        if self.tracer is not None:
            request.trace = self.tracer.sample(request, m.name, m.version_str)
        replicas = self.replicas
        if replicas is not None and isinstance(m, LoadedModel) and m.is_sequence:
            return replicas.enqueue(m, request, response_parameters)
        return m.submit(request, response_parameters=response_parameters)

    def enqueue_streaming(
        self, request: InferRequest, on_response: ResponseCallback, *, model: ServedModel | None = None
    ) -> Callable[[], None]:
        """Queue one request now; ``on_response(response, final)`` gets its responses on the
        event loop: an InferResult, an InferenceError, or None (a final flag alone, from
        decoupled models). Most models answer once, with final=True; decoupled models any
        number of times, the last with final=True. Works for every model. Raises
        InferenceError at once for requests the scheduler refuses (no callback then).
        Returns ``cancel()``, to call when the client is gone (models see ``is_cancelled()``).

        ``model``: the request's model version as ``model()`` returned it, for a caller that
        looked it up already (a stream step asks whether it is decoupled first)."""
        m, response_parameters = self._route(request, model)
        if self.tracer is not None:
            request.trace = self.tracer.sample(request, m.name, m.version_str)
        replicas = self.replicas
        if replicas is not None and isinstance(m, LoadedModel) and m.is_sequence:
            return replicas.enqueue_streaming(m, request, response_parameters, on_response)
        return m.submit_streaming(request, on_response, response_parameters=response_parameters)

    def _route(
        self, request: InferRequest, model: ServedModel | None = None
    ) -> tuple[ServedModel, dict[str, Any] | None]:
        """The model version a request goes to; a request to a sequence model that names no
        sequence starts a new one under a generated id when `auto_sequence_ids` is on."""
        m = model if model is not None else self.models.model(request.model, request.version)
        if m.is_sequence and not request.sequence_id and self.auto_sequence_ids:
            request.sequence_id = m.new_sequence_id()
            request.sequence_start = True
            request.session = True  # its end or expiry is remembered, as a named session's
            return m, {"sequence_id": request.sequence_id}
        return m, None

    # The keyword conveniences for embedding applications: each builds one InferRequest from
    # its model, inputs and options (``seqserve.engine.server.keywords.RequestOptions``).

    def submit(
        self, model: str, inputs: Mapping[str, np.ndarray], **options: Unpack[RequestOptions]
    ) -> asyncio.Future[InferResult]:
        """``enqueue`` with the request given as keywords: ``version``, ``sequence_id``,
        ``sequence_start``, ``sequence_end``, ``outputs``, ``request_id``, ``timeout_us``,
        ``priority`` and ``client`` (``RequestOptions``), each defaulting as ``InferRequest``
        does. ``client`` names the caller for session tombstones (engine/sessions.py); callers
        that give none share one key."""
        return self.enqueue(keyword_request("Server.submit", model, inputs, options))

    def submit_streaming(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        on_response: ResponseCallback,
        **options: Unpack[RequestOptions],
    ) -> Callable[[], None]:
        """``enqueue_streaming`` with the request given as keywords."""
        return self.enqueue_streaming(keyword_request("Server.submit_streaming", model, inputs, options), on_response)

    async def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], **options: Unpack[RequestOptions]
    ) -> InferResult:
        """Run one request and wait for its result; see `submit`."""
        return await self.enqueue(keyword_request("Server.infer", model, inputs, options))

    async def stream(
        self, model: str, inputs: Mapping[str, np.ndarray], **options: Unpack[RequestOptions]
    ) -> AsyncIterator[InferResult]:
        """Run one request and yield its responses as they come (one for most models, any
        number for decoupled ones). An error response is raised, which ends the iteration.
        Leaving the iteration early cancels the request (models see ``is_cancelled()``)."""
        request = keyword_request("Server.stream", model, inputs, options)
        queue: asyncio.Queue[tuple[InferResult | InferenceError | None, bool]] = asyncio.Queue()
        cancel = self.enqueue_streaming(request, lambda response, final: queue.put_nowait((response, final)))
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

    # ---------------------------------------------------------------------- sequence API

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

    def sequences(self, model: str, version: str | int = "", *, limit: int = 1000) -> SequenceList:
        """The live sequences of a model version (holding a slot or backlogged): how many, and
        up to ``limit`` of them, the oldest first. INVALID_ARG for a model without sequences."""
        m = self.models.sequence_model(model, version)
        if limit < 0:
            raise InferenceError(Code.INVALID_ARG, f"limit must be >= 0, got {limit}")
        return m.sequences(limit)

    def sequence(self, model: str, sequence_id: SequenceId, version: str | int = "") -> SequenceInfo:
        """One live sequence (5 and "5" are different ids); NOT_FOUND when it is not live."""
        return self.models.sequence_model(model, version).sequence(sequence_id)

    def end_sequence(self, model: str, sequence_id: SequenceId, version: str | int = "") -> EndedSequence:
        """End a live sequence now, as idle expiry ends it (a final END step for
        ``TIMEOUT_COMPLETE`` models; a backlogged one's requests are cancelled). Its next
        session request gets SessionGoneError, its next ``sequence_id`` request without START
        the START error. NOT_FOUND when it is not live."""
        return self.models.sequence_model(model, version).end_sequence(sequence_id)

    def checkpoint_sequence(
        self, model: str, version: str | int, sequence_id: SequenceId, *, release: bool
    ) -> SequenceCheckpoint | None:
        """The live sequence ``sequence_id`` of a model version as it stands between two steps,
        or None when it is not live there. With ``release`` it leaves its slot without an END
        step (it moved; see ``LoadedModel.checkpoint_sequence``). Raises SequenceBusyError
        while it has a request queued or running, CheckpointUnsupportedError for a model that
        keeps its sequences' state itself, INVALID_ARG for a model without sequences, NOT_FOUND
        for a model (version) that is not loaded. See docs/checkpoints.md."""
        return self.models.checkpoint_sequence(model, version, sequence_id, release=release)

    def restore_sequence(self, ckpt: SequenceCheckpoint) -> None:
        """Put a checkpointed sequence into a free slot of its model version (``ckpt.model``,
        ``ckpt.version``, which must be loaded: NOT_FOUND otherwise); its next non-START
        request continues from there. See ``LoadedModel.restore_sequence`` for the refusals."""
        self.models.restore_sequence(ckpt)

    def live_sequences(self) -> list[tuple[str, int, SequenceId, float]]:
        """(model, version, sequence id, idle seconds) of every live sequence holding a slot,
        in every loaded sequence model (backlogged ones are left out: they hold no state yet).
        For drain and idle spill; models without implicit state are included, and refuse a
        checkpoint (CheckpointUnsupportedError): finish those where they run."""
        return self.models.live_sequences()
