"""What the front-ends of a worker process use in place of the engine's ``Server``: inference
requests go to the engine through the rings (``RingClient``); the sync questions the front-ends
ask (readiness, exiting, a model's transaction policy) are answered from the engine's last
``Snapshot``. Every other request never reaches this object: the worker relays it whole to the
engine (api/workers/relay.py), whose own handlers answer it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from seqserve.api.logs import log_control
from seqserve.api.workers import fast_requests
from seqserve.api.workers.channel import Channel
from seqserve.api.workers.fast_requests import FastModel, FastRequest
from seqserve.api.workers.ring_client import OnResponse, RingClient
from seqserve.api.workers.snapshot import ModelEntry, Snapshot
from seqserve.engine import Code, DecoupledModelError, InferenceError, InferRequest, InferResult, SequenceScope
from seqserve.engine.workers import BY_NAME, RING_MAX_BYTES


class RemoteModel:
    """A loaded model version as a worker's front-ends see it (``Server.model``)."""

    __slots__ = ("config", "decoupled", "is_sequence", "model_dir", "name", "target", "version", "version_str")

    def __init__(self, name: str, version: int, entry: ModelEntry) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.decoupled = entry.decoupled
        self.is_sequence = entry.is_sequence
        self.target = entry.target
        self.config = entry.config
        self.model_dir = entry.model_dir

    def sequence_slot(self, sequence_id: Any) -> int:
        return -2  # unknown here (the stall log line then names no backlog)


class _TracingOn:
    """``tracer`` while the engine traces: front-ends only check it for None."""


