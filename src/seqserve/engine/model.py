"""One loaded model version: its config, backend instances and core scheduler.

The request path here is: validate against the config (Triton's messages), hand raw buffers
to the core, and await a future that the runner resolves on the event loop, once per batch.
Streaming submits take a callback instead of a future; it gets every response of a request,
which for decoupled models may be many, sent through a ``Responder`` from any thread.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
import secrets
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine import _core
from seqserve.engine.backends import BackendInstance, InstanceContext, ModelContext, find_backend
from seqserve.engine.backends.base import RequestResults
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.config import numpy_wire_name, read_initial_state, to_numpy_dtype, wire_dtype_name
from seqserve.engine.errors import Code, DecoupledModelError, InferenceError
from seqserve.engine.responses import DEFERRED, InferResult, Outcome, Responder, ResponseCallback

log = logging.getLogger("seqserve.model")

SequenceId = int | str
_MAX_STRING_ID = 128
_handles = itertools.count(1)

_CONTROL_KIND = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: 0,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: 1,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: 2,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: 3,
}
_INTEGER_CORRID = {mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32}


@dataclass(slots=True)
class _Input:
    index: int
    name: str
    datatype: str  # protocol name, e.g. "FP32"
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    is_bytes: bool


@dataclass(slots=True, eq=False)
class _Pending:
    future: asyncio.Future[InferResult] | None  # None for streaming submits
    on_response: ResponseCallback | None  # streaming submits: gets every response
    request_id: str
    outputs: tuple[str, ...]
    keep: tuple[Any, ...]  # keeps the input buffers alive until the batch is gathered
    parameters: dict[str, Any] | None
    rows: int  # rows this request occupies in a batch
    ordered: bool  # answered in submit order (preserve_ordering)
    outcome: Any = None  # preserve_ordering: the result or error, once known
    # Responder bookkeeping (under LoadedModel._respond_lock):
    sent: int = 0  # responses sent
    closed: bool = False  # answered for good: final response sent, answered by execute's return, or failed
    cancelled: bool = False  # the client is gone (streaming submits; see _is_cancelled)


def _shape_str(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _dims_match(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _env_int(name: str) -> int:
    raw = os.environ.get(name, "")
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        log.warning("ignoring %s=%r: not an integer", name, raw)
        return 0


class LoadedModel:
    """A model version ready to serve: scheduler started, instances initialized."""

    def __init__(
        self,
        cfg: mc.ModelConfig,
        *,
        version: int,
        model_dir: Path,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.config = cfg
        self.name = cfg.name
        self.version = version
        self.version_str = str(version)
        self.model_dir = model_dir
        self._loop = loop
        self._pending: dict[int, _Pending] = {}
        self._sync_fail = 0
        self._request_fail = 0  # requests a RequestResults failed alone (their batch succeeded)
        self.max_batch_size = cfg.max_batch_size
        self.is_sequence = cfg.HasField("sequence_batching")
        self.decoupled = cfg.model_transaction_policy.decoupled
        self._respond_lock = threading.Lock()
        self._open: set[_Pending] = set()  # requests with a responder and no final response yet

        self._inputs = {
            t.name: _Input(
                i,
                t.name,
                wire_dtype_name(t.data_type),
                np.dtype(to_numpy_dtype(t.data_type) or np.uint16),
                tuple(t.dims),
                t.data_type == mc.TYPE_STRING,
            )
            for i, t in enumerate(cfg.input)
        }
        self._outputs = {t.name: t for t in cfg.output}
        self._output_names = tuple(self._outputs)
        self._output_dtypes = {t.name: np.dtype(to_numpy_dtype(t.data_type) or np.uint16) for t in cfg.output}
        self._corrid_dtype: int | None = None
        self._corrid_name = ""
        controls: list[tuple[str, int, int, float, float]] = []
        states: list[tuple[str, str, int, list[int], bool, bytes, list[int]]] = []
        self._state_outputs: list[tuple[int, str]] = []
        self._ignored_inputs: set[str] = set()
        if self.is_sequence:
            sb = cfg.sequence_batching
            controls = self._control_specs(sb)
            states = self._state_specs(sb)
            self._ignored_inputs = {c[0] for c in controls} | {s[0] for s in states}

        backend_cls = find_backend(cfg)
        if states and not backend_cls.supports_implicit_state:
            raise InferenceError(
                Code.INVALID_ARG, f"backend '{cfg.backend or cfg.platform}' does not support implicit state"
            )
        if self.decoupled and not backend_cls.supports_decoupled:
            raise InferenceError(
                Code.INVALID_ARG,
                f"backend '{cfg.backend or cfg.platform}' does not support decoupled models "
                "(model_transaction_policy { decoupled: true }); the python backend does",
            )
        ctx = ModelContext(
            name=self.name,
            version=version,
            config=cfg,
            model_dir=model_dir,
            version_dir=model_dir / str(version),
            parameters={k: v.string_value for k, v in cfg.parameters.items()},
        )
        self.backend = backend_cls(ctx)
        self._instances: list[BackendInstance] = []
        self.instance_names: list[str] = []
        self._create_instances(ctx)

        batching = self._batching_spec(cfg)
        self.strategy_name = batching.pop("strategy_name")
        self._preserve_ordering = bool(batching.pop("preserve_ordering"))
        self._ordered: collections.deque[_Pending] = collections.deque()
        sb = cfg.sequence_batching
        describe = (
            cfg.model_transaction_policy.stateful_model_policy.timeout_action
            == mc.ModelTransactionPolicy.StatefulModelPolicy.DESCRIBE
        )
        self._core = _core.Scheduler(
            name=self.name,
            max_batch_size=cfg.max_batch_size,
            instance_count=len(self._instances),
            idle_us=sb.max_sequence_idle_microseconds or 1_000_000,
            max_queue_delay_us=sb.direct.max_queue_delay_microseconds,
            min_slot_utilization=sb.direct.minimum_slot_utilization,
            inputs=[
                (
                    t.name,
                    t.data_type,
                    any(d < 0 for d in t.dims) and not t.allow_ragged_batch,
                    [1 if d < 0 else d for d in t.dims],
                )
                for t in cfg.input
            ],
            controls=controls,
            states=states,
            delay_requests=_env_int("TRITONSERVER_DELAY_SCHEDULER"),
            delay_backlog_requests=_env_int("TRITONSERVER_BACKLOG_DELAY_SCHEDULER"),
            runner=self._run,
            on_fail=self._on_fail,
            on_warning=lambda msg: log.warning("%s", msg),
            timeout_complete=self.is_sequence and sb.timeout_action == mc.TIMEOUT_COMPLETE,
            on_expire=self._describe_expired if describe else None,
            **batching,
        )
        self._core.start()

    # ----------------------------------------------------------------- load-time helpers

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

    def _batching_spec(self, cfg: mc.ModelConfig) -> dict[str, Any]:
        """The core's strategy and batch-forming settings for this config."""
        mbs = cfg.max_batch_size
        dyn = cfg.dynamic_batching
        has_dyn = cfg.HasField("dynamic_batching")
        spec: dict[str, Any] = {"preserve_ordering": False}
        if self.is_sequence:
            sb = cfg.sequence_batching
            which = sb.WhichOneof("strategy_choice")
            if which == "oldest":
                spec.update(
                    strategy=_core.OLDEST,
                    strategy_name="oldest",
                    slots_per_instance=sb.oldest.max_candidate_sequences or max(1, mbs),
                    preferred_batch_sizes=list(sb.oldest.preferred_batch_size),
                    batch_delay_us=sb.oldest.max_queue_delay_microseconds,
                )
            elif which == "reusable_batch":
                # Oldest-like batches across sequences; the delay comes from dynamic_batching.
                spec.update(
                    strategy=_core.OLDEST,
                    strategy_name="reusable_batch",
                    slots_per_instance=sb.reusable_batch.max_size,
                    preferred_batch_sizes=list(sb.reusable_batch.candidate_batch_size),
                    batch_delay_us=dyn.max_queue_delay_microseconds if has_dyn else 0,
                )
            else:
                if has_dyn:
                    log.info(
                        "model '%s': Direct strategy; dynamic_batching settings do not apply to sequences",
                        self.name,
                    )
                spec.update(strategy=_core.DIRECT, strategy_name="direct", slots_per_instance=max(1, mbs))
            return spec
        slots = {"slots_per_instance": 1}
        if not has_dyn:
            return spec | slots | {"strategy": _core.STATELESS, "strategy_name": "default"}
        levels = max(1, dyn.priority_levels)
        policies = []
        for level in range(1, levels + 1):
            qp = dyn.priority_queue_policy.get(level, dyn.default_queue_policy)
            policies.append(
                (
                    qp.timeout_action == mc.ModelQueuePolicy.DELAY,
                    qp.default_timeout_microseconds,
                    qp.allow_timeout_override,
                    qp.max_queue_size,
                )
            )
        return (
            spec
            | slots
            | {
                "strategy": _core.DYNAMIC,
                "strategy_name": "dynamic",
                "preferred_batch_sizes": list(dyn.preferred_batch_size),
                "batch_delay_us": dyn.max_queue_delay_microseconds,
                "priority_levels": levels,
                "default_priority": dyn.default_priority_level or 1,
                "queue_policies": policies,
                "preserve_ordering": dyn.preserve_ordering and len(self._instances) > 1,
            }
        )

    def _describe_expired(self, info: dict[str, Any]) -> None:
        """stateful_model_policy DESCRIBE: one structured line per expired sequence."""
        info = {"model": self.name, "version": self.version} | info
        log.info("sequence expired %s", orjson.dumps(info).decode())

    def _control_specs(self, sb: mc.ModelSequenceBatching) -> list[tuple[str, int, int, float, float]]:
        out = []
        for ci in sb.control_input:
            spec: tuple[str, int, int, float, float] | None = None
            for c in ci.control:  # several kinds on one tensor: the later one wins, as in Triton
                kind = _CONTROL_KIND[c.kind]
                if kind == 3:
                    spec = (ci.name, 3, c.data_type, 0.0, 0.0)
                    self._corrid_dtype = c.data_type
                    self._corrid_name = ci.name
                elif len(c.int32_false_true) == 2:
                    spec = (ci.name, kind, mc.TYPE_INT32, *map(float, c.int32_false_true))  # type: ignore[assignment]
                elif len(c.fp32_false_true) == 2:
                    spec = (ci.name, kind, mc.TYPE_FP32, *map(float, c.fp32_false_true))  # type: ignore[assignment]
                else:
                    spec = (ci.name, kind, mc.TYPE_BOOL, *map(float, c.bool_false_true))  # type: ignore[assignment]
            if spec is not None:
                out.append(spec)
        return out

    def _state_specs(
        self, sb: mc.ModelSequenceBatching
    ) -> list[tuple[str, str, int, list[int], bool, bytes, list[int]]]:
        out: list[tuple[str, str, int, list[int], bool, bytes, list[int]]] = []
        seen: set[str] = set()
        for st in sb.state:
            in_name = st.input_name or st.name
            out_name = st.output_name or st.name
            if in_name in seen:
                log.warning(
                    "model '%s': state input '%s' is given twice; the later one is ignored",
                    self.name,
                    in_name,
                )
                continue
            seen.add(in_name)
            data, dims = read_initial_state(self.model_dir, st, self.max_batch_size)
            variable = any(d < 0 for d in st.dims)
            self._state_outputs.append((len(out), out_name))
            out.append((in_name, out_name, st.data_type, list(st.dims), variable, data, list(dims)))
        return out

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
        if self._sync_fail:
            s["fail"]["count"] += self._sync_fail
        if self._request_fail:
            s["fail"]["count"] += self._request_fail
            s["success"]["count"] -= self._request_fail
        return s

    @property
    def inflight_sequences(self) -> int:
        return self._core.inflight_sequences()

    @property
    def open_responses(self) -> int:
        """Requests a responder may still answer (no final response yet)."""
        return len(self._open)

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

    def _bad(self, request_id: str, msg: str, code: Code = Code.INVALID_ARG) -> InferenceError:
        self._sync_fail += 1
        return InferenceError(code, f"[request id: {request_id or '<id_unknown>'}] {msg}")

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        sequence_id: SequenceId = 0,
        start: bool = False,
        end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
        response_parameters: dict[str, Any] | None = None,
    ) -> asyncio.Future[InferResult]:
        """Validate and queue one request; the future resolves on this model's event loop.
        Decoupled models refuse it (DecoupledModelError): use ``submit_streaming``."""
        if self.decoupled:
            raise DecoupledModelError(self.name)
        fut: asyncio.Future[InferResult] = self._loop.create_future()
        self._queue(
            inputs, sequence_id, start, end, outputs, request_id, timeout_us, priority, response_parameters, fut, None
        )
        return fut

    def submit_streaming(
        self,
        inputs: Mapping[str, np.ndarray],
        on_response: ResponseCallback,
        *,
        sequence_id: SequenceId = 0,
        start: bool = False,
        end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
        response_parameters: dict[str, Any] | None = None,
    ) -> Callable[[], None]:
        """Validate and queue one request whose responses go to ``on_response`` (called on
        this model's event loop): one final response for most models; for decoupled models
        any number, then the final one (which may be None: a final flag without a response).
        An error raised here means the request was refused and ``on_response`` is never called.

        Returns ``cancel()``: call it when the client is gone; the model sees it through
        ``is_cancelled()`` and may stop early (responses still go to ``on_response``)."""
        rec = self._queue(
            inputs,
            sequence_id,
            start,
            end,
            outputs,
            request_id,
            timeout_us,
            priority,
            response_parameters,
            None,
            on_response,
        )
        return functools.partial(_cancel, rec)

    def _queue(
        self,
        inputs: Mapping[str, np.ndarray],
        sequence_id: SequenceId,
        start: bool,
        end: bool,
        outputs: Sequence[str] | None,
        request_id: str,
        timeout_us: int,
        priority: int,
        response_parameters: dict[str, Any] | None,
        fut: asyncio.Future[InferResult] | None,
        on_response: ResponseCallback | None,
    ) -> _Pending:
        name = self.name
        mbs = self.max_batch_size
        ordered: list[Any] = [None] * len(self._inputs)
        batch = -1
        for key, arr in inputs.items():
            spec = self._inputs.get(key)
            if spec is None:
                if key in self._ignored_inputs:  # control/state tensors are supplied by the server
                    continue
                self._sync_fail += 1
                raise InferenceError(Code.INVALID_ARG, f"unexpected inference input '{key}' for model '{name}'")
            if not isinstance(arr, np.ndarray):
                arr = np.asarray(arr, dtype=spec.dtype)
            if spec.is_bytes:
                if arr.dtype != object and arr.dtype.kind not in "SU":
                    raise self._bad(
                        request_id,
                        f"inference input '{key}' data-type is '{numpy_wire_name(arr.dtype)}', but model '{name}' "
                        f"expects 'BYTES'",
                    )
            elif arr.dtype != spec.dtype:
                raise self._bad(
                    request_id,
                    f"inference input '{key}' data-type is '{numpy_wire_name(arr.dtype)}', but model '{name}' "
                    f"expects '{spec.datatype}'",
                )
            shape = arr.shape
            item = shape[1:] if mbs > 0 else shape
            if mbs > 0:
                if len(shape) == 0:
                    raise self._bad(
                        request_id,
                        f"unexpected shape for input '{key}' for model '{name}'. "
                        f"Expected {_shape_str((-1, *spec.dims))}, got {_shape_str(shape)}{_BATCH_DIM_NOTE}",
                    )
                if batch < 0:
                    batch = shape[0]
                elif shape[0] != batch:
                    raise self._bad(
                        request_id,
                        f"input '{key}' batch size {shape[0]} does not match other inputs ({batch})",
                    )
            if not _dims_match(item, spec.dims):
                want = (-1, *spec.dims) if mbs > 0 else spec.dims
                raise self._bad(
                    request_id,
                    f"unexpected shape for input '{key}' for model '{name}'. "
                    f"Expected {_shape_str(want)}, got {_shape_str(shape)}{_BATCH_DIM_NOTE if mbs > 0 else ''}",
                )
            if spec.is_bytes:
                ordered[spec.index] = (_core.serialize_bytes(arr), shape)
            else:
                ordered[spec.index] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        if any(o is None for o in ordered):
            missing = [n for n, s in self._inputs.items() if ordered[s.index] is None]
            got = [n for n in inputs if n in self._inputs]
            raise self._bad(
                request_id,
                f"expected {len(self._inputs)} inputs but got {len(got)} inputs for model '{name}'. "
                f"Got input(s) {_name_list(got)}, but missing required input(s) {_name_list(missing)}. "
                "Please provide all required input(s).",
            )
        if mbs > 0 and batch > mbs:
            raise self._bad(request_id, f"inference request batch-size must be <= {mbs} for '{name}'")
        if outputs:
            for o in outputs:
                if o not in self._outputs:
                    self._sync_fail += 1
                    raise InferenceError(Code.INVALID_ARG, f"unexpected inference output '{o}' for model '{name}'")
            out_names = tuple(outputs)
        else:
            out_names = self._output_names

        corrid: SequenceId = 0
        if self.is_sequence:
            corrid = sequence_id
            is_str = isinstance(corrid, str)
            if is_str and len(corrid) > _MAX_STRING_ID:  # type: ignore[arg-type]
                self._sync_fail += 1  # refused when the id is set, before any request id applies
                raise InferenceError(Code.UNSUPPORTED, "string correlation ID cannot be longer than 128 characters")
            cd = self._corrid_dtype
            if cd is not None and ((is_str and cd != mc.TYPE_STRING) or (not is_str and cd not in _INTEGER_CORRID)):
                raise self._bad(
                    request_id,
                    f"sequence batching control '{self._corrid_name}' data-type is "
                    f"'{'BYTES' if is_str else 'UINT64'}', but model '{name}' expects '{wire_dtype_name(cd)}'",
                )
            if mbs > 0 and batch != 1:
                self._sync_fail += 1
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"inference request to model '{name}' must specify batch-size 1 due to requirements "
                    "of sequence batcher",
                )
        handle = next(_handles)
        rows = batch if batch > 0 else 1
        in_order = self._preserve_ordering and not self.decoupled  # a decoupled request's responses stream
        rec = _Pending(fut, on_response, request_id, out_names, tuple(ordered), response_parameters, rows, in_order)
        self._pending[handle] = rec
        err = self._core.submit(handle, rec.keep, corrid, start, end, timeout_us, rows, priority)
        if err is not None:
            del self._pending[handle]
            self._sync_fail += 1
            # Sequence-batcher errors carry no request id in Triton; the others do.
            msg = err[1] if self.is_sequence else f"[request id: {request_id or '<id_unknown>'}] {err[1]}"
            raise InferenceError(Code(err[0]), msg)
        if in_order:
            self._ordered.append(rec)
        return rec

    # ------------------------------------------------------------------ executor side

    def _run(self, cb: _core.Batch) -> bool:
        """Executor thread, GIL held: run the model on one batch and schedule the replies."""
        pending = self._pending
        recs = [pending.pop(h, None) if h else None for h in cb.handles]
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
                batch.responder = functools.partial(self._responder, recs)
            produced = instance.execute(batch)
            cb.mark_executed()
            if self.decoupled:
                produced = self._decoupled_results(recs, produced)
            for index, out_name in self._state_outputs:
                value = produced.get(out_name)
                if value is not None:
                    cb.set_state(index, np.asarray(value))
            replies = self._split(cb.size, recs, produced)
            if batch.responder is not None:
                replies = self._close_answered(replies)
        except Exception as e:  # the model's failure fails this batch only
            err = (
                e
                if isinstance(e, InferenceError)
                else InferenceError(Code.INTERNAL, f"model '{self.name}' failed: {type(e).__name__}: {e}")
            )
            cb.finish(False)
            with self._respond_lock:  # a responder may have answered some already
                failed = [r for r in recs if r is not None and not r.closed and not self._answered(r)]
                for r in recs:
                    if r is not None:
                        r.closed = True
                        self._open.discard(r)
            self._loop.call_soon_threadsafe(self._fail_all, failed, err)
            return False
        cb.finish(True)
        self._loop.call_soon_threadsafe(self._deliver, replies)
        return True

    def _split(
        self, size: int, recs: list[_Pending | None], produced: Mapping[str, np.ndarray]
    ) -> list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]]:
        if isinstance(produced, RequestResults):
            return self._split_requests(recs, produced.outcomes)
        arrays: dict[str, np.ndarray] = {}
        needed = {o for r in recs if r is not None for o in r.outputs}
        for o in needed:
            value = produced.get(o)
            if value is None:
                raise InferenceError(Code.INTERNAL, f"model '{self.name}' did not produce output '{o}'")
            arr = self._owned_output(o, value)
            if self.max_batch_size > 0 and (arr.ndim == 0 or arr.shape[0] != size):
                raise InferenceError(
                    Code.INTERNAL,
                    f"model '{self.name}' produced output '{o}' with shape {list(arr.shape)}; "
                    f"expected batch dimension {size}",
                )
            arrays[o] = arr
        replies: list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]] = []
        if self.max_batch_size == 0:  # one request, no batch dimension
            return [(rec, {o: arrays[o] for o in rec.outputs}) for rec in recs if rec is not None]
        row = 0
        for rec in recs:
            if rec is None:  # padding or a final END step: one row, no reply
                row += 1
                continue
            end = row + rec.rows
            replies.append((rec, {o: arrays[o][row:end] for o in rec.outputs}))
            row = end
        return replies

    def _split_requests(
        self, recs: list[_Pending | None], outcomes: list[Mapping[str, np.ndarray] | InferenceError | None]
    ) -> list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]]:
        """Replies from a RequestResults: each request's own outputs, or its own error."""
        if len(outcomes) != len(recs):
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self.name}' gave {len(outcomes)} per-request results for a batch of {len(recs)} requests",
            )
        replies: list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]] = []
        for rec, outcome in zip(recs, outcomes, strict=True):
            if rec is not None and outcome is not DEFERRED:
                reply = outcome if isinstance(outcome, InferenceError) else self._request_reply(rec, outcome)
                if isinstance(reply, InferenceError):
                    self._request_fail += 1
                replies.append((rec, reply))
        return replies

    def _request_reply(
        self, rec: _Pending, outcome: Mapping[str, np.ndarray] | None, *, copy: bool = False
    ) -> dict[str, np.ndarray] | InferenceError:
        outs: dict[str, np.ndarray] = {}
        for o in rec.outputs:
            value = None if outcome is None else outcome.get(o)
            if value is None:  # not produced: left out of the reply, as Triton does
                continue
            try:
                outs[o] = self._owned_output(o, value, copy)
            except InferenceError as e:  # fails this request only
                return e
        return outs

    def _owned_output(self, name: str, value: Any, copy: bool = False) -> np.ndarray:
        """A produced output checked against its configured dtype, owning its data: a view may
        alias an engine buffer that the next batch overwrites (``copy``: always a copy)."""
        arr = np.asarray(value)
        want = self._output_dtypes[name]
        if arr.dtype != want and not (want.kind == "O" and arr.dtype.kind in "OSU"):
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self.name}' produced output '{name}' as {arr.dtype}, but its config says "
                f"{wire_dtype_name(self._outputs[name].data_type)}",
            )
        return arr.copy() if copy or arr.base is not None else arr

    # Responders: a request answered late, or several times (decoupled models).

    def _responder(self, recs: list[_Pending | None], i: int) -> Responder:
        rec = recs[i]
        if rec is None:  # a final END step: nobody waits for its responses
            return Responder(_drop, _true)
        with self._respond_lock:
            if not rec.closed:
                self._open.add(rec)
        return Responder(functools.partial(self._respond, rec), functools.partial(_is_cancelled, rec))

    def _decoupled_results(
        self, recs: list[_Pending | None], produced: Mapping[str, np.ndarray] | None
    ) -> Mapping[str, np.ndarray]:
        """A decoupled model answers through responders: what execute returned holds output
        states only, and every request stays open (tracked) until its final response."""
        with self._respond_lock:
            for r in recs:
                if r is not None and not r.closed:
                    self._open.add(r)
        if isinstance(produced, RequestResults):
            return produced
        return RequestResults([DEFERRED] * len(recs), produced)

    def _close_answered(
        self, replies: list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]]
    ) -> list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]]:
        """Requests answered by execute's return are closed to their responders; one that a
        responder already ended keeps that answer (a request is answered once)."""
        with self._respond_lock:
            kept = [(rec, reply) for rec, reply in replies if not rec.closed and not self._answered(rec)]
            for rec, _ in kept:
                rec.closed = True
                self._open.discard(rec)
        return kept

    def _answered(self, rec: _Pending) -> bool:
        """A non-decoupled request is answered by its one response, final flag or not."""
        return rec.sent > 0 and not self.decoupled

    def _respond(self, rec: _Pending, outcome: Outcome, final: bool) -> None:
        """Any thread: check and copy one response, then hand it to the event loop."""
        if rec.closed:  # checked again under the lock; this only saves the copy
            raise InferenceError(Code.INTERNAL, "Unable to send response. Response sender has been closed.")
        # always a copy: a model may reuse its buffer for the next response
        reply = self._request_reply(rec, outcome, copy=True) if isinstance(outcome, Mapping) else outcome
        with self._respond_lock:
            if not self.decoupled:  # exactly one response, as Triton requires (checked first, as there)
                if outcome is not None and rec.sent:
                    raise InferenceError(
                        Code.INTERNAL,
                        "Unable to send response. Non-decoupled model cannot send more than one response.",
                    )
                if outcome is None and final and not rec.sent:
                    raise InferenceError(
                        Code.INTERNAL,
                        "Unable to send response. Non-decoupled model cannot send complete final before "
                        "sending a response.",
                    )
            if rec.closed:
                raise InferenceError(Code.INTERNAL, "Unable to send response. Response sender has been closed.")
            try:  # posted under the lock so that a request's responses keep their order
                self._loop.call_soon_threadsafe(self._on_response, rec, reply, final)
            except RuntimeError:  # the event loop is gone: the server has stopped
                rec.closed = True
                self._open.discard(rec)
                raise InferenceError(Code.UNAVAILABLE, "Unable to send response. The server has stopped.") from None
            if outcome is not None:
                rec.sent += 1
            if final:
                rec.closed = True
            if final or self._answered(rec):  # nothing left to wait for at shutdown
                self._open.discard(rec)

    def _on_response(self, rec: _Pending, reply: dict[str, np.ndarray] | InferenceError | None, final: bool) -> None:
        result: InferResult | InferenceError | None = (
            InferResult(self.name, self.version_str, rec.request_id, reply, rec.parameters or {})
            if isinstance(reply, dict)
            else reply
        )
        if self.decoupled:  # an error response is one of many: the request's outcome is its batch's
            if rec.on_response is not None:
                _call(rec.on_response, result, final)
            return
        if result is not None:  # its one response answers it now; a final flag may follow
            if isinstance(result, InferenceError):
                self._request_fail += 1
            self._settle(rec, result)
            if self._preserve_ordering:
                self._flush_ordered()

    def _on_fail(self, handles: list[int], code: int, message: str) -> None:
        recs = [r for r in (self._pending.pop(h, None) for h in handles) if r is not None]
        if recs:
            self._loop.call_soon_threadsafe(self._fail_all, recs, InferenceError(Code(code), message))

    # Event-loop side: resolve futures (in enqueue order when preserve_ordering is on).

    def _deliver(self, replies: list[tuple[_Pending, dict[str, np.ndarray] | InferenceError]]) -> None:
        for rec, outs in replies:
            if isinstance(outs, InferenceError):
                self._settle(rec, outs)
                continue
            result = InferResult(self.name, self.version_str, rec.request_id, outs, rec.parameters or {})
            self._settle(rec, result)
        if self._preserve_ordering:
            self._flush_ordered()

    def _fail_all(self, recs: list[_Pending], err: InferenceError) -> None:
        for rec in recs:
            self._settle(rec, InferenceError(err.code, err.message))
        if self._preserve_ordering:
            self._flush_ordered()

    def _settle(self, rec: _Pending, outcome: InferResult | InferenceError) -> None:
        if rec.ordered:
            rec.outcome = outcome
        else:
            _resolve(rec, outcome)

    def _flush_ordered(self) -> None:
        q = self._ordered
        while q and q[0].outcome is not None:
            rec = q.popleft()
            _resolve(rec, rec.outcome)

    # -------------------------------------------------------------------------- shutdown

    def new_sequence_id(self) -> SequenceId:
        """A fresh id for a sequence the client did not name, typed to suit the CORRID control."""
        if self._corrid_dtype in (mc.TYPE_UINT32, mc.TYPE_INT32):
            return secrets.randbelow(2**31 - 1) + 1
        if self._corrid_dtype in _INTEGER_CORRID:
            return secrets.randbelow(2**63 - 1) + 1
        return uuid.uuid4().hex

    def stop_accepting(self) -> None:
        self._core.stop_accepting()

    def close(self, *, force: bool = False) -> None:
        """Stop the executors (after queues drain unless force) and finalize the instances."""
        self._core.close(force)
        for inst in self._instances:
            try:
                inst.finalize()
            except Exception:
                log.exception("model '%s': finalize failed", self.name)
        with self._respond_lock:  # requests still waiting for their final response
            unanswered = [r for r in self._open if not r.closed and not self._answered(r)]
            for r in unanswered:
                r.closed = True
            self._open.clear()
        if unanswered:
            err = InferenceError(
                Code.UNAVAILABLE,
                f"model '{self.name}' was unloaded before it sent the final response for this request",
            )
            for r in unanswered:
                try:
                    self._loop.call_soon_threadsafe(self._on_response, r, err, True)
                except RuntimeError:  # the loop is gone: nobody is waiting
                    break


def _resolve(rec: _Pending, outcome: InferResult | InferenceError) -> None:
    if rec.on_response is not None:
        _call(rec.on_response, outcome, True)
    elif rec.future is not None and not rec.future.done():
        if isinstance(outcome, InferenceError):
            rec.future.set_exception(outcome)
        else:
            rec.future.set_result(outcome)


def _call(on_response: ResponseCallback, outcome: InferResult | InferenceError | None, final: bool) -> None:
    try:
        on_response(outcome, final)
    except Exception:  # one consumer's bug must not stop the others' replies
        log.exception("response callback failed")


def _drop(outcome: Outcome, final: bool) -> None:
    pass


def _true() -> bool:
    return True


def _cancel(rec: _Pending) -> None:
    rec.cancelled = True


def _is_cancelled(rec: _Pending) -> bool:
    # a unary caller that went away cancelled the future it was awaiting
    return rec.cancelled or (rec.future is not None and rec.future.cancelled())


def _name_list(names: list[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"  # Triton's formatting, no spaces


_BATCH_DIM_NOTE = (
    ". NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)
