"""Models that call models (BLS, "business logic scripting"): a model's ``execute`` sends
requests to other models of the same server and waits for their answers.

A call is an ordinary request: it goes through ``Server.enqueue_streaming`` and the callee's
scheduler like a client's, so a call into a sequence model holds that sequence's slot, its
correlation id and START/END flags flow, and the callee batches it with clients' requests.

Threads: the caller's ``execute`` runs on its instance's executor thread, the callee's
requests are queued on the server's event loop (``loop.call_soon_threadsafe``), and the
caller waits in a queue with the GIL released until the final response (or its timeout).
Blocking the event loop itself would deadlock it, so:

- a model that makes a call is taken off inline execution (``end_inline``) for good at its
  first call; and a blocking call made on the loop's thread (a model that ran inline before
  it ever called) is refused with UNAVAILABLE instead of hanging (the model's next batches
  run on executor threads).
- a model calling itself from its own ``execute`` is refused (INVALID_ARG): its instance
  would wait on a request that needs an instance of itself. A model may call itself through
  another model; a call that would leave every instance of the models involved waiting on one
  another (A's only instance calls B, whose execute calls A) is refused with UNAVAILABLE
  (``bls_waits``).

``ModelCalls`` is the server's; ``ModelCaller`` is one model version's view of it (the
caller's identity travels with every call). Triton-style models reach it through
``pb_utils.InferenceRequest.exec`` (``triton_bls``), batch-level models through
``ctx.infer`` / ``ctx.stream`` (``InstanceContext``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from seqserve.engine.backends.bls_waits import Wait, WaitGraph
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback

#: what a call's responses are: a result, an error, or None (a decoupled callee's bare final flag)
Response = InferResult | InferenceError | None

#: a single-response call to a decoupled model (the batch API's ctx.infer)
ONE_RESPONSE_ONLY = "model '{model}' is decoupled (it may send several responses): call it with ctx.stream"


class CalleeModel(Protocol):
    """What a call needs of the callee (a ``LoadedModel``)."""

    name: str
    version: int
    decoupled: bool
    instance_names: list[str]

    def end_inline(self) -> None: ...


class CallTarget(Protocol):
    """What calls go through (the ``Server``): model lookup and the streaming request path."""

    def model(self, name: str, version: str | int = "") -> Any: ...

    def enqueue_streaming(
        self, request: InferRequest, on_response: ResponseCallback, *, model: Any = None
    ) -> Callable[[], None]: ...


@dataclass(frozen=True, slots=True)
class Caller:
    """The model version whose ``execute`` makes a call."""

    name: str
    version: int


class _Cancel:
    """A call's cancel(), which exists only once the loop has queued the request."""

    __slots__ = ("cancel", "cancelled")

    def __init__(self) -> None:
        self.cancel: Callable[[], None] | None = None
        self.cancelled = False

    def __call__(self) -> None:  # event loop
        self.cancelled = True
        if self.cancel is not None:
            self.cancel()


