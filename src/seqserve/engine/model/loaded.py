"""One loaded model version: its backend instances, its core scheduler, and the path of a
request through them.

``submit`` (event loop): validate against the config, hand the buffers to the core, return a
future (or take a callback, for streaming). The core's executor thread calls ``_run`` with
the GIL held, once per batch; replies go back to the loop through ``Delivery``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import secrets
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine import _core
from seqserve.engine.backends import BackendInstance, InstanceContext, ModelContext, find_backend
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, DecoupledModelError, InferenceError
from seqserve.engine.isolation import IsolatedBackend, execution_settings
from seqserve.engine.model.delivery import Delivery, Pending
from seqserve.engine.model.spec import build_core_spec
from seqserve.engine.model.validation import INTEGER_CORRID, RequestValidator
from seqserve.engine.model.watchdog import ExecuteWatchdog
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.tensors import wire_dtype_name

log = logging.getLogger("seqserve.model")

_handles = itertools.count(1)


class LoadedModel:
    """A model version ready to serve: scheduler started, instances initialized."""

    def __init__(
        self,
        cfg: mc.ModelConfig,
        *,
        version: int,
        model_dir: Path,
        loop: asyncio.AbstractEventLoop,
        python_isolation: str = "thread",
    ) -> None:
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

        backend_cls = find_backend(cfg)
        if cfg.sequence_batching.state and not backend_cls.supports_implicit_state:
            raise InferenceError(
                Code.INVALID_ARG, f"backend '{cfg.backend or cfg.platform}' does not support implicit state"
            )
        if self.decoupled and not backend_cls.supports_decoupled:
            raise InferenceError(
                Code.INVALID_ARG,
                f"backend '{cfg.backend or cfg.platform}' does not support decoupled models "
                "(model_transaction_policy { decoupled: true }); the python backend does",
            )
        # parameters `isolation` and `execute_timeout_ms` (seqserve.engine.isolation.settings)
        execution = execution_settings(cfg, python_backend="python" in backend_cls.names, default=python_isolation)
        ctx = ModelContext(
            name=self.name,
            version=version,
            config=cfg,
            model_dir=model_dir,
            version_dir=model_dir / str(version),
            parameters={k: v.string_value for k, v in cfg.parameters.items()},
        )
        self.backend = (
            IsolatedBackend(ctx, backend_cls, execute_timeout_s=execution.execute_timeout_s)
            if execution.process
            else backend_cls(ctx)
        )
        self._instances: list[BackendInstance] = []
        self.instance_names: list[str] = []
        self._create_instances(ctx)
        if isinstance(self.backend, IsolatedBackend):
            self.backend.wait_ready()  # the children load the model in parallel

        spec = build_core_spec(cfg, model_dir, len(self._instances))
        self.strategy_name = spec.strategy_name
        self._spec = spec
        self._validator = RequestValidator(cfg, spec)
        self._delivery = Delivery(cfg, self.version_str, loop, preserve_ordering=spec.preserve_ordering)
        self._watchdog = (  # isolated instances time out on their own
            ExecuteWatchdog(self.name, self.instance_names, execution.execute_timeout_s, self._delivery.batch_failed)
            if execution.execute_timeout_s and not execution.process
            else None
        )
        describe = (
            cfg.model_transaction_policy.stateful_model_policy.timeout_action
            == mc.ModelTransactionPolicy.StatefulModelPolicy.DESCRIBE
        )
        self._core = _core.Scheduler(
            **spec.scheduler,
            runner=self._run,
            on_fail=self._on_fail,
            on_warning=lambda msg: log.warning("%s", msg),
            on_expire=self._describe_expired if describe else None,
        )
        self._core.start()

    def _create_instances(self, ctx: ModelContext) -> None:
        """One backend instance per (non-passive) instance_group count; no GPUs here yet."""
        warned_gpu = False
        for group in self.config.instance_group:
            if group.passive:
                continue
            kind = group.kind
            if kind == mc.ModelInstanceGroup.KIND_GPU and not warned_gpu:
                log.warning(
                    "model '%s': instance group '%s' asks for KIND_GPU but no GPU is available; running on CPU",
                    self.name,
                    group.name,
                )
                warned_gpu = True
            elif kind == mc.ModelInstanceGroup.KIND_CPU and group.gpus:
                log.warning(
                    "model '%s': instance group '%s' is KIND_CPU; its 'gpus' %s are ignored",
                    self.name,
                    group.name,
                    list(group.gpus),
                )
            device = "model" if kind == mc.ModelInstanceGroup.KIND_MODEL else "cpu"
            for j in range(max(1, group.count)):
                iname = f"{group.name}_{j}"
                self.instance_names.append(iname)
                ictx = InstanceContext(ctx, len(self._instances), iname, device)
                self._instances.append(self.backend.create_instance(ictx))
        if not self._instances:
            raise InferenceError(Code.INVALID_ARG, f"model '{self.name}' has no (non-passive) instances")

    def _describe_expired(self, info: dict[str, Any]) -> None:
        """stateful_model_policy DESCRIBE: one structured line per expired sequence."""
        info = {"model": self.name, "version": self.version} | info
        log.info("sequence expired %s", orjson.dumps(info).decode())

    # ------------------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        batch = [-1] if self.max_batch_size > 0 else []
        return {
            "name": self.name,
            "versions": [self.version_str],
            "platform": self.config.platform or self.config.backend,
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
        s = self._core.stats()
        refused = self._validator.failures
        if refused:
            s["fail"]["count"] += refused
        alone = self._delivery.request_failures
        if alone:
            s["fail"]["count"] += alone
            s["success"]["count"] -= alone
        return s

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

    def scheduler_state(self) -> dict[str, Any]:
        """Live view of the slot table, for diagnostics."""
        return {
            "free_slots": self._core.free_slots(),
            "backlog_sequences": self._core.backlog_sequences(),
            "pending_requests": self._core.pending_requests(),
            "sequences": dict(self._core.sequences()),
        }

    # ------------------------------------------------------------------------- request

    def submit(
        self, request: InferRequest, *, response_parameters: dict[str, Any] | None = None
    ) -> asyncio.Future[InferResult]:
        """Validate and queue one request; the future resolves on this model's event loop.
        Decoupled models refuse it (DecoupledModelError): use ``submit_streaming``."""
        if self.decoupled:
            raise DecoupledModelError(self.name)
        fut: asyncio.Future[InferResult] = self._loop.create_future()
        self._queue(request, response_parameters, fut, None)
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

        Returns ``cancel()``: call it when the client is gone; the model sees it through
        ``is_cancelled()`` and may stop early (responses still go to ``on_response``)."""
        return self._queue(request, response_parameters, None, on_response).cancel

    def _queue(
        self,
        request: InferRequest,
        response_parameters: dict[str, Any] | None,
        fut: asyncio.Future[InferResult] | None,
        on_response: ResponseCallback | None,
    ) -> Pending:
        checked = self._validator.check(request)
        handle = next(_handles)
        in_order = self._delivery.preserve_ordering and not self.decoupled  # a decoupled request's responses stream
        rec = Pending(
            fut,
            on_response,
            request.id,
            checked.outputs,
            checked.buffers,
            response_parameters,
            checked.rows,
            in_order,
        )
        self._pending[handle] = rec
        err = self._core.submit(
            handle,
            rec.keep,
            checked.corrid,
            request.sequence_start,
            request.sequence_end,
            request.timeout_us,
            checked.rows,
            request.priority,
        )
        if err is not None:
            del self._pending[handle]
            self._validator.failures += 1
            # Sequence-batcher errors carry no request id in Triton; the others do.
            msg = err[1] if self.is_sequence else f"[request id: {request.id or '<id_unknown>'}] {err[1]}"
            raise InferenceError(Code(err[0]), msg)
        self._delivery.track_order(rec)
        return rec

    # ------------------------------------------------------------------ executor side

    def _run(self, cb: _core.Batch) -> bool:
        """Executor thread, GIL held: run the model on one batch and schedule the replies."""
        pending = self._pending
        recs = [pending.pop(h, None) if h else None for h in cb.handles]
        delivery = self._delivery
        try:
            batch = ExecuteBatch(
                size=cb.size,
                instance=cb.instance,
                inputs=cb.inputs(),
                states=cb.states(),
                controls=cb.controls(),
                start=cb.start,
                end=cb.end,
                ready=cb.ready,
                corrid=cb.corrid,
                request_rows=[r.rows if r is not None else 1 for r in recs],
                request_outputs=[r.outputs if r is not None else None for r in recs],
                request_ids=[r.request_id if r is not None else "" for r in recs],
            )
            instance = self._instances[cb.instance]
            if instance.uses_responders:
                batch.responder = functools.partial(delivery.responder, recs)
            watchdog = self._watchdog
            produced = instance.execute(batch) if watchdog is None else watchdog.call(instance.execute, batch, recs)
            cb.mark_executed()
            if self.decoupled:
                produced = delivery.decoupled_results(recs, produced)
            for index, out_name in self._spec.state_outputs:
                value = produced.get(out_name)
                if value is not None:
                    cb.set_state(index, np.asarray(value))
            replies = delivery.replies(recs, cb.size, produced, responders=batch.responder is not None)
        except Exception as e:  # the model's failure fails this batch only
            err = (
                e
                if isinstance(e, InferenceError)
                else InferenceError(Code.INTERNAL, f"model '{self.name}' failed: {type(e).__name__}: {e}")
            )
            cb.finish(False)
            delivery.batch_failed(recs, err)
            return False
        cb.finish(True)  # statistics first: a client that sees its reply sees them counted
        delivery.post(replies)
        return True

    def _on_fail(self, handles: list[int], code: int, message: str) -> None:
        recs = [r for r in (self._pending.pop(h, None) for h in handles) if r is not None]
        self._delivery.refused(recs, InferenceError(Code(code), message))

    # -------------------------------------------------------------------------- lifecycle

    def new_sequence_id(self) -> SequenceId:
        """A fresh id for a sequence the client did not name, typed to suit the CORRID control."""
        cd = self._spec.corrid_dtype
        if cd in (mc.TYPE_UINT32, mc.TYPE_INT32):
            return secrets.randbelow(2**31 - 1) + 1
        if cd in INTEGER_CORRID:
            return secrets.randbelow(2**63 - 1) + 1
        return uuid.uuid4().hex

    def stop_accepting(self) -> None:
        self._core.stop_accepting()

    def close(self, *, force: bool = False) -> None:
        """Stop the executors (after queues drain unless force) and finalize the instances."""
        self._core.close(force)
        if self._watchdog is not None:
            self._watchdog.close()
        for inst in self._instances:
            try:
                inst.finalize()
            except Exception:
                log.exception("model '%s': finalize failed", self.name)
        self._delivery.close_open()
