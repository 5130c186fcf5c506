"""The engine's Python path for requests that front-end worker processes send through the rings:
each record becomes an ``InferRequest`` for ``Server.enqueue_streaming``, and each response goes
back to its worker as a reply record with its tensors in to-worker slab blocks.

``handle_records`` takes the records the compiled feeder (``RingFeeder``) leaves to Python, as
its ``take_slow()`` hands them out: ``(worker, target, cancel, header, inputs, client)``: every
request the engine's compiled path does not take (those with a meta block, of models or servers
that need Python per request). Everything runs on the engine's event loop."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from seqserve.engine._core import RequestHeader, ShmRegion
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import InferRequest
from seqserve.engine.responses import InferResult
from seqserve.engine.scope import SequenceScope
from seqserve.engine.server.server import Server
from seqserve.engine.workers import records
from seqserve.engine.workers.records import META_INDEX, RING_MAX_BYTES, ReplyMeta, RequestMeta

log = logging.getLogger("seqserve.workers")

#: (worker, target, cancel, header, inputs, client): one request record, as take_slow() gives it
Record = tuple[int, int, bool, RequestHeader, list[tuple[int, int, int, tuple[int, ...]]], int]
#: sends one message to a worker over its control channel
ControlSend = Callable[[int, Any], None]
#: how often replies that found the reply ring (or the slab pool) full are tried again
RETRY_S = 0.001


class SlowPath:
    """Runs worker requests on the Server and writes their replies. Owns, per worker, the
    requests still running (to cancel them), the stream scopes, and the replies waiting for
    room in a full reply ring (sent in order, never dropped while the worker lives)."""

    def __init__(self, server: Server, region: ShmRegion, control: ControlSend) -> None:
        self._server = server
        self._region = region
        self._control = control
        self._running: dict[tuple[int, int], Callable[[], None]] = {}  # (worker, handle) -> cancel
        self._scopes: dict[tuple[int, int], SequenceScope] = {}  # (worker, scope id)
        self._waiting: dict[int, collections.deque[tuple[int, ReplyMeta | None, list[np.ndarray], bool]]] = {
            w: collections.deque() for w in range(region.workers)
        }
        self._generation = [0] * region.workers  # bumped when a worker is forgotten
        self._retry: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------------ requests

    def handle_records(self, batch: Iterable[Record]) -> None:
        """Submit (or cancel) each record's request, in order; free its input blocks."""
        region = self._region
        for worker, _target, cancel, header, inputs, _client in batch:
            if cancel:
                self.cancel(worker, header.handle)
                continue
            fields = {
                "start": header.start,
                "end": header.end,
                "session": header.session,
                "timeout_us": header.timeout_us,
                "priority": header.priority,
            }
            try:
                meta_at = next(i for i in inputs if i[0] == META_INDEX)
                head = region.buffer(meta_at[1], meta_at[2])
                parts = {
                    index: region.buffer(offset, nbytes) for index, offset, nbytes, _ in inputs if index != META_INDEX
                }
                self.submit_parts(worker, header.handle, head, parts, fields)
            except StopIteration:
                # a compiled-path record whose target is no longer served (its model retired at
                # the drain, or unloaded): answered with a meta block, which tells the worker to
                # send it again with its own, so that it is answered by the model's name
                log.debug("worker %d: request %d came without its meta block: sent back", worker, header.handle)
                self._reply(
                    worker,
                    header.handle,
                    records.error_meta(InferenceError(Code.INTERNAL, "the request's target is no longer served")),
                    [],
                    True,
                )
            finally:
                for _, offset, _, _ in inputs:
                    region.free(worker, True, offset)

    def submit_parts(
        self, worker: int, handle: int, head: bytes | memoryview, parts: dict[int, Any], fields: dict[str, Any]
    ) -> None:
        """One request from its meta block, its tensors' bytes by index (copied out here: the
        blocks are freed at once) and its header's fields."""
        try:
            meta: RequestMeta = records.loads(head)
            arrays = {}
            for index, data in parts.items():
                name, dtype, shape = meta.tensors[index]
                arrays[name] = records.decode_array(dtype, shape, data)
        except Exception as e:  # a malformed record: answered, never run
            log.error("worker %d: cannot decode request %d: %s", worker, handle, e)
            self._reply(worker, handle, records.error_meta(InferenceError(Code.INTERNAL, str(e))), [], True)
            return
        request = InferRequest(
            model=meta.model,
            inputs=arrays,
            version=meta.version,
            id=meta.id,
            sequence_id=meta.sequence_id,
            sequence_start=fields["start"],
            sequence_end=fields["end"],
            outputs=meta.outputs,
            priority=fields["priority"],
            timeout_us=fields["timeout_us"],
            parameters=meta.parameters,
            session=fields["session"],
            client=meta.client,
            trace_parent=meta.trace_parent,
        )
        self.submit(worker, handle, request, meta.session_name, meta.scope)

    def submit(self, worker: int, handle: int, request: InferRequest, session_name: str | None, scope: int) -> None:
        """One request (from a record, or whole from the control channel) onto the Server."""
        if session_name is not None:  # the worker cannot know the model's CORRID type
            request.sequence_id = self._server.session_sequence_id(request.model, request.version, session_name)
        if scope:
            request.scope = self._scopes.setdefault((worker, scope), SequenceScope())
        generation = self._generation[worker]
        finished = False

        def respond(response: InferResult | InferenceError | None, final: bool) -> None:
            nonlocal finished
            if self._generation[worker] != generation:
                return  # that worker died: nobody waits for this
            if final:
                finished = True
                self._running.pop((worker, handle), None)
            if isinstance(response, InferResult):
                meta = ReplyMeta(
                    (response.model_name, response.model_version, response.id, response.parameters), [], None
                )
                arrays = []
                for name, arr in response.outputs.items():
                    arr = np.asarray(arr)
                    meta.tensors.append((name, "", arr.shape))
                    arrays.append(arr)
                self._reply(worker, handle, meta, arrays, final)
            elif isinstance(response, InferenceError):
                self._reply(worker, handle, records.error_meta(response), [], final)
            else:
                self._reply(worker, handle, None, [], final)

        try:
            cancel = self._server.enqueue_streaming(request, respond)
        except InferenceError as e:
            respond(e, True)
            return
        except Exception as e:
            log.exception("worker %d: request to model '%s' failed", worker, request.model)
            respond(InferenceError(Code.INTERNAL, f"request failed: {e}"), True)
            return
        if not finished:  # a refusal may answer inside enqueue_streaming
            self._running[(worker, handle)] = cancel

    def cancel(self, worker: int, handle: int) -> None:
        """The worker's client went away: drop the request (its callback still answers it)."""
        cancel = self._running.pop((worker, handle), None)
        if cancel is not None:
            cancel()

    def close_scope(self, worker: int, scope: int, reason: str) -> int:
        """A worker's stream closed: end the sequences it started (stream-scoped sequences)."""
        s = self._scopes.pop((worker, scope), None)
        if s is None:
            return 0
        s.reason = reason
        return s.close()

    def running(self, worker: int) -> int:
        """Requests of a worker still queued or running in the engine."""
        return sum(1 for w, _ in self._running if w == worker)

    def forget_worker(self, worker: int) -> None:
        """A worker died: cancel what it had queued (its clients are gone), end its streams'
        sequences, and drop what was still to be sent to it."""
        self._generation[worker] += 1
        for key in [k for k in self._running if k[0] == worker]:
            cancel = self._running.pop(key)
            cancel()
        for key in [k for k in self._scopes if k[0] == worker]:
            self._scopes.pop(key).close()
        self._waiting[worker].clear()

    # ------------------------------------------------------------------------- replies

    def _reply(self, worker: int, handle: int, meta: ReplyMeta | None, arrays: list[np.ndarray], final: bool) -> None:
        waiting = self._waiting[worker]
        if waiting or not self._write(worker, handle, meta, arrays, final):
            waiting.append((handle, meta, arrays, final))
            self._arm_retry()

    def _write(self, worker: int, handle: int, meta: ReplyMeta | None, arrays: list[np.ndarray], final: bool) -> bool:
        """One reply into the reply ring, or whole over the control channel when it is too
        large for the ring; False when the ring or the pool is full (try again later)."""
        region = self._region
        if meta is None:
            return region.push_reply(worker, handle, [], final=final)
        parts: list[bytes | memoryview] = []
        for i, arr in enumerate(arrays):
            dtype, data = records.encode_array(arr)
            name, _, shape = meta.tensors[i]
            meta.tensors[i] = (name, dtype, shape)
            parts.append(data)
        head = records.dumps(meta)
        if len(head) + sum(len(p) for p in parts) > RING_MAX_BYTES:
            self._control(worker, ("reply", handle, head, [bytes(p) for p in parts], final))
            return True
        blocks: list[tuple[int, int, int, list[int] | tuple[int, ...]]] = []
        for index, data in [*enumerate(parts), (META_INDEX, head)]:
            n = max(len(data), 1)
            offset = region.alloc(worker, False, n)
            if offset == 0:
                self._free(worker, blocks)
                return False
            region.write(offset, data)
            shape = meta.tensors[index][2] if index != META_INDEX else ()
            blocks.append((index, offset, len(data), shape if len(shape) <= records.RECORD_MAX_RANK else ()))
        code = int(meta.error[1]) if meta.error is not None else 0
        try:
            pushed = region.push_reply(worker, handle, blocks, code=code, final=final)
        except ValueError:  # more tensors than a ring cell holds
            self._free(worker, blocks)
            self._control(worker, ("reply", handle, head, [bytes(p) for p in parts], final))
            return True
        if not pushed:
            self._free(worker, blocks)
        return pushed

    def _free(self, worker: int, blocks: list[tuple[int, int, int, list[int] | tuple[int, ...]]]) -> None:
        for _, offset, _, _ in blocks:
            self._region.free(worker, False, offset)

    def flush(self) -> None:
        """Send the replies that waited for room, in order."""
        self._retry = None
        for worker, waiting in self._waiting.items():
            while waiting:
                handle, meta, arrays, final = waiting[0]
                if not self._write(worker, handle, meta, arrays, final):
                    break
                waiting.popleft()
        if any(self._waiting.values()):
            self._arm_retry()

    def _arm_retry(self) -> None:
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(RETRY_S, self.flush)