class ModelCalls:
    """The server's side of calls between models. ``bind`` (at start) names its event loop."""

    def __init__(self, target: CallTarget) -> None:
        self._target = target
        self._loop: asyncio.AbstractEventLoop | None = None
        self._off_inline: set[Caller] = set()  # callers already taken off inline execution
        self._waits = WaitGraph()  # calls in flight from model instances (event loop)
        _bound.add(self)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def caller(self, name: str, version: int) -> ModelCaller:
        return ModelCaller(self, Caller(name, version))

    # ------------------------------------------------------------------------- calls

    def start(
        self, request: InferRequest, caller: Caller | None, sink: ResponseCallback, refuse_decoupled: str = ""
    ) -> Callable[[], None]:
        """Queue ``request`` (any thread); ``sink(response, final)`` gets its responses on the
        event loop, a refusal as one final error. Returns cancel() (any thread).
        ``refuse_decoupled``: a call that wants one response, refused with this message
        (``{model}``: the callee's name) when the callee is decoupled."""
        loop = self._loop
        if loop is None or loop.is_closed():
            sink(InferenceError(Code.UNAVAILABLE, "the server is not running: no model can be called"), True)
            return _nothing
        cancel = _Cancel()
        thread = threading.get_ident()  # the waiting instance, for the circle check
        if self._on_loop_thread(loop):
            self._submit(request, caller, thread, sink, cancel, refuse_decoupled)
            return cancel
        if caller is not None:
            self._leave_inline(caller, loop)
        try:
            loop.call_soon_threadsafe(self._submit, request, caller, thread, sink, cancel, refuse_decoupled)
        except RuntimeError:  # the loop closed meanwhile
            sink(InferenceError(Code.UNAVAILABLE, "the server is stopping: no model can be called"), True)
            return _nothing
        return lambda: _call_soon(loop, cancel)

    def _submit(
        self,
        request: InferRequest,
        caller: Caller | None,
        thread: int,
        sink: ResponseCallback,
        cancel: _Cancel,
        refuse_decoupled: str,
    ) -> None:
        """Event loop: look the callee up, refuse a self-call or a circle of waits, queue the
        request (its wait recorded until its final response)."""
        waiting = 0
        try:
            callee = self._target.model(request.model, request.version)
            if refuse_decoupled and callee.decoupled:
                raise InferenceError(Code.INVALID_ARG, refuse_decoupled.format(model=callee.name))
            if caller is not None:
                waiting = self._check_wait(caller, thread, callee)
            if cancel.cancelled:
                raise InferenceError(Code.CANCELLED, "the call was cancelled before it was queued")
            if waiting:
                sink = functools.partial(self._answered, waiting, sink)
            cancel.cancel = self._target.enqueue_streaming(request, sink, model=callee)
        except InferenceError as e:
            self._waits.done(waiting)
            sink(e, True)
        except Exception as e:  # a bad request the validator did not word: the caller sees it, the loop goes on
            self._waits.done(waiting)
            sink(
                InferenceError(Code.INTERNAL, f"call to model '{request.model}' failed: {type(e).__name__}: {e}"), True
            )

    def _check_wait(self, caller: Caller, thread: int, callee: CalleeModel) -> int:
        """Refuse a call that would deadlock; else record it as a wait (its id)."""
        if callee.name == caller.name and callee.version == caller.version:
            raise InferenceError(
                Code.INVALID_ARG,
                f"model '{caller.name}' called itself from its own execute: refused, since its instance would "
                "wait for a request that needs an instance of the same model (a deadlock); a model may call "
                "itself only through another model",
            )
        try:
            caller_model = self._target.model(caller.name, caller.version)
        except InferenceError:  # unloaded while it runs: its instances are closing, nothing to record
            return 0
        wait = Wait((caller.name, caller.version), thread, (callee.name, callee.version))
        sizes = (len(caller_model.instance_names), len(callee.instance_names))
        circle = self._waits.would_deadlock(wait, *sizes)
        if circle:
            names = ", ".join(f"'{n}'" for n in circle)
            raise InferenceError(
                Code.UNAVAILABLE,
                f"model '{caller.name}' called model '{callee.name}': refused, since every instance of {names} "
                "would wait on calls that need an instance of one of them (a deadlock)",
            )
        return self._waits.add(wait, *sizes)

    def _answered(self, waiting: int, sink: ResponseCallback, response: Response, final: bool) -> None:
        if final:
            self._waits.done(waiting)
        sink(response, final)

    def _on_loop_thread(self, loop: asyncio.AbstractEventLoop) -> bool:
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return False

    def _leave_inline(self, caller: Caller, loop: asyncio.AbstractEventLoop) -> None:
        """A model that calls others blocks in execute: it must never run on the loop."""
        if caller in self._off_inline:
            return
        self._off_inline.add(caller)
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing runs inline any more
            loop.call_soon_threadsafe(self._end_inline, caller)

    def _end_inline(self, caller: Caller) -> None:
        with contextlib.suppress(InferenceError):  # unloaded meanwhile
            self._target.model(caller.name, caller.version).end_inline()

    def refuse_on_loop(self, caller: Caller | None) -> None:
        """Raise when a blocking call would block the event loop (a model running inline)."""
        loop = self._loop
        if loop is None or not self._on_loop_thread(loop):
            return
        if caller is not None and caller not in self._off_inline:
            self._off_inline.add(caller)
            self._end_inline(caller)
        who = f"model '{caller.name}'" if caller is not None else "a model"
        raise InferenceError(
            Code.UNAVAILABLE,
            f"{who} made a blocking call on the server's event loop (it ran inline, before it ever called a model), "
            "which would deadlock the server: refused; its next batches run on executor threads",
        )

    def infer(
        self,
        request: InferRequest,
        caller: Caller | None,
        timeout_s: float | None,
        refuse_decoupled: str = ONE_RESPONSE_ONLY,
    ) -> InferResult:
        """Run one call and wait for its answer (not on the event loop); raises its error, or
        UNAVAILABLE after ``timeout_s``. A decoupled callee is refused (``refuse_decoupled``)."""
        responses = list(self.stream(request, caller, timeout_s, refuse_decoupled))
        for r in responses:
            if r is not None:
                return r
        raise InferenceError(Code.INTERNAL, f"model '{request.model}' sent no response")

    def stream(
        self, request: InferRequest, caller: Caller | None, timeout_s: float | None, refuse_decoupled: str = ""
    ) -> Iterator[InferResult | None]:
        """The responses of one call as they come (blocking, not on the event loop); None for a
        bare final flag. An error response is raised and ends the iteration; leaving the
        iteration early cancels the call."""
        self.refuse_on_loop(caller)
        inbox: queue.SimpleQueue[tuple[Response, bool]] = queue.SimpleQueue()
        cancel = self.start(request, caller, lambda response, final: inbox.put((response, final)), refuse_decoupled)
        return _drain(inbox, cancel, request.model, timeout_s)

    def infer_async(
        self, request: InferRequest, caller: Caller | None, timeout_s: float | None, refuse_decoupled: str = ""
    ) -> asyncio.Future[list[InferResult | None]]:
        """Every response of one call, awaitable on the running loop (any loop: a model's own)."""
        done: concurrent.futures.Future[list[InferResult | None]] = concurrent.futures.Future()
        got: list[InferResult | None] = []

        def sink(response: Response, final: bool) -> None:
            if done.done():
                return
            if isinstance(response, InferenceError):
                done.set_exception(response)
                return
            got.append(response)
            if final:
                done.set_result(got)

        cancel = self.start(request, caller, sink, refuse_decoupled)
        waiting = asyncio.wrap_future(done)
        if timeout_s is None:
            return waiting
        return asyncio.ensure_future(_within(waiting, timeout_s, cancel, request.model))


