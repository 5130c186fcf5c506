"""One request to an ensemble, from its inputs to its last response (event loop only).

Tensors are kept by (ensemble tensor, iteration). The request's inputs are iteration 0; a
step's outputs keep its inputs' iteration, except a decoupled step's: each of its responses
opens a new iteration, so every step downstream runs once per response (Triton's rule; the
config check guarantees that a step's inputs all come from the same decoupled step, hence
the same iteration). A step starts as soon as all its inputs of one iteration are there,
through the step model's own scheduler (``submit_streaming``), with the request's sequence
id, START / END, session, priority and timeout. The ensemble answers once per iteration that
holds every requested output, and its final answer follows the last step's.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.ensemble.plan import EnsemblePlan, Step
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import InferRequest
from seqserve.engine.responses import InferResult, ResponseCallback


class StepTarget(Protocol):
    """What a run needs of a step's model version (``LoadedModel``, or a nested ensemble)."""

    @property
    def max_batch_size(self) -> int: ...
    @property
    def config(self) -> mc.ModelConfig: ...

    def submit_streaming(
        self, request: InferRequest, on_response: ResponseCallback, *, response_parameters: dict[str, Any] | None = ...
    ) -> Callable[[], None]: ...


class RunHost(Protocol):
    """What a run needs of its ensemble (``EnsembleModel``)."""

    @property
    def name(self) -> str: ...
    @property
    def version_str(self) -> str: ...
    @property
    def decoupled(self) -> bool: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def plan(self) -> EnsemblePlan: ...
    @property
    def output_dims(self) -> Mapping[str, tuple[int, ...]]: ...

    def step_model(self, step: Step) -> StepTarget: ...
    def step_decoupled(self, step: Step) -> bool: ...
    def admit(self, step: Step, launch: Callable[[], None]) -> None: ...
    def release(self, step: Step) -> None: ...
    def finished(self, run: EnsembleRun, *, ok: bool) -> None: ...


