"""A loaded ensemble version: served like a model (``submit``, ``submit_streaming``,
metadata, config, statistics), run by handing step requests to its step models' schedulers.

It has no instances, no core scheduler and no sequences of its own: each step request goes
through its step model's ``submit_streaming`` like a client's, so a sequence step holds its
slot, gets START / END and its implicit state as a client's request would. The step models
are looked up at each request (``model_version: -1`` follows reloads).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.counters import ModelCounters
from seqserve.engine.ensemble.plan import EnsemblePlan, Step
from seqserve.engine.ensemble.run import EnsembleRun
from seqserve.engine.errors import Code, DecoupledModelError, InferenceError
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.tensors import wire_dtype_name

if TYPE_CHECKING:
    from seqserve.engine.model import LoadedModel

#: finds a step's model version: (name, version or "" for the highest)
StepLookup = Callable[[str, str], "LoadedModel | EnsembleModel"]


class EnsembleModel:
    """One version of an ensemble. Event loop only."""

    is_sequence = False
    instance_names: tuple[str, ...] = ()

    def __init__(
        self,
        cfg: mc.ModelConfig,
        *,
        version: int,
        model_dir: Path,
        loop: asyncio.AbstractEventLoop,
        lookup: StepLookup,
        decoupled_steps: frozenset[str],
    ) -> None:
        """``cfg``: the checked config (``validate_ensemble_steps`` set its decoupled flag);
        ``decoupled_steps``: the step models that answer any number of times."""
        self.config = cfg
        self.name = cfg.name
        self.version = version
        self.version_str = str(version)
        self.model_dir = model_dir
        self.max_batch_size = cfg.max_batch_size
        self.decoupled = cfg.model_transaction_policy.decoupled
        self.plan = EnsemblePlan(cfg)
        self.output_dims = {t.name: tuple(t.dims) for t in cfg.output}
        self._loop = loop
        self._lookup = lookup
        self._decoupled_steps = decoupled_steps
        self._runs: set[EnsembleRun] = set()
        self._accepting = True
        # max_inflight_requests: step requests in flight per step, and launches waiting for room
        self._inflight = [0] * len(self.plan.steps)
        self._waiting: list[collections.deque[Callable[[], None]]] = [collections.deque() for _ in self.plan.steps]
        self._stats = _Tally()

    # ------------------------------------------------------------------------ request

    def submit(
        self, request: InferRequest, *, response_parameters: dict[str, Any] | None = None
    ) -> asyncio.Future[InferResult]:
        """Run one request through the steps; its future resolves with the ensemble's answer.
        Cancelling the future cancels the steps in flight."""
        if self.decoupled:
            raise DecoupledModelError(self.name)
        fut: asyncio.Future[InferResult] = self._loop.create_future()

        def resolve(response: InferResult | InferenceError | None, final: bool) -> None:
            if fut.done() or not final:
                return
            if isinstance(response, InferenceError):
                fut.set_exception(response)
            elif response is not None:
                fut.set_result(response)

        cancel = self.submit_streaming(request, resolve, response_parameters=response_parameters)
        fut.add_done_callback(lambda f: cancel() if f.cancelled() else None)
        return fut

    def submit_streaming(
        self,
        request: InferRequest,
        on_response: ResponseCallback,
        *,
        response_parameters: dict[str, Any] | None = None,
    ) -> Callable[[], None]:
        """Start one request's steps; its responses go to ``on_response`` (see
        ``LoadedModel.submit_streaming``). Returns ``cancel()``."""
        if not self._accepting:
            raise InferenceError(
                Code.UNAVAILABLE, "Server is stopping, scheduler for model has stopped accepting new inference requests"
            )
        try:
            outputs = self.plan.check(request)
        except InferenceError:
            self._stats.refused += 1
            raise
        trace = request.trace
        if response_parameters or trace is not None:
            answer = on_response

            def on_response(response: InferResult | InferenceError | None, final: bool) -> None:
                if response_parameters and isinstance(response, InferResult):
                    response.parameters.update(response_parameters)
                if final and trace is not None:  # the ensemble's own trace: its steps are not traced apart
                    trace.answered(response)
                answer(response, final)

        if trace is not None:
            trace.ran(batch_size=self.plan.rows(request), instance=-1, slot=-1)

        run = EnsembleRun(self, request, outputs, on_response)
        self._runs.add(run)
        run.start()
        return run.cancel

    # ----------------------------------------------------------------- what runs call

    def step_model(self, step: Step) -> LoadedModel | EnsembleModel:
        return self._lookup(step.model, step.version)

    def step_decoupled(self, step: Step) -> bool:
        return step.model in self._decoupled_steps

    def admit(self, step: Step, launch: Callable[[], None]) -> None:
        """Launch a step request now, or once the step has room (max_inflight_requests)."""
        limit = self.plan.max_inflight
        if limit and self._inflight[step.index] >= limit:
            self._waiting[step.index].append(launch)
            return
        self._inflight[step.index] += 1
        launch()

    def release(self, step: Step) -> None:
        """A step request finished: the next one waiting for its step goes."""
        self._inflight[step.index] -= 1
        waiting = self._waiting[step.index]
        if waiting:
            self._inflight[step.index] += 1
            waiting.popleft()()

    def finished(self, run: EnsembleRun, *, ok: bool) -> None:
        self._runs.discard(run)
        self._stats.record(run.rows, time.monotonic_ns() - run.started_ns, ok=ok)

    # ---------------------------------------------------------------------- reports

    def metadata(self) -> dict[str, Any]:
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            "name": self.name,
            "versions": [self.version_str],
            "platform": "ensemble",
            "inputs": [
                {"name": t.name, "datatype": wire_dtype_name(t.data_type), "shape": [*batch, *t.dims]}
                for t in self.config.input
            ],
            "outputs": [
                {"name": t.name, "datatype": wire_dtype_name(t.data_type), "shape": [*batch, *t.dims]}
                for t in self.config.output
            ],
        }

    def statistics(self) -> dict[str, Any]:
        """Triton's shape: each request is one execution of its batch size; its time from
        arrival to its final answer counts as compute (an ensemble has no queue of its own)."""
        return self._stats.report()

    def counters(self) -> ModelCounters:
        s = self._stats
        return ModelCounters(
            model=self.name,
            version=self.version_str,
            tags=dict(self.config.metric_tags),
            success=s.success,
            failure={"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": s.fail + s.refused},
            inference_count=s.inferences,
            execution_count=s.success + s.fail,
            request_duration_us=s.success_ns // 1000,
            queue_duration_us=0,
            compute_input_duration_us=0,
            compute_infer_duration_us=s.success_ns // 1000,
            compute_output_duration_us=0,
            pending_requests=len(self._runs),
        )

    # ------------------------------------------------------------ what the table asks

    @property
    def inflight_sequences(self) -> int:
        return 0  # the step models hold the sequences

    @property
    def open_responses(self) -> int:
        return len(self._runs)

    @property
    def open_requests(self) -> int:
        return len(self._runs)

    def sequence_slot(self, sequence_id: SequenceId) -> int | None:
        return None

    def slot_sequences(self) -> list[tuple[SequenceId, float]]:
        return []

    def new_sequence_id(self) -> SequenceId:
        raise InferenceError(Code.INVALID_ARG, f"model '{self.name}' is an ensemble: it has no sequences of its own")

    def stop_accepting(self) -> None:
        self._accepting = False

    def close(self, *, force: bool = False, timeout_s: float | None = None) -> list[str]:
        """Nothing of its own runs: the runs left end with their step models."""
        self._accepting = False
        return []


class _Tally:
    """The ensemble's request counts and durations (ns)."""

    def __init__(self) -> None:
        self.success = 0
        self.success_ns = 0
        self.fail = 0
        self.fail_ns = 0
        self.refused = 0  # refused before any step ran
        self.inferences = 0
        self.last_ms = 0
        self.batches: dict[int, list[int]] = {}  # batch size -> [count, ns]

    def record(self, rows: int, ns: int, *, ok: bool) -> None:
        self.last_ms = int(time.time() * 1000)
        if not ok:
            self.fail += 1
            self.fail_ns += ns
            return
        self.success += 1
        self.success_ns += ns
        self.inferences += rows
        entry = self.batches.setdefault(rows, [0, 0])
        entry[0] += 1
        entry[1] += ns

    def report(self) -> dict[str, Any]:
        return {
            "inference_count": self.inferences,
            "execution_count": self.success,
            "last_inference": self.last_ms,
            "success": {"count": self.success, "ns": self.success_ns},
            "fail": {"count": self.fail + self.refused, "ns": self.fail_ns},
            "queue": {"count": self.success, "ns": 0},
            "compute_input": {"count": self.success, "ns": 0},
            "compute_infer": {"count": self.success, "ns": self.success_ns},
            "compute_output": {"count": self.success, "ns": 0},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": {"count": n, "ns": 0},
                    "compute_infer": {"count": n, "ns": ns},
                    "compute_output": {"count": n, "ns": 0},
                }
                for size, (n, ns) in sorted(self.batches.items())
            ],
        }