def _drain(
    inbox: queue.SimpleQueue[tuple[Response, bool]], cancel: Callable[[], None], model: str, timeout_s: float | None
) -> Iterator[InferResult | None]:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    final = False
    try:
        while not final:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                response, final = inbox.get(timeout=wait)  # the GIL is released while it waits
            except queue.Empty:
                raise timed_out(model, timeout_s) from None
            if isinstance(response, InferenceError):
                final = True
                raise response
            yield response
    finally:
        if not final:
            cancel()


async def _within(
    waiting: asyncio.Future[list[InferResult | None]], timeout_s: float, cancel: Callable[[], None], model: str
) -> list[InferResult | None]:
    try:
        return await asyncio.wait_for(waiting, timeout_s)
    except TimeoutError:
        cancel()
        raise timed_out(model, timeout_s) from None


def timed_out(model: str, timeout_s: float | None) -> InferenceError:
    return InferenceError(
        Code.UNAVAILABLE, f"Request timeout expired: model '{model}' did not answer within {timeout_s:g} s"
    )


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is gone: so is the request
        loop.call_soon_threadsafe(fn)


def _nothing() -> None:
    return None


class ModelCaller:
    """One model version's calls (a batch-level model reaches it as ``ctx.infer`` /
    ``ctx.stream``): the caller's identity goes with each call."""

    __slots__ = ("caller", "calls")

    def __init__(self, calls: ModelCalls, caller: Caller) -> None:
        self.calls = calls
        self.caller = caller

    def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] = (),
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> InferResult:
        """Call ``model`` and wait for its result (raises InferenceError on an error)."""
        request = call_request(
            model, inputs, version, sequence_id, sequence_start, sequence_end, outputs, request_id, parameters
        )
        return self.calls.infer(request, self.caller, timeout_s)

    def stream(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] = (),
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Iterator[InferResult]:
        """Call ``model`` (a decoupled one, typically) and yield its responses as they come."""
        request = call_request(
            model, inputs, version, sequence_id, sequence_start, sequence_end, outputs, request_id, parameters
        )
        for r in self.calls.stream(request, self.caller, timeout_s):
            if r is not None:
                yield r


