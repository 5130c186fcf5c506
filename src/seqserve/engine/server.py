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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqserve import __version__
from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends import find_backend
from seqserve.engine.config import config_to_json, finish_model_config, parse_config_json, parse_model_config
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.isolation.settings import check_mode
from seqserve.engine.model import LoadedModel
from seqserve.engine.repository import available_versions, discover_models, select_versions, write_override_files
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback

log = logging.getLogger("seqserve.server")

#: a default model file that names the backend of a model whose config names none
_BACKEND_BY_FILE = {"model.onnx": "onnxruntime"}


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

    #: the extensions the front-ends implement; they may narrow it to what they serve
    extensions: tuple[str, ...] = (
        "sequence",
        "sequence(string_id)",
        "model_configuration",
        "statistics",
        "model_repository",
        "parameters",
    )

    def __init__(
        self,
        model_repository: str | Path,
        *,
        exit_timeout_s: float = 30.0,
        auto_sequence_ids: bool = True,
        python_isolation: str = "thread",
    ) -> None:
        """auto_sequence_ids: a request to a sequence model that names no sequence starts a new
        one with a server-generated id (returned as the `sequence_id` response parameter).
        False gives Triton's strict behaviour: such a request is an error.

        python_isolation: where Python models' instances run unless their config says
        (parameter `isolation`): "thread" (in this process) or "process" (one child process
        per instance; see docs/isolation.md)."""
        self.python_isolation = check_mode(python_isolation, "python_isolation")
        self.repository = Path(model_repository)
        self.exit_timeout_s = exit_timeout_s
        self.auto_sequence_ids = auto_sequence_ids
        self._models: dict[str, ModelState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live = False
        self._exiting = False

    # ------------------------------------------------------------------------ lifecycle

    async def start(self, models: Sequence[str] | None = None) -> None:
        """Load every model of the repository (or only `models`). A model that fails to
        load is reported with its reason and does not stop the others."""
        self._loop = asyncio.get_running_loop()
        if not self.repository.is_dir():
            raise InferenceError(Code.INVALID_ARG, f"model repository '{self.repository}' is not a directory")
        names = models if models is not None else [p.name for p in discover_models(self.repository)]
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
            _autocomplete(cfg, path)
            finish_model_config(cfg, path)
            for v in select_versions(path, cfg):
                versions[v] = LoadedModel(
                    cfg, version=v, model_dir=path, loop=loop, python_isolation=self.python_isolation
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
        Triton's load API, and then needs config_json."""
        if "/" in name or name in ("", ".", ".."):
            raise InferenceError(Code.INVALID_ARG, f"invalid model name '{name}'")
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        path = self.repository / name
        if files:
            if config_json is None:
                raise InferenceError(
                    Code.INVALID_ARG, f"failed to load '{name}': model files were given without a 'config'"
                )
            path = write_override_files(name, files)
        old = self._models.get(name)
        state = self._load_sync(name, loop, path, config_json)
        if state.state != "READY":
            # A failed reload keeps the previous versions serving (as Triton does); a name that
            # is not in the repository leaves no trace.
            if old is not None and old.versions:
                old.reason = state.reason
            elif path.is_dir() or old is not None:
                self._models[name] = state
            raise InferenceError(Code.INVALID_ARG, f"load failed for model '{name}': {state.reason}")
        self._models[name] = state
        if old is not None:
            await self._retire(old)

    async def unload_model(self, name: str) -> None:
        state = self._models.get(name)
        if state is None:
            raise InferenceError(Code.INVALID_ARG, f"failed to unload '{name}', model is not loaded")
        state.state = "UNLOADING"
        await self._retire(state)
        state.versions = {}
        state.state = "UNAVAILABLE"
        state.reason = "unloaded"

    async def _retire(self, state: ModelState, timeout_s: float | None = None) -> None:
        """Let running sequences finish (bounded), then stop the model."""
        models = list(state.versions.values())
        for m in models:
            m.stop_accepting()
        deadline = time.monotonic() + (self.exit_timeout_s if timeout_s is None else timeout_s)
        # running sequences, and requests whose responses are still streaming
        while any(m.inflight_sequences or m.open_responses for m in models) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        forced = any(m.inflight_sequences for m in models)
        for m in models:
            await asyncio.to_thread(m.close, force=forced)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """Orderly stop: new STARTs get UNAVAILABLE, running sequences finish within the bound."""
        self._exiting = True
        self._live = False
        timeout = self.exit_timeout_s if timeout_s is None else timeout_s
        states = [s for s in self._models.values() if s.versions]
        for s in states:
            for m in s.versions.values():
                m.stop_accepting()
        await asyncio.gather(*(self._retire(s, timeout) for s in states))
        if any(m.pending_requests for s in states for m in s.versions.values()):
            log.warning("Exit timeout expired. Exiting immediately.")
        for s in states:
            s.versions = {}
            s.state = "UNAVAILABLE"
            s.reason = "server is shut down"

    # --------------------------------------------------------------------------- health

    def is_live(self) -> bool:
        return self._live and not self._exiting

    def is_ready(self) -> bool:
        return self.is_live() and all(s.state == "READY" for s in self._models.values() if s.versions)

    def model(self, name: str, version: str | int = "") -> LoadedModel:
        """The loaded model version (the highest when version is empty)."""
        state = self._models.get(name)
        if state is None or not state.versions:
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

    def metadata(self) -> dict[str, Any]:
        return {"name": "seqserve", "version": __version__, "extensions": list(self.extensions)}

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
        known = {p.name for p in discover_models(self.repository)} | set(self._models)
        for name in sorted(known):
            state = self._models.get(name)
            if state is None:
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
            return m, {"sequence_id": request.sequence_id}
        return m, None

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


def _version_str(version: str | int | None) -> str:
    return "" if version in ("", None, -1, "-1") else str(version)
