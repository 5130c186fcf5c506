"""One loaded model version: its backend instances, its core scheduler, and the path of a
request through them.

``submit`` (event loop): validate against the config (``CheckedRequest``: the request laid
out for the core), hand its header and buffers to the core, return a future (or take a
callback, for streaming). The core calls ``_run`` with the GIL held, once per batch: on the
instance's executor thread, or inline on the event loop (``InlineExecution``; see
docs/architecture.md, "Inline execution"). ``_run`` goes in phases: build the batch, execute
it, scatter its outputs into replies, finish (replies go back through ``Delivery``, those of
ring requests through model/rings.py). A cancelled request leaves the queues before it runs.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import Batch, Code, InlineStats, Refusal, RingFeeder, Scheduler
from seqserve.engine.backends import find_backend
from seqserve.engine.backends.base import ragged_inputs
from seqserve.engine.backends.bls import ModelCalls
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.counters import ModelCounters
from seqserve.engine.errors import DecoupledModelError, InferenceError
from seqserve.engine.isolation import IsolatedBackend
from seqserve.engine.model.batch_build import batch_traces, build_batch, stamp
from seqserve.engine.model.checkpoints import SequenceCheckpoints
from seqserve.engine.model.delivery import Delivery, Pending, Reply
from seqserve.engine.model.devices import host_outputs
from seqserve.engine.model.execution import DEFAULT_INLINE_MAX_BATCH_US, execution_settings
from seqserve.engine.model.failures import FailureReport
from seqserve.engine.model.inline import InlineExecution, inline_eligible
from seqserve.engine.model.instances import start_instances
from seqserve.engine.model.iterations import check_iterative, iterations_of
from seqserve.engine.model.reports import ModelReports
from seqserve.engine.model.request_log import RequestLog
from seqserve.engine.model.ring_runner import RingOnlyRunner
from seqserve.engine.model.rings import RingBatch, RingRows, attach_rings
from seqserve.engine.model.sequence_views import SequenceViews, expiry_log
from seqserve.engine.model.spec import build_core_spec
from seqserve.engine.model.validation import RequestValidator, fresh_sequence_id
from seqserve.engine.model.watchdog import ExecuteWatchdog
from seqserve.engine.replicas.checkpoint import SequenceCheckpoint, SequenceReleasedError
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.sessions import EndedSequence, SequenceInfo, SequenceList, SessionGoneError, SessionPolicy
from seqserve.engine.tracing import COMPUTE_END, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, QUEUE_START

log = logging.getLogger("seqserve.model")

_handles = itertools.count(1)

#: what a client refused by admission control is told to wait before it tries again (Retry-After)
BACKLOG_RETRY_AFTER_S = 1.0
#: the server's default bound on backlogged sequences per model (--max-backlog-sequences)
DEFAULT_MAX_BACKLOG_SEQUENCES = 1024


class RequestFuture(asyncio.Future[InferResult]):
    """A single-response request's future. Cancelling it (the caller went away) also takes the
    request out of the core's queues."""

    # Its core names, not its Pending (a cycle through this future). Set by submit (hot path).
    __slots__ = ("_handle", "_model", "_token")
    _model: LoadedModel
    _handle: int
    _token: int

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        if self._token >= 0:  # the model sees is_cancelled() through this future
            self._model.cancel_queued(self._token, self._handle)
        return True