def call_request(
    model: str,
    inputs: Mapping[str, np.ndarray],
    version: str | int,
    sequence_id: SequenceId,
    sequence_start: bool,
    sequence_end: bool,
    outputs: Sequence[str],
    request_id: str,
    parameters: Mapping[str, Any] | None,
) -> InferRequest:
    if not isinstance(model, str) or not model:
        raise InferenceError(Code.INVALID_ARG, "a call needs the name of the model to call")
    return InferRequest(
        model=model,
        inputs={name: np.asarray(value) for name, value in inputs.items()},
        version="" if version in ("", None) or version == -1 else str(version),
        id=request_id,
        sequence_id=sequence_id,
        sequence_start=sequence_start,
        sequence_end=sequence_end,
        outputs=tuple(outputs),
        parameters=dict(parameters or {}),
    )


# ------------------------------------------------------------------ the current caller


class NotExecuting:
    """The current caller while a model initializes or finalizes: it may not call (as in Triton)."""

    __slots__ = ()


#: set around a model's execute (and copied into the tasks of an async execute): who calls
CURRENT: contextvars.ContextVar[ModelCaller | NotExecuting | None] = contextvars.ContextVar(
    "seqserve_bls_caller", default=None
)
#: CURRENT during initialize and finalize
NOT_EXECUTING = NotExecuting()

#: every ModelCalls of this process (a server each), for calls from threads a model started
_bound: weakref.WeakSet[ModelCalls] = weakref.WeakSet()


def current_caller_or_error() -> tuple[ModelCalls, Caller | None]:
    """Who is calling: the model whose execute runs in this context, else (a thread the model
    started itself) the one server of this process, without a caller identity."""
    here = CURRENT.get()
    if isinstance(here, NotExecuting):
        raise InferenceError(Code.UNSUPPORTED, "BLS is only supported during the 'execute' function.")
    if here is not None:
        return here.calls, here.caller
    running = [c for c in list(_bound) if c.loop is not None and not c.loop.is_closed()]
    if len(running) == 1:
        return running[0], None
    raise InferenceError(
        Code.UNSUPPORTED,
        "a model can call other models only from its execute (or a thread of a process that runs one server); "
        "process-isolated models cannot call models",
    )


# ------------------------------------------------------------ pb_utils' exec / async_exec


class TritonExec(Protocol):
    """What runs ``pb_utils.InferenceRequest.exec`` / ``async_exec`` (``triton_bls``, which
    ``triton_adapter`` installs: triton_bls builds on pb_utils, so pb_utils cannot import it)."""

    def execute(self, request: Any, model_name: str, model_version: int, decoupled: bool) -> Any: ...

    def execute_async(self, request: Any, model_name: str, model_version: int, decoupled: bool) -> Any: ...


class TritonExecSlot:
    """Holds the installed ``TritonExec``."""

    __slots__ = ("_runner",)

    def __init__(self) -> None:
        self._runner: TritonExec | None = None

    def install(self, runner: TritonExec) -> None:
        self._runner = runner

    def runner(self) -> TritonExec:
        if self._runner is None:
            raise InferenceError(Code.UNSUPPORTED, "BLS is not available: no server runs this model")
        return self._runner


#: how pb_utils' InferenceRequest.exec runs
TRITON_EXEC = TritonExecSlot()
