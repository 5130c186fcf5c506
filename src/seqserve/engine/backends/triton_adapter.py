"""Runs Triton-style Python models (`TritonPythonModel`) on seqserve's batch-level engine.

Per batch the adapter builds one ``pb_utils.InferenceRequest`` per request (padding rows are
skipped; a stateless dynamic batch is split by ``batch.request_rows``), calls
``execute(requests)`` once, and gives the engine a ``RequestResults``: each request's outputs
as its response holds them, or the response's ``TritonError``, which fails that request only.
An exception raised by ``execute`` fails the whole batch, as in Triton.

What a request carries, as in Triton: the model's inputs (copies, owned by the request), the
configured control tensors (START/END/READY/CORRID, shape [1, 1], or [1] when
max_batch_size is 0), ``correlation_id()`` (uint64, or str for string ids; 0 outside
sequences), ``flags()`` (SEQUENCE_START=1 | SEQUENCE_END=2), ``request_id()`` and
``requested_output_names()`` (every output when the client named none).

seqserve extras: implicit state (``sequence_batching.state``), which Triton's python backend
lacks, works: the state arrives as an input named by ``input_name``, and a response tensor
named by ``output_name`` becomes the request's next state (same shape as the input state;
without one the state is kept). The final END step of a ``TIMEOUT_COMPLETE`` sequence is
delivered as a request with the END flag and zero-filled inputs; its response is dropped.

Response senders, as in Triton: ``request.get_response_sender()`` answers the request from
any thread, during ``execute`` or after it returns. A decoupled model
(``model_transaction_policy { decoupled: true }``) sends any number of responses, each to
the client as it is sent, then the final flag (with a last response or alone); its
``execute`` returns None. A non-decoupled model may answer a request through the sender
instead of returning its response (None in its place): exactly one response, then the
final flag. It must take the sender before ``execute`` returns; otherwise the request fails
at once with a clear error, where Triton would leave the client waiting. Triton's errors
apply ("Non-decoupled model cannot send more than one response.", "Response sender has
been closed.", ...). Implicit state of a request answered through its sender comes from the
last response that carried it before ``execute`` returned (kept when none did): the next
step of the sequence may run as soon as ``execute`` returns. A decoupled request that never
gets its final flag keeps its client waiting, as in Triton, until the model is unloaded,
which fails it; shutdown waits for such requests up to the exit timeout.

Request rescheduling: a request released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``
(``request.set_release_flags``) in a decoupled model with ``iterative_sequence: true`` has
the outcome ``RESCHEDULE``: the engine queues it again as its sequence's next step
(engine/model/iterations.py). Other models fail it with Triton's error.

BLS: while ``execute`` runs (and in the tasks of an ``async def execute``), the instance is the
current caller (``bls.CURRENT``), so ``pb_utils.InferenceRequest(...).exec()`` goes through this
server's calls (``triton_bls``) and a call to the model itself is refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
from typing import Any

import numpy as np

from seqserve.engine.backends import bls, triton_bls
from seqserve.engine.backends import triton_utils as pb
from seqserve.engine.backends.base import BackendInstance, InstanceContext, RequestResults
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.config import config_to_json
from seqserve.engine.device.arrays import is_device_array, to_host
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.responses import DEFERRED, RESCHEDULE

log = logging.getLogger("seqserve.model")

_KINDS = {"cpu": "CPU", "model": "MODEL"}

# pb_utils.InferenceRequest.exec / async_exec run through the engine's calls (BLS)
bls.TRITON_EXEC.install(triton_bls.TritonBls())


def initialize_args(ictx: InstanceContext) -> dict[str, str]:
    """The ``args`` dict Triton passes to ``TritonPythonModel.initialize`` (all strings)."""
    ctx = ictx.model
    device = ictx.device
    kind = "GPU" if device.startswith("cuda") else _KINDS.get(device, device.upper())
    device_id = device.partition(":")[2] or "0"
    return {
        "model_config": json.dumps(config_to_json(ctx.config)),
        "model_instance_kind": kind,
        "model_instance_name": ictx.name,
        "model_instance_device_id": device_id,
        "model_repository": str(ctx.model_dir),
        "model_version": str(ctx.version),
        "model_name": ctx.name,
    }


class TritonInstance(BackendInstance):
    """One TritonPythonModel object behind the batch-level BackendInstance interface."""

    uses_responders = True

    def __init__(self, obj: Any, ictx: InstanceContext) -> None:
        cfg = ictx.model.config
        self._obj = obj
        self._name = ictx.model.name
        self._instance_name = ictx.name  # Triton names the instance in execute's errors
        self._batched = cfg.max_batch_size > 0
        self._decoupled = cfg.model_transaction_policy.decoupled
        self._iterative = cfg.HasField("sequence_batching") and cfg.sequence_batching.iterative_sequence
        # state input name -> output name
        self._states = {(s.input_name or s.name): (s.output_name or s.name) for s in cfg.sequence_batching.state}
        self._state_outputs = tuple(self._states.values())
        # `async def execute`: one event loop per instance, running on its own thread for the
        # instance's lifetime (as in Triton), so tasks a model starts outlive the execute call
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        # who calls, for pb_utils.InferenceRequest.exec (BLS) during execute
        calls = ictx.model.calls
        self._caller = calls.caller(ictx.model.name, ictx.model.version) if calls is not None else None
        init = getattr(obj, "initialize", None)
        if init is not None:
            bls_refused = bls.CURRENT.set(bls.NOT_EXECUTING)  # as in Triton: BLS only in execute
            try:
                init(initialize_args(ictx))
            finally:
                bls.CURRENT.reset(bls_refused)
        if not callable(getattr(obj, "execute", None)):
            raise InferenceError(Code.INVALID_ARG, f"python model '{self._name}' does not implement `execute` method")

    # ------------------------------------------------------------------------ execute

    def execute(self, batch: ExecuteBatch) -> RequestResults:
        requests, owners, spans = self._requests(batch)
        calling = bls.CURRENT.set(self._caller)  # copied into an async execute's task too
        try:
            returned = self._obj.execute(requests)
            if asyncio.iscoroutine(returned):
                returned = asyncio.run_coroutine_threadsafe(returned, self._event_loop()).result()
        except Exception as e:  # fails the whole batch, with Triton's wording
            raise InferenceError(
                Code.INTERNAL,
                f"Failed to process the request(s) for model '{self._instance_name}', message: {type(e).__name__}: {e}",
            ) from e
        finally:
            bls.CURRENT.reset(calling)
        responses = self._check_returned(requests, returned)

        outcomes: list[Any] = [None] * len(batch.request_rows)
        picked: list[dict[str, np.ndarray] | None] = [None] * len(batch.request_rows)
        for req, owner, response in zip(requests, owners, responses, strict=True):
            sender = req._sender
            if response is None:  # answered through its sender, now or later (from any thread)
                if sender is not None:
                    outcomes[owner] = DEFERRED
                    picked[owner] = sender.stop_recording()  # states sent during execute
                elif self._decoupled:  # the engine tracks it until the model answers it
                    outcomes[owner] = DEFERRED
                else:  # a non-decoupled model that forgot the request
                    outcomes[owner] = InferenceError(
                        Code.INTERNAL,
                        f"model '{self._name}' returned from execute without a response for this request: return "
                        "one, or take the request's sender (request.get_response_sender()) before execute returns",
                    )
            elif response.has_error():
                err = response.error()
                assert err is not None
                outcomes[owner] = InferenceError(err.code(), err.message())
            else:
                outcomes[owner] = {t.name(): self._output_array(t) for t in response.output_tensors()}
                picked[owner] = outcomes[owner]
            if req.release_flags() & pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                outcomes[owner] = self._rescheduled(outcomes[owner])
        return RequestResults(outcomes, self._next_states(batch, spans, picked, outcomes))

    def _rescheduled(self, outcome: Any) -> Any:
        """A request the model released with RESCHEDULE: it runs again (an iterative sequence
        model's; its responses go through its sender), or fails with Triton's error."""
        if self._iterative and self._decoupled and outcome is DEFERRED:
            return RESCHEDULE
        if not self._iterative:
            return InferenceError(
                Code.INVALID_ARG,
                "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
                "configured to handle such a flag.",
            )
        return InferenceError(
            Code.INVALID_ARG,
            f"model '{self._name}' rescheduled a request it answered by returning a response: only a decoupled "
            "model (model_transaction_policy { decoupled: true }) may reschedule a request",
        )

    def _output_array(self, t: pb.Tensor) -> Any:
        """A response tensor as the engine takes it: numpy, or (a GPU model's) a device array
        left on the device for a state output and copied to the host for a reply."""
        if t.is_cpu():
            return t.as_numpy()
        return t.device_array if t.name() in self._state_outputs else to_host(t.device_array)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=loop.run_forever, name=f"{self._instance_name}-asyncio", daemon=True
            )
            self._loop_thread.start()
            self._loop = loop
        return self._loop

    def _requests(self, batch: ExecuteBatch) -> tuple[list[pb.InferenceRequest], list[int], list[tuple[int, int]]]:
        """The requests of a batch, the batch position of each, and every position's rows."""
        tensors: dict[str, np.ndarray] = {**batch.inputs, **batch.controls, **batch.states}
        # ragged inputs: each request's own part, in its own shape (as Triton's python backend)
        ragged = {name: batch.request_inputs(name) for name in batch.ragged}
        corrid = batch.corrid
        requests: list[pb.InferenceRequest] = []
        owners: list[int] = []
        spans: list[tuple[int, int]] = []
        row = 0
        responder = batch.responder
        # start/end/ready/corrid hold one entry per request (not per row)
        for i, rows in enumerate(batch.request_rows):
            lo, hi = row, row + rows
            row = hi
            spans.append((lo, hi))
            if batch.request_outputs[i] is None and not (batch.ready[i] and batch.end[i]):
                continue  # padding; a ready END row without a reply is a final END step
            wanted = batch.request_outputs[i]
            if ragged:
                inputs = [
                    pb.Tensor(name, np.array(ragged[name][i] if name in ragged else arr[lo:hi]))
                    for name, arr in tensors.items()
                ]
            elif self._batched:
                inputs = [pb.Tensor(name, rows_of(arr, lo, hi)) for name, arr in tensors.items()]
            else:
                inputs = [
                    pb.Tensor(name, np.array(arr) if isinstance(arr, np.ndarray) else arr)
                    for name, arr in tensors.items()
                ]
            flags = (pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START if batch.start[i] else 0) | (
                pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END if batch.end[i] else 0
            )
            cid = corrid[i]
            request = pb.InferenceRequest(
                request_id=batch.request_ids[i] if i < len(batch.request_ids) else "",
                correlation_id=cid if isinstance(cid, str) else int(cid),
                inputs=inputs,
                requested_output_names=list(wanted or ()),
                model_name=self._name,
                flags=flags,
                parameters=batch.request_parameters[i] if i < len(batch.request_parameters) else None,
            )
            if responder is not None:
                request._make_responder = functools.partial(responder, i)
                request._state_names = self._state_outputs
            requests.append(request)
            owners.append(i)
        return requests, owners, spans

    def _check_returned(self, requests: list[pb.InferenceRequest], returned: Any) -> list[Any]:
        """What execute returned, checked as Triton checks it; one entry (or None) per request."""
        if returned is None:
            return [None] * len(requests)
        if self._decoupled:
            raise InferenceError(
                Code.INTERNAL,
                f"Python model '{self._instance_name}' is using the decoupled mode and the execute function must "
                "return None.",
            )
        if not isinstance(returned, list):
            raise InferenceError(
                Code.INTERNAL,
                f"Expected a list in the execute return, found type '{type(returned)}'.",
            )
        if len(returned) != len(requests):
            raise InferenceError(
                Code.INTERNAL,
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(returned)}",
            )
        for r in returned:
            if r is not None and not isinstance(r, pb.InferenceResponse):
                raise InferenceError(
                    Code.INTERNAL,
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{type(r)}'.",
                )
        return returned

    def _next_states(
        self,
        batch: ExecuteBatch,
        spans: list[tuple[int, int]],
        picked: list[dict[str, np.ndarray] | None],
        outcomes: list[Any],
    ) -> dict[str, np.ndarray]:
        """Output states, batched: a request's response tensor named by the state's output name,
        else its current state."""
        out: dict[str, np.ndarray] = {}
        for in_name, out_name in self._states.items():
            current = batch.states.get(in_name)
            if current is None:
                continue
            if is_device_array(current):
                device_new = next_device_state(current, picked, spans, out_name, batched=self._batched)
                if device_new is not None:
                    out[out_name] = device_new
                continue
            new: np.ndarray | None = None
            for i, tensors in enumerate(picked):
                value = None if tensors is None else tensors.get(out_name)
                if value is None:
                    continue
                if not self._batched:
                    new = value
                    continue
                lo, hi = spans[i]
                if new is None:
                    new = np.array(current)
                if value.shape != new[lo:hi].shape:
                    msg = (
                        f"model '{self._name}' produced state '{out_name}' with shape {list(value.shape)}; "
                        f"expected {list(new[lo:hi].shape)}"
                    )
                    if outcomes[i] is DEFERRED or outcomes[i] is RESCHEDULE:  # responses out: keep the state
                        log.error("%s; the sequence keeps its previous state", msg)
                    else:
                        outcomes[i] = InferenceError(Code.INTERNAL, msg)
                    continue
                new[lo:hi] = value
            if new is not None:
                out[out_name] = new
        return out

    def finalize(self) -> None:
        fin = getattr(self._obj, "finalize", None)
        bls_refused = bls.CURRENT.set(bls.NOT_EXECUTING)
        try:
            if fin is not None:
                fin()
        finally:
            bls.CURRENT.reset(bls_refused)
            loop, thread = self._loop, self._loop_thread
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=5)
                if not thread.is_alive():
                    loop.close()