class LoadedModel:
    """A model version ready to serve: scheduler started, instances initialized. A façade
    over the parts it owns: the backend and its instances, the validator (a request laid out
    for the core), the core scheduler, the delivery of replies, and the views that read them
    (reports, the sequence API, checkpoints)."""

    def __init__(
        self,
        cfg: mc.ModelConfig,
        *,
        version: int,
        model_dir: Path,
        loop: asyncio.AbstractEventLoop,
        sessions: SessionPolicy | None = None,
        python_isolation: str = "thread",
        max_backlog_sequences: int = DEFAULT_MAX_BACKLOG_SEQUENCES,
        inline_max_batch_us: int = DEFAULT_INLINE_MAX_BATCH_US,
        kind_gpu_on_cpu: bool = False,
        calls: ModelCalls | None = None,
    ) -> None:
        """``max_backlog_sequences``: the server's bound on backlogged sequences (0: none), for
        a sequence model whose config sets none (``sequence_batching.max_backlog_sequences``).
        ``inline_max_batch_us``: the server's bound of inline execution (0: never), for a
        model whose config sets none (parameter ``inline_max_batch_us``). ``calls``: the
        server's calls between models (BLS)."""
        self.config = cfg
        self.name = cfg.name
        self.version = version
        self.version_str = str(version)
        self.model_dir = model_dir
        self.max_batch_size = cfg.max_batch_size
        self.is_sequence = cfg.HasField("sequence_batching")
        self.decoupled = cfg.model_transaction_policy.decoupled
        self._loop = loop
        self._pending: dict[int, Pending] = {}
        self._rejected = 0  # refused by the core as UNAVAILABLE (queue full, stopping)
        # instance index -> the requests of the batch it is running (executor threads, GIL held)
        self._running: dict[int, list[Pending | None]] = {}
        self._close_lock = threading.Lock()
        self._closed = False
        self._has_ragged = bool(ragged_inputs(cfg))
        self._traced = False  # a traced request was queued: batches look for traces (engine/tracing.py)
        self._ring: RingRows | None = None  # requests from the workers' rings on the compiled path
        self._ring_only: RingOnlyRunner | None = None  # its batches of ring rows only

        backend_cls = find_backend(cfg)
        backend_cls.check(cfg)
        python_backend = "python" in backend_cls.names
        execution = execution_settings(
            cfg,
            python_backend=python_backend,
            default=python_isolation,
            inline_max_batch_us=inline_max_batch_us,
            kind_gpu_on_cpu=kind_gpu_on_cpu,
        )
        check_iterative(cfg, process=execution.process)
        started = start_instances(
            cfg, version=version, model_dir=model_dir, backend=backend_cls, execution=execution, calls=calls
        )
        self.backend = started.backend
        self._instances = started.instances
        self.instance_names = started.names
        self._devices = started.devices

        spec = build_core_spec(
            cfg, model_dir, len(self._instances), sessions, max_backlog_sequences=max_backlog_sequences
        )
        self.strategy_name = spec.strategy_name
        self._spec = spec
        self._devices.attach_states(spec.scheduler)
        self._validator = RequestValidator(cfg, spec)
        self._delivery = Delivery(cfg, self.version_str, loop, preserve_ordering=spec.preserve_ordering)
        self._failures = FailureReport(self.name, self.version_str, is_sequence=self.is_sequence)
        self._request_log = RequestLog(
            self.name, self.version_str, is_sequence=self.is_sequence, strategy=spec.strategy_name
        )
        self._watchdog = (  # isolated instances time out on their own
            ExecuteWatchdog(self.name, self.instance_names, execution.execute_timeout_s, self._delivery.batch_failed)
            if execution.execute_timeout_s and not execution.process
            else None
        )
        self._core = Scheduler(
            spec.scheduler,
            runner=self._run,
            on_fail=self._on_fail,
            on_warning=lambda msg: log.warning("%s", msg),
            on_expire=expiry_log(cfg, version),
        )
        eligible = inline_eligible(
            python_backend=python_backend,
            process=execution.process,
            decoupled=self.decoupled,
            watchdog=self._watchdog is not None,
            max_batch_us=execution.inline_max_batch_us,
        )
        self._inline = InlineExecution(self._core, loop, execution.inline_max_batch_us) if eligible else None
        self._iterations = iterations_of(cfg, self._core, self._pending, self._delivery, _handles.__next__)
        self._reports = ModelReports(
            cfg, self.version_str, core=self._core, spec=spec, validator=self._validator, delivery=self._delivery
        )
        core, seq = self._core, self.is_sequence
        self._views = SequenceViews(
            self.name, version, is_sequence=seq, core=core, spec=spec, instance_names=self.instance_names
        )
        self._checkpoints = SequenceCheckpoints(self.name, version, is_sequence=seq, core=core, spec=spec)
        self._core.start()

    def serve_rings(self, feeder: RingFeeder, target: int, *, fast: bool = True) -> bool:
        """Serve the workers' rings as ``target``; True: on the compiled path (see model/rings.py)."""
        per_request = any(i.uses_responders for i in self._instances) or self._watchdog is not None
        self._ring = ring = attach_rings(self.config, self._core, feeder, target, fast=fast, per_request=per_request)
        self._reports.ring = ring
        if ring is not None and self._iterations is None and not self._devices.holds_state:
            self._ring_only = RingOnlyRunner(ring, [i.execute for i in self._instances], self._spec, self._batch_failed)
        return ring is not None

    # ------------------------------------------------------------------ sequence API

    @property
    def inflight_sequences(self) -> int:
        return self._core.inflight_sequences()

    @property
    def open_responses(self) -> int:
        """Requests a responder may still answer (no final response yet)."""
        return self._delivery.open_responses

    @property
    def pending_requests(self) -> int:
        return self._core.pending_requests()

    @property
    def open_requests(self) -> int:
        """Requests submitted and not answered for good: queued, running, or awaiting a final response."""
        running = [r for recs in list(self._running.values()) for r in recs if r is not None]
        return len(self._pending) + len(running) + self._delivery.open_responses_besides(running)

    def sequence_slot(self, sequence_id: SequenceId) -> int | None:
        """Where a live sequence is: its global slot, -1 while it waits in the backlog; None when
        it is not live."""
        slot = self._core.slot_of(sequence_id)
        return None if slot == -2 else slot

    def end_owned_sequence(self, sequence_id: SequenceId, owner: int = 0, reason: str = "") -> bool:
        """End a live sequence now, as idle expiry does: its slot is freed (after one final END
        step under TIMEOUT_COMPLETE), its queued requests are answered CANCELLED with ``reason``
        after the sequence's name. ``owner``: only if its latest START was that request handle.
        False when it is not live (ended, expired, or someone else's)."""
        why = f"sequence {sequence_id} of model '{self.name}' was ended: {reason}" if reason else ""
        return self._core.end_owned_sequence(sequence_id, owner, why)

    def sequences(self, limit: int) -> SequenceList:
        return self._views.sequences(limit)

    def sequence(self, sequence_id: SequenceId) -> SequenceInfo:
        return self._views.sequence(sequence_id)

    def end_sequence(self, sequence_id: SequenceId) -> EndedSequence:
        return self._views.end_sequence(sequence_id)

    def slot_sequences(self) -> list[tuple[SequenceId, float]]:
        return self._checkpoints.slot_sequences()

    def checkpoint_sequence(self, sequence_id: SequenceId, *, release: bool) -> SequenceCheckpoint | None:
        self._refuse_device_checkpoints()
        return self._checkpoints.checkpoint_sequence(sequence_id, release=release)

    def restore_sequence(self, ckpt: SequenceCheckpoint) -> None:
        self._refuse_device_checkpoints()
        self._checkpoints.restore_sequence(ckpt)

    def _refuse_device_checkpoints(self) -> None:
        if self._devices.holds_state:
            raise InferenceError(
                Code.UNSUPPORTED,
                f"model '{self.name}' keeps its implicit state on the GPU: checkpoints (state handoff, sequence "
                "export) of GPU instances are not supported yet",
            )

    # ------------------------------------------------------------------------- reports

    def metadata(self) -> dict[str, Any]:
        return self._reports.metadata()

    def statistics(self) -> dict[str, Any]:
        return self._reports.statistics()

    def counters(self) -> ModelCounters:
        return self._reports.counters(rejected_here=self._rejected)

    def scheduler_state(self) -> dict[str, Any]:
        """Live view of the slot table, for diagnostics."""
        return self._reports.scheduler_state()

    @property
    def inline_stats(self) -> InlineStats:
        """Inline execution: its bound (0: never inline), whether it is on now, and how many
        batches ran inline and on executor threads (docs/architecture.md, "Inline execution")."""
        return self._reports.inline_stats()

    def end_inline(self) -> None:
        """Event loop: never run inline again (it calls models: engine/backends/bls.py)."""
        if self._inline is not None:
            self._inline = None
            self._core.configure_inline(0)

    # ------------------------------------------------------------------------- request

    def submit(
        self, request: InferRequest, *, response_parameters: dict[str, Any] | None = None
    ) -> asyncio.Future[InferResult]:
        """Validate and queue one request; the future resolves on this model's event loop.
        Decoupled models refuse it (DecoupledModelError): use ``submit_streaming``."""
        if self.decoupled:
            raise DecoupledModelError(self.name)
        fut = RequestFuture(loop=self._loop)
        rec = self._queue(request, response_parameters, fut, None)
        fut._model = self
        fut._handle = rec.handle
        fut._token = rec.token
        return fut

    def submit_streaming(
        self,
        request: InferRequest,
        on_response: ResponseCallback,
        *,
        response_parameters: dict[str, Any] | None = None,
    ) -> Callable[[], None]:
        """Validate and queue one request whose responses go to ``on_response`` (called on
        this model's event loop): one final response for most models; for decoupled models
        any number, then the final one (which may be None: a final flag without a response).
        An error raised here means the request was refused and ``on_response`` is never called.

        Returns ``cancel()``: call it when the client is gone. A request that has not run yet
        leaves the queues (a sequence's takes its whole sequence with it, as in Triton) and is
        answered CANCELLED; a running one is told through ``is_cancelled()`` and may stop early
        (responses still go to ``on_response``)."""
        return functools.partial(self.cancel_request, self._queue(request, response_parameters, None, on_response))

    def cancel_request(self, rec: Pending) -> None:
        """The client of ``rec`` is gone (event loop)."""
        if rec.cancelled:
            return
        rec.cancelled = True
        if rec.token >= 0:
            self._core.cancel(rec.token, rec.handle)

    def cancel_queued(self, token: int, handle: int) -> None:
        """Take request ``handle`` out of the core's queues if it is still there (event loop)."""
        self._core.cancel(token, handle)

    def _queue(
        self,
        request: InferRequest,
        response_parameters: dict[str, Any] | None,
        fut: asyncio.Future[InferResult] | None,
        on_response: ResponseCallback | None,
    ) -> Pending:
        checked = self._validator.check(request)
        handle = next(_handles)
        rec = Pending(
            checked=checked,
            future=fut,
            on_response=on_response,
            parameters=response_parameters,
            # a decoupled request's responses stream: they are not held for submit order
            ordered=self._delivery.preserve_ordering and not self.decoupled,
        )
        self._pending[handle] = rec
        if request.trace is not None:
            self._traced = True
            if self.is_sequence and request.trace.wants_slot:  # an END step's slot is gone once it runs
                request.trace.slot = self._core.slot_of(checked.corrid)
            request.trace.stamp(QUEUE_START)
        header = checked.core_header(handle)
        rec.handle = handle
        iterations = self._iterations
        if iterations is not None:  # its step is noted first: it may run before submit returns
            header = iterations.queueing(checked, header)
        token: int | Refusal | None = None
        try:
            token = self._core.submit(header, checked.buffers)
        finally:
            if not isinstance(token, int):  # refused (or by the binding): nothing of it stays behind
                del self._pending[handle]
                if iterations is not None:
                    iterations.forget([handle])
        if not isinstance(token, int):  # a Refusal
            self._validator.failures += 1
            if token.code is Code.NOT_FOUND:  # a session that ended or expired
                raise SessionGoneError(token.message)
            if token.released:  # checkpointed and released from here: it moved (a coordinator looks it up)
                raise SequenceReleasedError(token.message)
            if token.code is Code.UNAVAILABLE:
                self._rejected += 1
            # Sequence-batcher errors carry no request id in Triton; the others do.
            msg = token.message if self.is_sequence else f"[request id: {request.id or '<id_unknown>'}] {token.message}"
            retry_after_s = BACKLOG_RETRY_AFTER_S if token.backlog_full else None
            if token.retry_after_ms:  # a client's new sessions refused for a while (engine/sessions.py)
                retry_after_s = token.retry_after_ms / 1000
            raise InferenceError(token.code, msg, retry_after_s=retry_after_s)
        if iterations is not None:
            iterations.submitted(rec, handle, token)
        else:
            rec.token = token
        if request.trace is not None and self.is_sequence and request.sequence_start and request.trace.wants_slot:
            request.trace.slot = self._core.slot_of(checked.corrid)
        if self._inline is not None:
            self._inline.schedule()
        scope = request.scope
        if scope is not None and self.is_sequence:
            if request.sequence_end:
                scope.ended(self, checked.corrid)
            elif request.sequence_start:
                scope.started(self, checked.corrid, handle)
            elif request.session:  # may have started it (an implied START): the core knows
                scope.joined(self, checked.corrid, handle)
        self._delivery.track_order(rec)
        return rec

    # ------------------------------------------------------------------ executor side

    def _run(self, cb: Batch) -> bool:
        """Executor thread or, inline, the event loop; GIL held: run the model on one batch and
        deliver the replies (inline: at once, on this thread; else posted to the loop). In
        phases: build the batch, execute it, scatter its outputs into replies, finish. With
        verbose logging, the batch's request lines follow (RequestLog)."""
        if not self._request_log.enabled():
            # Nothing pending: every row of the batch came from the rings (a request is pending
            # before it is submitted, so before any batch holds it).
            if self._ring_only is not None and not self._pending:
                return self._ring_only.run(cb)
            return self._run_batch(cb)
        started = time.perf_counter()
        recs = [self._pending.get(h) if h else None for h in cb.handles]
        ok = False
        try:
            ok = self._run_batch(cb)
        finally:
            self._request_log.batch(cb.instance, cb.size, recs, cb.corrid, ok, started)
        return ok

    def _run_batch(self, cb: Batch) -> bool:
        pending = self._pending
        handles = cb.handles
        recs: list[Pending | None] = (  # nothing pending: ring rows only (see _run)
            [pending.pop(h, None) if h else None for h in handles] if pending else [None] * len(handles)
        )
        running = self._running
        # Whoever pops the instance's entry answers its requests: this thread, or close() (execute hung).
        running[cb.instance] = recs
        ring = self._ring.batch(cb) if self._ring is not None else None
        traces = batch_traces(self._core, self.is_sequence, cb, recs) if self._traced else None
        started_ns = time.monotonic_ns() if self._iterations is not None else 0
        try:
            batch = build_batch(
                cb, recs, self._spec, self._devices, ragged=self._has_ragged, batched=self.max_batch_size > 0
            )
            if self._instances[cb.instance].uses_responders:
                batch.responder = functools.partial(self._delivery.responder, recs)
            if traces:
                stamp(traces, COMPUTE_INPUT_END)
            produced = self._execute(batch, recs, cb.instance)
        except Exception as e:  # the model's failure fails this batch only
            if running.pop(cb.instance, None) is None:
                cb.finish(False)
                return False
            return self._batch_failed(cb, recs, e)
        if running.pop(cb.instance, None) is None:  # too late: close() failed its requests
            cb.finish(False)
            return False
        if traces:
            stamp(traces, COMPUTE_OUTPUT_START)
        try:
            replies = self._scatter(cb, recs, produced, responders=batch.responder is not None, ring=ring)
        except Exception as e:
            return self._batch_failed(cb, recs, e)
        if traces:
            stamp(traces, COMPUTE_END)
        self._finish(cb, replies, ring)
        if self._iterations is not None:  # rescheduled steps go back to the core
            self._iterations.after_batch(recs, getattr(produced, "outcomes", None), started_ns)
        return True

    def _execute(self, batch: ExecuteBatch, recs: list[Pending | None], instance: int) -> Mapping[str, np.ndarray]:
        """The model's ``execute`` (under the watchdog, when the model has an execute timeout)."""
        execute = self._instances[instance].execute
        watchdog = self._watchdog
        return execute(batch) if watchdog is None else watchdog.call(execute, batch, recs)

    def _scatter(
        self,
        cb: Batch,
        recs: list[Pending | None],
        produced: Mapping[str, np.ndarray],
        *,
        responders: bool,
        ring: RingBatch | None,
    ) -> list[tuple[Pending, Reply]]:
        """The batch has run: output states back into the core, outputs split into replies."""
        cb.mark_executed()
        delivery = self._delivery
        if self.decoupled:
            produced = delivery.decoupled_results(recs, produced)
        table = self._devices.table(cb.instance)
        for index, out_name in self._spec.state_outputs:
            value = produced.get(out_name)
            if value is None:
                continue
            held = table.output_of(out_name) if table is not None else None
            if held is not None:
                table.commit(held, value)  # type: ignore[union-attr]
            else:
                cb.set_state(index, np.asarray(value))
        if table is not None:
            table.finish()
            produced = host_outputs(produced, self._spec.state_outputs)
        if ring is not None:
            ring.take(produced, cb.size)
            if recs.count(None) == len(recs):  # only ring rows: their replies are the feeder's
                return []
        return delivery.replies(recs, cb.size, produced, responders=responders, rows=cb.request_rows if ring else None)

    def _finish(self, cb: Batch, replies: list[tuple[Pending, Reply]], ring: RingBatch | None) -> None:
        """Statistics first (a client that sees its reply sees them counted), then the replies."""
        cb.finish(True)
        if ring is not None:
            ring.send()
        if cb.inline:
            self._delivery.deliver(replies)
        elif replies or self._delivery.preserve_ordering:  # a ring-only batch wakes no event loop
            self._delivery.post(replies)

    def _batch_failed(self, cb: Batch, recs: list[Pending | None], e: Exception) -> bool:
        table = self._devices.table(cb.instance)
        if table is not None:
            table.finish()
        err = (
            e
            if isinstance(e, InferenceError)
            else InferenceError(Code.INTERNAL, f"model '{self.name}' failed: {type(e).__name__}: {e}")
        )
        cb.finish(False)
        if self._ring is not None:  # its ring rows are logged and answered as the others are
            self._ring.fail(cb, err, lambda rec, error: self._failures.failed(rec, error, e))
        self._delivery.batch_failed(recs, err, lambda rec, error: self._failures.failed(rec, error, e))
        if self._iterations is not None:  # their sequences end with them
            self._iterations.after_batch(recs, None, 0)
        return False

    def _on_fail(self, handles: list[int], code: Code, message: str) -> None:
        recs = [r for r in (self._pending.pop(h, None) for h in handles) if r is not None]
        if self._iterations is not None:  # dropped before they ran
            self._iterations.forget(handles)
        self._delivery.refused(recs, InferenceError(code, message))

    # -------------------------------------------------------------------------- lifecycle

    def new_sequence_id(self) -> SequenceId:
        """A fresh id for a sequence the client did not name, typed to suit the CORRID control."""
        return fresh_sequence_id(self._spec.corrid_dtype)

    def stop_accepting(self) -> None:
        self._core.stop_accepting()

    def close(self, *, force: bool = False, timeout_s: float | None = None) -> list[str]:
        """Stop the executors (after queues drain unless force) and finalize the instances.

        timeout_s bounds the wait for the executors (None: no bound). An instance whose
        ``execute`` has not returned by then is left behind: its requests fail with
        UNAVAILABLE, it is not finalized, and its name is returned."""
        # One close at a time (a shutdown may overtake an unload that outlasted its timeout).
        if not self._close_lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            return []
        try:
            if self._closed:
                return []
            self._closed = True
            return self._close(force, timeout_s)
        finally:
            self._close_lock.release()

    def _close(self, force: bool, timeout_s: float | None) -> list[str]:
        if self._ring is not None:  # the feeder submits nothing more before the core closes
            self._ring.detach()
        hung = self._core.close(force, timeout_s=timeout_s)
        if self._watchdog is not None:
            self._watchdog.close()
        if hung and isinstance(self.backend, IsolatedBackend):
            for i in hung:  # a child stuck in execute is killed: its thread returns, nothing lingers
                self.backend.instances[i].abort()
        for i in hung:
            recs = self._running.pop(i, None)  # unless its execute has just returned
            err = InferenceError(
                Code.UNAVAILABLE,
                f"model '{self.name}' instance '{self.instance_names[i]}' did not return from execute "
                "within the exit timeout",
            )
            if recs:
                self._delivery.batch_failed(recs, err)
            if self._ring is not None:  # and its ring rows (a ring-only batch has no recs)
                self._ring.fail_running(i, err)
        for i, inst in enumerate(self._instances):
            if i in hung:
                continue  # still inside execute: finalize would race with it
            try:
                inst.finalize()
            except Exception:
                log.exception("model '%s': finalize failed", self.name)
        self._delivery.close_open()
        if not hung:
            self._devices.close()
        return [self.instance_names[i] for i in hung]