class EnsembleRun:
    """The steps of one ensemble request in flight, and what they produced so far."""

    def __init__(
        self, ensemble: RunHost, request: InferRequest, outputs: tuple[str, ...], on_response: ResponseCallback
    ) -> None:
        self.ensemble = ensemble
        self.request = request
        self.rows = ensemble.plan.rows(request)
        self.started_ns = time.monotonic_ns()
        self._outputs = outputs
        self._on_response = on_response
        #: (tensor, iteration) -> (value, its batch size: 0 when it comes from a model that does not batch)
        self._values: dict[tuple[str, int], tuple[np.ndarray, int]] = {}
        self._launched: set[tuple[int, int]] = set()
        self._answered: set[int] = set()
        self._iterations = itertools.count(1)
        self._cancels: dict[int, Callable[[], None]] = {}  # step request number -> its cancel()
        self._numbers = itertools.count()
        self._inflight = 0  # step requests submitted or waiting for room, not yet finished
        self._error: InferenceError | None = None
        self._responses = 0
        self.done = False
        self.cancelled = False

    # ------------------------------------------------------------------------- start

    def start(self) -> None:
        batch = self.rows if self.ensemble.max_batch_size > 0 else 0
        for name, arr in self.request.inputs.items():
            self._put(name, 0, arr, batch)
        self._settle()

    def cancel(self) -> None:
        """The client is gone: its running steps are cancelled, nothing more starts."""
        if self.done or self.cancelled:
            return
        self.cancelled = True
        self._fail(InferenceError(Code.CANCELLED, "request cancelled"))
        for cancel in list(self._cancels.values()):
            cancel()
        self._settle()

    # ------------------------------------------------------------------ tensors, steps

    def _put(self, tensor: str, iteration: int, value: np.ndarray, batch: int) -> None:
        self._values[(tensor, iteration)] = (value, batch)
        for step in self.ensemble.plan.consumers.get(tensor, ()):
            if (step.index, iteration) in self._launched:
                continue
            if all((t, iteration) in self._values for _, t in step.inputs):
                self._launched.add((step.index, iteration))
                self._inflight += 1
                self.ensemble.admit(step, functools.partial(self._launch, step, iteration))
        if tensor in self._outputs:
            self._maybe_answer(iteration)

    def _launch(self, step: Step, iteration: int) -> None:
        """Submit one step request (called at once, or when the step has room again)."""
        if self._error is not None:  # failed or cancelled while this launch waited for room
            self._step_done(step)
            self._settle()
            return
        number = next(self._numbers)
        r = self.request
        try:
            model = self.ensemble.step_model(step)
        except InferenceError as e:
            self._step_done(step)
            self._fail(e)
            self._settle()
            return
        batching = model.max_batch_size > 0
        dims = {t.name: tuple(t.dims) for t in model.config.input}
        inputs = {}
        for key, tensor in step.inputs:
            value, batch = self._values[(tensor, iteration)]
            inputs[key] = fit_batching(value, batch, dims.get(key, ()), batching)
        step_request = InferRequest(
            model=step.model,
            version=step.version,
            inputs=inputs,
            id=r.id,
            sequence_id=r.sequence_id,
            sequence_start=r.sequence_start,
            sequence_end=r.sequence_end,
            outputs=tuple(key for key, _ in step.outputs),
            priority=r.priority,
            timeout_us=r.timeout_us,
            parameters=dict(r.parameters),
            session=r.session,
            client=r.client,
            scope=r.scope,
        )
        out_batch = _rows(inputs) if batching else 0
        try:
            self._cancels[number] = model.submit_streaming(
                step_request, lambda response, final: self._on_step(step, iteration, number, out_batch, response, final)
            )
        except InferenceError as e:
            self._step_done(step)
            self._fail(e)
            self._settle()

    def _on_step(
        self,
        step: Step,
        iteration: int,
        number: int,
        out_batch: int,
        response: InferResult | InferenceError | None,
        final: bool,
    ) -> None:
        if isinstance(response, InferenceError):
            self._fail(response)
        elif response is not None and self._error is None:
            target = next(self._iterations) if self.ensemble.step_decoupled(step) else iteration
            for key, tensor in step.outputs:
                value = response.outputs.get(key)
                if value is not None:
                    self._put(tensor, target, value, out_batch)
        if final:
            self._cancels.pop(number, None)
            self._step_done(step)
            self._settle()

    def _step_done(self, step: Step) -> None:
        self._inflight -= 1
        self.ensemble.release(step)

    # ----------------------------------------------------------------------- answers

    def _maybe_answer(self, iteration: int) -> None:
        if self._error is not None or iteration in self._answered:
            return
        if not all((o, iteration) in self._values for o in self._outputs):
            return
        self._answered.add(iteration)
        ensemble = self.ensemble
        outputs = {}
        for o in self._outputs:
            value, batch = self._values[(o, iteration)]
            outputs[o] = fit_batching(value, batch, ensemble.output_dims[o], ensemble.max_batch_size > 0)
        result = InferResult(
            model_name=ensemble.name, model_version=ensemble.version_str, id=self.request.id, outputs=outputs
        )
        self._responses += 1
        if self.ensemble.decoupled:
            self._on_response(result, False)
        else:
            self._pending_result = result

    def _fail(self, error: InferenceError) -> None:
        if self._error is None:
            self._error = InferenceError(error.code, f"in ensemble '{self.ensemble.name}', {error.message}")

    def _settle(self) -> None:
        """Once no step is left in flight: the final answer (Triton waits for every step)."""
        if self.done or self._inflight > 0:
            return
        self.done = True
        self.ensemble.finished(self, ok=self._error is None)
        if self._error is not None:
            self._on_response(self._error, True)
        elif self.ensemble.decoupled:
            self._on_response(None, True)
        elif self._responses:
            self._on_response(self._pending_result, True)
        else:
            self._on_response(
                InferenceError(
                    Code.INVALID_ARG,
                    f"in ensemble '{self.ensemble.name}', [request id: {self.request.id or '<id_unknown>'}] "
                    "unexpected deadlock, at least one output is not set while no more ensemble steps can be made",
                ),
                True,
            )

    _pending_result: InferResult


def fit_batching(value: np.ndarray, batch: int, dims: tuple[int, ...], batching: bool) -> np.ndarray:
    """A tensor made by (or for) a model that batches handed to one that does not, or the
    other way (Triton's rule): a tensor without a batch dimension whose shape is the
    batching model's dims gets a batch of 1; a batch of 1 whose shape is not the
    non-batching model's dims loses its batch dimension. Otherwise it goes as it is."""
    if batching == (batch != 0):
        return value
    shape = np.shape(value)
    if batching:
        return value.reshape((1, *shape)) if _dims_match(dims, shape) else value
    if batch == 1 and not _dims_match(dims, shape):
        return value.reshape(shape[1:])
    return value


def _dims_match(dims: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape, strict=True))


def _rows(inputs: dict[str, np.ndarray]) -> int:
    for value in inputs.values():
        shape = np.shape(value)
        if shape:
            return int(shape[0])
    return 1
