"""A worker's end of the rings: requests go into its request ring with their tensors in
to-engine slab blocks; replies come back on its reply ring, read on the event loop when the
worker's eventfd says so. A full ring or pool is back-pressure: the request waits (in order)
and is retried, never dropped, and the worker stops reading its connections (its ``ReadGate``)
until every request it read is on the ring. A cancel waits in that same line (the compiled path
only hears of a cancel through the ring)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from seqserve.api.transport.read_gate import ReadGate
from seqserve.api.workers import fast_requests
from seqserve.api.workers.channel import Channel
from seqserve.api.workers.fast_requests import FastRequest
from seqserve.engine import Code, InferenceError, InferRequest, InferResult
from seqserve.engine.workers import (
    META_INDEX,
    REPLY_ERROR,
    REPLY_FINAL,
    RING_MAX_BYTES,
    ReplyMeta,
    RequestHeader,
    RequestMeta,
    ShmRegion,
    records,
)

log = logging.getLogger("seqserve.workers")

#: gets each response of a request: a result, an error, or None (a bare final flag)
OnResponse = Callable[[InferResult | InferenceError | None, bool], None]
#: how often a request waiting for ring or pool room is tried again
RETRY_S = 0.0005
#: the least time between two log lines about a full ring (each says how often it happened)
FULL_LOG_EVERY_S = 10.0

_Block = tuple[int, int, int, list[int] | tuple[int, ...]]


class RingClient:
    """Sends one worker's requests and routes their replies. Event-loop only."""

    def __init__(
        self, region: ShmRegion, worker: int, control: Channel, handle_base: int = 0, read_gate: ReadGate | None = None
    ) -> None:
        """``read_gate``: closed while requests wait for room (the worker's connections register)."""
        self._region = region
        self._worker = worker
        self._control = control
        self._handles = itertools.count(handle_base + 1)
        self._waiting: dict[int, OnResponse] = {}  # handle -> its response callback
        self._fast: dict[int, FastRequest] = {}  # handle -> what answers it (compiled path)
        # requests (and cancels: handle None) that found no room, in arrival order, each with
        # the push to try again
        self._blocked: collections.deque[tuple[int | None, Callable[[], bool]]] = collections.deque()
        self._retry: asyncio.TimerHandle | None = None
        self.read_gate = read_gate or ReadGate()
        self._next_full_log = 0.0
        self._fd = region.worker_eventfds[worker]
        self._engine_wake_due = False  # a wake_engine is scheduled for this event-loop pass

    def start(self) -> None:
        os.set_blocking(self._fd, False)
        asyncio.get_running_loop().add_reader(self._fd, self._on_wakeup)
        self._on_wakeup()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._fd)

    # ------------------------------------------------------------------------ requests

    def submit(
        self,
        request: InferRequest,
        on_response: OnResponse,
        target: int,
        session_name: str | None,
        scope: int,
        *,
        handle: int = 0,
    ) -> int:
        """Queue ``request``; returns its handle (for ``cancel``): a new one, or ``handle``."""
        handle = handle or next(self._handles)
        self._waiting[handle] = on_response
        meta = RequestMeta(
            request.model,
            request.version,
            request.id,
            request.sequence_id,
            request.outputs,
            request.parameters,
            request.client,
            request.trace_parent,
            session_name,
            scope,
        )
        parts: list[Any] = []
        for name, arr in request.inputs.items():
            dtype, data = records.encode_array(np.asarray(arr))
            meta.tensors.append((name, dtype, tuple(arr.shape)))
            parts.append(data)
        head = records.dumps(meta)
        header = None
        if len(head) + sum(len(p) for p in parts) <= RING_MAX_BYTES:
            with contextlib.suppress(TypeError, ValueError, OverflowError):  # a field the record cannot hold
                header = RequestHeader(
                    handle=handle,
                    sequence_id=request.sequence_id,
                    start=request.sequence_start,
                    end=request.sequence_end,
                    session=request.session,
                    timeout_us=request.timeout_us,
                    priority=request.priority,
                )
        if header is None:
            fields = {
                "start": request.sequence_start,
                "end": request.sequence_end,
                "session": request.session,
                "timeout_us": request.timeout_us,
                "priority": request.priority,
            }
            self._control.send(("infer", handle, head, [bytes(p) for p in parts], fields))
            return handle
        self._send(handle, lambda: self._push(handle, target, header, head, parts))
        return handle

    def submit_fast(self, fast: FastRequest, on_response: OnResponse) -> int:
        """Queue a request the engine's compiled path takes (validated here); returns its handle."""
        handle = next(self._handles)
        self._waiting[handle] = on_response
        self._fast[handle] = fast
        header = fast_requests.header_of(fast.checked, handle)
        self._send(handle, lambda: self._push_fast(fast.model.target, header, fast.checked.buffers))
        return handle

    def _send(self, handle: int | None, push: Callable[[], bool]) -> None:
        if self._blocked:
            self._blocked.append((handle, push))
        elif push():
            self._wake_engine_soon()
        else:
            self._blocked.append((handle, push))
            self._hold()
            self._arm_retry()

    def _hold(self) -> None:
        """The ring or the pool is full: no connection reads until what was read is sent."""
        gate = self.read_gate
        gate.close()
        now = time.monotonic()
        if now >= self._next_full_log:
            self._next_full_log = now + FULL_LOG_EVERY_S
            log.warning(
                "worker %d: the request ring to the engine (or its slab pool) is full; reading paused on "
                "%d connection(s) until it has room (pause %d since the worker started; %.1f s paused before)",
                self._worker,
                gate.connections,
                gate.closings,
                gate.closed_s,
            )

    def _push_fast(self, target: int, header: RequestHeader, buffers: tuple[Any, ...]) -> bool:
        """Inputs in config order, each in its own block, no meta block."""
        region, w = self._region, self._worker
        blocks: list[_Block] = []
        for index, arr in enumerate(buffers):
            offset = region.alloc(w, True, max(arr.nbytes, 1))
            if offset == 0:
                self._free(blocks, True)
                return False
            region.write(offset, arr)  # the validator's buffers are C-contiguous
            blocks.append((index, offset, arr.nbytes, arr.shape))
        try:
            pushed = region.push_request(w, target, header, blocks, client=header.client, wake=False)
        except ValueError as e:  # a record too large for a ring cell (fast_model keeps them small)
            self._free(blocks, True)
            self._fast.pop(header.handle, None)
            self._deliver(header.handle, InferenceError(Code.INTERNAL, f"cannot send the request: {e}"), True)
            return True
        if not pushed:
            self._free(blocks, True)
        return pushed

    def _push(self, handle: int, target: int, header: RequestHeader, head: bytes, parts: list[Any]) -> bool:
        region, w = self._region, self._worker
        blocks: list[_Block] = []
        metas = records.loads(head).tensors if parts else []
        for index, data in [*enumerate(parts), (META_INDEX, head)]:
            offset = region.alloc(w, True, max(len(data), 1))
            if offset == 0:
                self._free(blocks, True)
                return False
            region.write(offset, data)
            shape = metas[index][2] if index != META_INDEX else ()
            blocks.append((index, offset, len(data), shape if len(shape) <= records.RECORD_MAX_RANK else ()))
        try:
            pushed = region.push_request(w, target, header, blocks, slow=True, wake=False)
        except ValueError:  # more than a ring cell holds: the control channel takes it whole
            self._free(blocks, True)
            self._control.send(("infer", handle, head, [bytes(p) for p in parts], header_fields(header)))
            return True
        if not pushed:
            self._free(blocks, True)
        return pushed

    def _wake_engine_soon(self) -> None:
        """Requests go on the ring without waking the engine; one wake-up follows the event
        loop's pass that pushed them, so that the engine drains (and batches) the pass's
        requests together rather than waking for the first (bench/docs/workers.md)."""
        if not self._engine_wake_due:
            self._engine_wake_due = True
            asyncio.get_running_loop().call_soon(self._wake_engine)

    def _wake_engine(self) -> None:
        self._engine_wake_due = False
        self._region.wake_engine()

    def _free(self, blocks: list[_Block], to_engine: bool) -> None:
        for _, offset, _, _ in blocks:
            self._region.free(self._worker, to_engine, offset)

    def _arm_retry(self) -> None:
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self._flush)

    def _flush(self) -> None:
        self._retry = None
        blocked = self._blocked
        while blocked:
            handle, push = blocked[0]
            if handle is None or handle in self._waiting:
                if not push():
                    self._arm_retry()
                    return
                self._wake_engine_soon()
            blocked.popleft()
        self.read_gate.open()

    def cancel(self, handle: int) -> None:
        """The client went away: the engine drops the request; its replies are not waited for."""
        fast = self._fast.pop(handle, None)
        if self._waiting.pop(handle, None) is None:
            return
        if any(b[0] == handle for b in self._blocked):
            return  # never sent: _flush skips it
        header = RequestHeader(handle=handle)
        # the compiled path knows a cancel by its request's target; the slow path by its handle
        target = fast.model.target if fast is not None else records.BY_NAME
        self._send(None, lambda: self._region.push_request(self._worker, target, header, [], cancel=True, wake=False))

    # ------------------------------------------------------------------------- replies

    def _on_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        while True:
            self._drain()
            if not self._region.arm_reply_wakeup(self._worker):
                return

    def _drain(self) -> None:
        region, w = self._region, self._worker
        while replies := region.pop_replies(w):
            for handle, flags, code, error, outputs in replies:
                fast = self._fast.pop(handle, None) if flags & REPLY_FINAL else None
                if fast is not None:
                    self._deliver_fast(handle, fast, flags, code, error, outputs)
                else:
                    self._deliver_slow(handle, bool(flags & REPLY_FINAL), code, error, outputs)

    def _deliver_fast(
        self, handle: int, fast: FastRequest, flags: int, code: int, error: str | None, outputs: list[Any]
    ) -> None:
        region, w = self._region, self._worker
        if any(index == META_INDEX for index, _, _, _ in outputs):
            # The engine's Python path answered the record: its target was gone (the model
            # retired or unloaded). Sent again with its meta block under the same handle, the
            # engine answers it by the model's name, as one process does.
            for _, offset, _, _ in outputs:
                region.free(w, False, offset)
            on_response = self._waiting.pop(handle, None)
            if on_response is not None:
                self.submit(fast.checked.request, on_response, records.BY_NAME, None, 0, handle=handle)
            return
        response: InferResult | InferenceError
        try:
            if flags & REPLY_ERROR or code:
                response = fast_requests.error_of(fast, flags, code, error or "")
            else:
                arrays = [(index, (region.read(offset, nbytes), shape)) for index, offset, nbytes, shape in outputs]
                response = fast_requests.result_of(fast, arrays)
        except Exception as e:
            log.error("worker %d: cannot decode the reply to request %d: %s", w, handle, e)
            response = InferenceError(Code.INTERNAL, f"cannot decode the engine's reply: {e}")
        finally:
            for _, offset, _, _ in outputs:
                region.free(w, False, offset)
        self._deliver(handle, response, True)

    def _deliver_slow(self, handle: int, final: bool, code: int, error: str | None, outputs: list[Any]) -> None:
        region, w = self._region, self._worker
        meta: ReplyMeta | None = None
        arrays: list[tuple[int, memoryview]] = []
        try:
            for index, offset, nbytes, _shape in outputs:
                if index == META_INDEX:
                    meta = records.loads(region.buffer(offset, nbytes))
                else:
                    arrays.append((index, region.buffer(offset, nbytes)))
            response = self._response(meta, arrays, code, error)
        except Exception as e:
            log.error("worker %d: cannot decode the reply to request %d: %s", w, handle, e)
            response = InferenceError(Code.INTERNAL, f"cannot decode the engine's reply: {e}")
        finally:
            for _, offset, _, _ in outputs:
                region.free(w, False, offset)
        self._deliver(handle, response, final)

    def deliver_whole(self, handle: int, head: bytes, parts: list[bytes], final: bool) -> None:
        """A reply that came over the control channel (too large for the ring)."""
        meta: ReplyMeta = records.loads(head)
        self._deliver(handle, self._response(meta, list(enumerate(parts)), 0, None), final)

    @staticmethod
    def _response(
        meta: ReplyMeta | None, arrays: list[tuple[int, Any]], code: int, error: str | None
    ) -> InferResult | InferenceError | None:
        if meta is None:
            return None if error is None and code == 0 else InferenceError(Code(code), error or "")
        if meta.error is not None:
            return records.error_of(meta)
        outputs = {}
        for index, data in arrays:
            name, dtype, shape = meta.tensors[index]
            outputs[name] = records.decode_array(dtype, shape, data)
        return records.result_of(meta, outputs)

    def _deliver(self, handle: int, response: InferResult | InferenceError | None, final: bool) -> None:
        on_response = self._waiting.pop(handle, None) if final else self._waiting.get(handle)
        if on_response is not None:
            on_response(response, final)

    def fail_all(self, reason: str) -> None:
        """The engine is gone: every request still waiting gets an error."""
        waiting, self._waiting = self._waiting, {}
        for on_response in waiting.values():
            on_response(InferenceError(Code.UNAVAILABLE, reason), True)


def header_fields(header: RequestHeader) -> dict[str, Any]:
    """A request header's fields, for a request the control channel carries."""
    return {
        "start": header.start,
        "end": header.end,
        "session": header.session,
        "timeout_us": header.timeout_us,
        "priority": header.priority,
    }