class RemoteEngine:
    """The Server stand-in of one worker process. Event-loop only."""

    def __init__(self, ring: RingClient, control: Channel, snapshot: Snapshot) -> None:
        self._ring = ring
        self._control = control
        self.snapshot = snapshot
        self._fast_models: dict[int, FastModel | None] = {}  # target -> its fast form (None: slow)
        # (target, sequence id) -> its steps on the slow way not answered yet; handle -> its key
        self._slow_steps: dict[tuple[int, Any], int] = {}
        self._slow_keys: dict[int, tuple[int, Any]] = {}
        self._scopes: dict[SequenceScope, int] = {}
        self._next_scope = 1
        self._exiting_noted = False  # the engine said its shutdown begins (before any snapshot)

    def update(self, snapshot: Snapshot) -> None:
        if snapshot.log != self.snapshot.log:  # the logging extension changed the engine's
            log_control.update(snapshot.log)
        self.snapshot = snapshot
        live = {e.target for versions in snapshot.models.values() for e in versions.values()}
        self._fast_models = {t: m for t, m in self._fast_models.items() if t in live}

    def _fast_model(self, name: str, version: int, target: int) -> FastModel | None:
        """The model version's fast form, built once per target."""
        try:
            return self._fast_models[target]
        except KeyError:
            pass
        entry = self.snapshot.models.get(name, {}).get(version)
        m = fast_requests.fast_model(name, version, entry) if entry is not None and entry.target == target else None
        self._fast_models[target] = m
        return m

    # --------------------------------------------------------------- sync questions

    def note_exiting(self) -> None:
        """The engine's shutdown begins: told before any model is retired, so a refusal that the
        compiled path answers at once is never written before the worker knows."""
        self._exiting_noted = True

    @property
    def exiting(self) -> bool:
        return self._exiting_noted or self.snapshot.exiting

    @property
    def tracer(self) -> object | None:
        return _TRACING_ON if self.snapshot.tracing else None

    def is_live(self) -> bool:
        return True

    def is_ready(self) -> bool:
        return self.snapshot.ready and not self.exiting

    def model(self, name: str, version: str | int = "") -> RemoteModel:
        """As ``Server.model``: the loaded version (the highest for ""), or its refusal."""
        versions = self.snapshot.models.get(name)
        if not versions:
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if version in ("", None, -1, "-1"):
            v = max(versions)
            return RemoteModel(name, v, versions[v])
        try:
            v = int(version)
        except (TypeError, ValueError):
            raise InferenceError(Code.INVALID_ARG, f"failed to parse version '{version}' for model '{name}'") from None
        entry = versions.get(v)
        if entry is None:
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{name}' version {v} is not found")
        return RemoteModel(name, v, entry)

    def model_metadata(self, name: str, version: str | int = "") -> dict[str, Any]:
        """As ``Server.model_metadata``, from the snapshot (the generate routes decode with it)."""
        m = self.model(name, version)
        meta = dict(self.snapshot.models[name][m.version].metadata)
        if version in ("", None):
            meta["versions"] = [str(v) for v in sorted(self.snapshot.models[name])]
        return meta

    def model_config(self, name: str, version: str | int = "") -> Any:
        return self.model(name, version).config

    def session_sequence_id(self, model: str, version: str | int, session: str) -> str:
        """The session id itself: the engine maps it to the model's id type (RequestMeta.session_name)."""
        return session

    # ------------------------------------------------------------------------- infer

    def _target(self, request: InferRequest) -> tuple[int, RemoteModel | None]:
        try:
            m = self.model(request.model, request.version)
        except InferenceError:
            return BY_NAME, None  # the engine answers the refusal (it may be draining, say)
        return m.target, m

    def enqueue(self, request: InferRequest) -> asyncio.Future[InferResult]:
        """As ``Server.enqueue``: a future of the one result; cancelling it cancels the request."""
        target, m = self._target(request)
        if m is not None and m.decoupled:
            raise DecoupledModelError(request.model)
        fut: asyncio.Future[InferResult] = asyncio.get_running_loop().create_future()

        def settle(response: InferResult | InferenceError | None, final: bool) -> None:
            if fut.done() or (not final and response is None):
                return
            if isinstance(response, InferenceError):
                fut.set_exception(response)
            elif isinstance(response, InferResult):
                fut.set_result(response)

        handle = self._submit(request, settle, target, m)
        fut.add_done_callback(lambda f: self._cancel(handle) if f.cancelled() else None)
        return fut

    def enqueue_streaming(
        self, request: InferRequest, on_response: OnResponse, *, model: Any = None
    ) -> Callable[[], None]:
        """As ``Server.enqueue_streaming``: returns ``cancel()``."""
        m: RemoteModel | None
        if isinstance(model, RemoteModel):
            target, m = model.target, model
        else:
            target, m = self._target(request)
        handle = self._submit(request, on_response, target, m)
        return lambda: self._cancel(handle)

    def _cancel(self, handle: int) -> None:
        self._slow_step_done(handle)
        self._ring.cancel(handle)

    def _submit(self, request: InferRequest, on_response: OnResponse, target: int, m: RemoteModel | None) -> int:
        session_name = request.sequence_id if request.session and isinstance(request.sequence_id, str) else None
        fast = self._fast_model(m.name, m.version, target) if m is not None else None
        key = (target, request.sequence_id)
        if (
            fast is not None
            and key not in self._slow_steps
            and request.scope is None
            and not self.snapshot.tracing
            and not self.snapshot.log.get("log_verbose_level")  # the engine logs each request
            and fast_requests.takes(request, session_name, 0, is_sequence=fast.is_sequence)
        ):
            checked = fast_requests.check(fast, request)
            # larger inputs would never find slab blocks: the slow way sends them whole
            if checked is not None and sum(b.nbytes for b in checked.buffers) <= RING_MAX_BYTES:
                return self._ring.submit_fast(FastRequest(fast, checked), on_response)
        scope = 0
        if request.scope is not None:
            scope = self._scope_of(request.scope)
        if fast is None or not fast.is_sequence:  # no sequence whose steps could overtake it
            return self._ring.submit(request, on_response, target, session_name, scope)
        # A step of a fast model's sequence going the slow way: the sequence's next steps follow
        # it until it is answered (the compiled path would submit them first, out of order).
        self._slow_steps[key] = self._slow_steps.get(key, 0) + 1
        handle = 0

        def answered(response: InferResult | InferenceError | None, final: bool) -> None:
            if final:
                self._slow_step_done(handle)
            on_response(response, final)

        handle = self._ring.submit(request, answered, target, session_name, scope)
        self._slow_keys[handle] = key
        return handle

    def _slow_step_done(self, handle: int) -> None:
        key = self._slow_keys.pop(handle, None)
        if key is not None:
            n = self._slow_steps.pop(key) - 1
            if n:
                self._slow_steps[key] = n

    def _scope_of(self, scope: SequenceScope) -> int:
        """A stream's scope by number: the engine keeps the real one. Closing the worker's scope
        (the stream ended) closes the engine's, through the stand-in the scope holds."""
        number = self._scopes.get(scope)
        if number is None:
            number = self._scopes[scope] = self._next_scope
            self._next_scope += 1
            scope.started(_ScopeCloser(self, scope, number), 0, 0)
        return number

    def close_scope(self, scope: SequenceScope, number: int, reason: str) -> None:
        self._scopes.pop(scope, None)
        self._control.send(("scope_close", number, reason))


class _ScopeCloser:
    """Held by a worker's ``SequenceScope`` as if it were a sequence: its ``close`` calls this,
    which tells the engine to close the scope it keeps under that number."""

    __slots__ = ("_engine", "_number", "_scope")

    def __init__(self, engine: RemoteEngine, scope: SequenceScope, number: int) -> None:
        self._engine = engine
        self._scope = scope
        self._number = number

    def __hash__(self) -> int:
        return hash(self._number)

    def end_owned_sequence(self, sequence_id: Any, owner: int, reason: str, /) -> bool:
        self._engine.close_scope(self._scope, self._number, reason)
        return False  # the engine counts the sequences it ends


_TRACING_ON = _TracingOn()