def rows_of(arr: Any, lo: int, hi: int | None) -> Any:
    """Rows lo..hi of a batched tensor for one request: a numpy copy, or (a GPU instance's
    device state) a torch view of the device rows."""
    if isinstance(arr, np.ndarray):
        return np.array(arr[lo:hi])
    return _torch_for_device_states().from_dlpack(arr)[lo:hi]


def next_device_state(
    current: Any, picked: list[dict[str, Any] | None], spans: list[tuple[int, int]], out_name: str, *, batched: bool
) -> Any:
    """A device state's next value for the whole batch, from the requests' responses (torch on
    the device; rows without a response keep their current value); None when none answered."""
    torch = _torch_for_device_states()
    new = None
    for i, tensors in enumerate(picked):
        value = None if tensors is None else tensors.get(out_name)
        if value is None:
            continue
        value_t = value if isinstance(value, torch.Tensor) else torch.from_dlpack(value)
        if new is None:
            new = torch.from_dlpack(current).clone()
        if not batched:
            new = value_t.to(new.device)
            continue
        lo, hi = spans[i]
        new[lo:hi] = value_t.to(new.device)
    return new


def _torch_for_device_states() -> Any:
    try:
        import torch
    except ImportError as e:
        raise InferenceError(
            Code.UNSUPPORTED,
            "a Triton-style Python model with implicit state on a GPU instance needs torch (pip install torch) to "
            "split its device state by request",
        ) from e
    return torch
