"""Getting answers back to clients: per-request records, splitting a batch's outputs into
replies, responders (late and repeated responses from any thread), ordered release, and
resolving futures or calling stream callbacks on the event loop.

Thread contract: ``split``, ``responder`` and ``respond`` run on executor threads (or any
thread, for responders; or the event loop, for a batch run inline); everything that touches a
future or a callback runs on the event loop, reached with ``loop.call_soon_threadsafe`` once
per batch or once per sent response, or directly (``deliver``) by a batch run inline there.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.base import RequestResults
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.validation import CheckedRequest
from seqserve.engine.ordering import OrderedRelease
from seqserve.engine.responses import DEFERRED, RESCHEDULE, InferResult, Outcome, Responder, ResponseCallback
from seqserve.engine.tensors import to_numpy_dtype, wire_dtype_name

log = logging.getLogger("seqserve.model")

Reply = dict[str, np.ndarray] | InferenceError


@dataclass(slots=True, eq=False)
class Pending:
    """A queued request, from submit until it is answered for good."""

    #: the request as the model accepted it; its buffers stay alive while the core reads them
    checked: CheckedRequest
    future: asyncio.Future[InferResult] | None  # None for streaming submits
    on_response: ResponseCallback | None  # streaming submits: gets every response
    parameters: dict[str, Any] | None  # response parameters (a generated sequence id)
    ordered: bool  # answered in submit order (preserve_ordering)
    outcome: Any = None  # preserve_ordering: the result or error, once known
    # Responder bookkeeping (under Delivery._lock):
    sent: int = 0  # responses sent
    closed: bool = False  # answered for good: final response sent, answered by execute's return, or failed
    cancelled: bool = False  # the client is gone (streaming submits; see is_cancelled)
    handle: int = 0  # the core's names for it, for cancel: the request handle ...
    token: int = -1  # ... and the token submit returned (-1: not queued)

    def is_cancelled(self) -> bool:
        # a unary caller that went away cancelled the future it was awaiting
        return self.cancelled or (self.future is not None and self.future.cancelled())


class Delivery:
    """Replies of one model version."""

    def __init__(
        self, cfg: mc.ModelConfig, version: str, loop: asyncio.AbstractEventLoop, *, preserve_ordering: bool
    ) -> None:
        self.name = cfg.name
        self.version = version
        self.max_batch_size = cfg.max_batch_size
        self.decoupled = cfg.model_transaction_policy.decoupled
        self.preserve_ordering = preserve_ordering
        self.request_failures = 0  # requests failed alone (their batch succeeded)
        self._loop = loop
        self._outputs = {t.name: t for t in cfg.output}
        self._dtypes = {t.name: np.dtype(to_numpy_dtype(t.data_type) or np.uint16) for t in cfg.output}
        self._lock = threading.Lock()
        self._open: set[Pending] = set()  # requests with a responder and no final response yet
        self._ordered: OrderedRelease[Pending] = OrderedRelease(_resolve_settled)

    @property
    def open_responses(self) -> int:
        """Requests a responder may still answer (no final response yet)."""
        return len(self._open)

    def open_responses_besides(self, recs: list[Pending]) -> int:
        """``open_responses``, not counting ``recs``."""
        with self._lock:
            return len(self._open.difference(recs))

    def track_order(self, rec: Pending) -> None:
        if rec.ordered:
            self._ordered.add(rec)

    # ------------------------------------------------------------ executor thread

    def replies(
        self,
        recs: list[Pending | None],
        size: int,
        produced: Mapping[str, np.ndarray],
        *,
        responders: bool,
        rows: list[int] | None = None,
    ) -> list[tuple[Pending, Reply]]:
        """A batch ran: its outputs split into replies (raises InferenceError when the outputs
        are unusable; the caller then fails the batch). ``responders``: the batch had them.
        ``rows``: each entry's batch rows, where entries without a Pending are not all one row
        (requests from the workers' rings, answered by model/rings.py)."""
        replies = self._split(size, recs, produced, rows)
        return self._close_answered(replies) if responders else replies

    def post(self, replies: list[tuple[Pending, Reply]]) -> None:
        """Hand a batch's replies to the event loop: one wake-up per batch."""
        self._loop.call_soon_threadsafe(self._deliver, replies)

    def deliver(self, replies: list[tuple[Pending, Reply]]) -> None:
        """Event loop (a batch run inline): answer the batch's requests now."""
        self._deliver(replies)

    def batch_failed(
        self,
        recs: list[Pending | None],
        err: InferenceError,
        per_request: Callable[[Pending, InferenceError], InferenceError] | None = None,
    ) -> None:
        """The model failed this batch: only requests not yet answered get the error, or what
        ``per_request`` makes of it for each (on the event loop)."""
        with self._lock:  # a responder may have answered some already
            failed = [r for r in recs if r is not None and not r.closed and not self._answered(r)]
            for r in recs:
                if r is not None:
                    r.closed = True
                    self._open.discard(r)
        self._loop.call_soon_threadsafe(self._fail_all, failed, err, per_request)

    def refused(self, recs: list[Pending], err: InferenceError) -> None:
        """The core dropped these queued requests (timeouts, expiry, shutdown)."""
        if recs:
            self._loop.call_soon_threadsafe(self._fail_all, recs, err)

    def decoupled_results(
        self, recs: list[Pending | None], produced: Mapping[str, np.ndarray] | None
    ) -> Mapping[str, np.ndarray]:
        """A decoupled model answers through responders: what execute returned holds output
        states only, and every request stays open (tracked) until its final response."""
        with self._lock:
            for r in recs:
                if r is not None and not r.closed:
                    self._open.add(r)
        if isinstance(produced, RequestResults):
            return produced
        return RequestResults([DEFERRED] * len(recs), produced)

    def _split(
        self, size: int, recs: list[Pending | None], produced: Mapping[str, np.ndarray], rows: list[int] | None = None
    ) -> list[tuple[Pending, Reply]]:
        if isinstance(produced, RequestResults):
            return self._split_requests(recs, produced.outcomes)
        arrays: dict[str, np.ndarray] = {}
        per_request: dict[str, list[np.ndarray]] = {}
        needed = {o for r in recs if r is not None for o in r.checked.outputs}
        for o in needed:
            value = produced.get(o)
            if value is None:
                raise InferenceError(Code.INTERNAL, f"model '{self.name}' did not produce output '{o}'")
            if isinstance(value, list | tuple):  # one array per request: shapes may differ (ragged)
                per_request[o] = self._request_outputs(o, value, recs)
                continue
            arr = self._owned_output(o, value)
            if self.max_batch_size > 0 and (arr.ndim == 0 or arr.shape[0] != size):
                raise InferenceError(
                    Code.INTERNAL,
                    f"model '{self.name}' produced output '{o}' with shape {list(arr.shape)}; "
                    f"expected batch dimension {size}",
                )
            arrays[o] = arr
        if self.max_batch_size == 0:  # one request, no batch dimension
            return [
                (rec, {o: per_request[o][i] if o in per_request else arrays[o] for o in rec.checked.outputs})
                for i, rec in enumerate(recs)
                if rec is not None
            ]
        replies: list[tuple[Pending, Reply]] = []
        row = 0
        for i, rec in enumerate(recs):
            if rec is None:  # padding, a final END step or a ring request: no reply here
                row += 1 if rows is None else rows[i]
                continue
            end = row + rec.checked.rows
            replies.append(
                (rec, {o: per_request[o][i] if o in per_request else arrays[o][row:end] for o in rec.checked.outputs})
            )
            row = end
        return replies

    def _request_outputs(self, name: str, values: list[Any] | tuple[Any, ...], recs: list[Pending | None]) -> list[Any]:
        """An output given as one array per request of the batch (its shape is that request's
        own, as for ragged inputs): checked, and owning its data."""
        if len(values) != len(recs):
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self.name}' produced output '{name}' as a list of {len(values)} arrays; "
                f"expected one per request of the batch ({len(recs)})",
            )
        out: list[Any] = []
        for rec, value in zip(recs, values, strict=True):
            if rec is None or name not in rec.checked.outputs:  # padding, or not asked for: not checked
                out.append(None)
                continue
            arr = self._owned_output(name, value)
            if self.max_batch_size > 0 and (arr.ndim == 0 or arr.shape[0] != rec.checked.rows):
                raise InferenceError(
                    Code.INTERNAL,
                    f"model '{self.name}' produced output '{name}' with shape {list(arr.shape)} for a request "
                    f"of {rec.checked.rows} row(s); expected batch dimension {rec.checked.rows}",
                )
            out.append(arr)
        return out

    def _split_requests(
        self, recs: list[Pending | None], outcomes: list[Mapping[str, np.ndarray] | InferenceError | None]
    ) -> list[tuple[Pending, Reply]]:
        """Replies from a RequestResults: each request's own outputs, or its own error."""
        if len(outcomes) != len(recs):
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self.name}' gave {len(outcomes)} per-request results for a batch of {len(recs)} requests",
            )
        replies: list[tuple[Pending, Reply]] = []
        for rec, outcome in zip(recs, outcomes, strict=True):
            if rec is not None and outcome is not DEFERRED and outcome is not RESCHEDULE:
                reply = outcome if isinstance(outcome, InferenceError) else self._request_reply(rec, outcome)
                if isinstance(reply, InferenceError):
                    self.request_failures += 1
                replies.append((rec, reply))
        return replies

    def _request_reply(self, rec: Pending, outcome: Mapping[str, np.ndarray] | None, *, copy: bool = False) -> Reply:
        outs: dict[str, np.ndarray] = {}
        for o in rec.checked.outputs:
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
        want = self._dtypes[name]
        if arr.dtype != want and not (want.kind == "O" and arr.dtype.kind in "OSU"):
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self.name}' produced output '{name}' as {arr.dtype}, but its config says "
                f"{wire_dtype_name(self._outputs[name].data_type)}",
            )
        return arr.copy() if copy or arr.base is not None else arr

    # ------------------------------------------------- responders (any thread)

    def responder(self, recs: list[Pending | None], i: int) -> Responder:
        rec = recs[i]
        if rec is None:  # a final END step: nobody waits for its responses
            return Responder(_drop, _true)
        with self._lock:
            if not rec.closed:
                self._open.add(rec)
        return Responder(functools.partial(self._respond, rec), rec.is_cancelled)

    def _close_answered(self, replies: list[tuple[Pending, Reply]]) -> list[tuple[Pending, Reply]]:
        """Requests answered by execute's return are closed to their responders; one that a
        responder already ended keeps that answer (a request is answered once)."""
        with self._lock:
            kept = [(rec, reply) for rec, reply in replies if not rec.closed and not self._answered(rec)]
            for rec, _ in kept:
                rec.closed = True
                self._open.discard(rec)
        return kept

    def _answered(self, rec: Pending) -> bool:
        """A non-decoupled request is answered by its one response, final flag or not."""
        return rec.sent > 0 and not self.decoupled

    def _respond(self, rec: Pending, outcome: Outcome, final: bool) -> None:
        """Any thread: check and copy one response, then hand it to the event loop."""
        if rec.closed:  # checked again under the lock; this only saves the copy
            raise InferenceError(Code.INTERNAL, "Unable to send response. Response sender has been closed.")
        # always a copy: a model may reuse its buffer for the next response
        reply = self._request_reply(rec, outcome, copy=True) if isinstance(outcome, Mapping) else outcome
        with self._lock:
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
            # Bookkeeping before the post: once the loop has the final response, its client may
            # look at open_responses (and a batch run inline posts from the loop itself).
            if outcome is not None:
                rec.sent += 1
            if final:
                rec.closed = True
            if final or self._answered(rec):  # nothing left to wait for at shutdown
                self._open.discard(rec)
            try:  # posted under the lock so that a request's responses keep their order
                self._loop.call_soon_threadsafe(self._on_response, rec, reply, final)
            except RuntimeError:  # the event loop is gone: the server has stopped
                rec.closed = True
                self._open.discard(rec)
                raise InferenceError(Code.UNAVAILABLE, "Unable to send response. The server has stopped.") from None

    def close_open(self) -> None:
        """At unload: fail every request still waiting for its final response."""
        with self._lock:
            unanswered = [r for r in self._open if not r.closed and not self._answered(r)]
            for r in unanswered:
                r.closed = True
            self._open.clear()
        if not unanswered:
            return
        err = InferenceError(
            Code.UNAVAILABLE,
            f"model '{self.name}' was unloaded before it sent the final response for this request",
        )
        for r in unanswered:
            try:
                self._loop.call_soon_threadsafe(self._on_response, r, err, True)
            except RuntimeError:  # the loop is gone: nobody is waiting
                break

    # ------------------------------------------------------------- event loop

    def _on_response(self, rec: Pending, reply: Reply | None, final: bool) -> None:
        result: InferResult | InferenceError | None = (
            InferResult(self.name, self.version, rec.checked.request.id, reply, rec.parameters or {})
            if isinstance(reply, dict)
            else reply
        )
        if self.decoupled:  # an error response is one of many: the request's outcome is its batch's
            if rec.on_response is not None:
                _call(rec.on_response, result, final)
            trace = rec.checked.request.trace
            if final and trace is not None:
                trace.answered(result)
            return
        if result is not None:  # its one response answers it now; a final flag may follow
            if isinstance(result, InferenceError):
                self.request_failures += 1
            self._settle(rec, result)
            if self.preserve_ordering:
                self._ordered.release_ready()

    def _deliver(self, replies: list[tuple[Pending, Reply]]) -> None:
        for rec, outs in replies:
            if isinstance(outs, InferenceError):
                self._settle(rec, outs)
                continue
            self._settle(rec, InferResult(self.name, self.version, rec.checked.request.id, outs, rec.parameters or {}))
        if self.preserve_ordering:
            self._ordered.release_ready()

    def _fail_all(
        self,
        recs: list[Pending],
        err: InferenceError,
        per_request: Callable[[Pending, InferenceError], InferenceError] | None = None,
    ) -> None:
        for rec in recs:
            self._settle(rec, InferenceError(err.code, err.message) if per_request is None else per_request(rec, err))
        if self.preserve_ordering:
            self._ordered.release_ready()

    def _settle(self, rec: Pending, outcome: InferResult | InferenceError) -> None:
        if rec.ordered:
            rec.outcome = outcome
        else:
            _resolve(rec, outcome)


def _resolve(rec: Pending, outcome: InferResult | InferenceError) -> None:
    trace = rec.checked.request.trace
    if trace is not None:
        trace.answered(outcome)
    if rec.on_response is not None:
        _call(rec.on_response, outcome, True)
    elif rec.future is not None and not rec.future.done():
        if isinstance(outcome, InferenceError):
            rec.future.set_exception(outcome)
        else:
            rec.future.set_result(outcome)


def _resolve_settled(rec: Pending) -> None:
    _resolve(rec, rec.outcome)


def _call(on_response: ResponseCallback, outcome: InferResult | InferenceError | None, final: bool) -> None:
    try:
        on_response(outcome, final)
    except Exception:  # one consumer's bug must not stop the others' replies
        log.exception("response callback failed")


def _drop(outcome: Outcome, final: bool) -> None:
    pass


def _true() -> bool:
    return True
