"""One ModelStreamInfer call: the requests a client sends on a gRPC stream and the replies
written back, as Triton writes them."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api import grpc_codec
from seqserve.engine import Code, InferenceError, InferResult, OrderedRelease, Server

log = logging.getLogger("seqserve.grpc")

#: what the session writes: a stream message, or (``triton_grpc_error``) the error that ends the stream
Reply = pb.ModelStreamInferResponse | InferenceError
#: a reply (None: nothing to write) and whether it is its request's last
_Item = tuple[Reply | None, bool]


class StreamSession:
    """``read`` submits the stream's requests in arrival order, so each sequence keeps its
    order; ``replies`` yields what to write as the responses come: one per request for most
    models, any number for decoupled ones.

    As in Triton, the replies to non-decoupled requests (and refusals) are written in request
    order; a decoupled request's responses are written as they come. Every response carries
    ``triton_final_response``; a final flag that comes without a response is written (as an
    empty response) only for requests that set ``triton_enable_empty_final_response``. A
    failing request gets an ``error_message`` reply and the stream goes on, unless the client
    sent the ``triton_grpc_error: true`` header (``grpc_errors``): then ``replies`` yields the
    first error as an ``InferenceError`` and the servicer ends the stream with its status.
    ``close`` cancels the requests still open when the stream ends early (client cancel or
    disconnect): their models see ``is_cancelled()``.
    """

    __slots__ = ("_grpc_errors", "_in_order", "_open", "_queue", "_server", "_unfinished")

    def __init__(self, server: Server, *, grpc_errors: bool) -> None:
        self._server = server
        self._grpc_errors = grpc_errors
        # replies ready to write; None marks the end of the request stream
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue()
        self._in_order: OrderedRelease[_StreamRequest] = OrderedRelease(self._release)
        self._open: set[_StreamRequest] = set()  # submitted, final response not yet come
        self._unfinished = 0  # requests read whose last reply has not been taken from the queue

    async def read(self, requests: AsyncIterator[pb.ModelInferRequest]) -> None:
        async for msg in requests:
            self.submit(msg)
        self._queue.put_nowait(None)

    def submit(self, msg: pb.ModelInferRequest) -> None:
        """Decode and queue one request; a refusal is its one (error) reply."""
        self._unfinished += 1
        req = _StreamRequest(msg.id, msg.model_name, msg.model_version)
        try:
            if not self._server.model(msg.model_name, msg.model_version).decoupled:
                self._hold_place(req)
            request, options = grpc_codec.decode_request(msg)
            req.empty_final = options.empty_final
            req.cancel = self._server.enqueue_streaming(request, functools.partial(self._respond, req))
            self._open.add(req)
        except Exception as e:  # refused: one error reply, and the stream goes on
            err = e if isinstance(e, InferenceError) else _internal(e)
            if not req.ordered:  # an unknown model: Triton orders its reply too
                self._hold_place(req)
            self._put(req, err if self._grpc_errors else req.error(err), True)

    async def replies(self) -> AsyncIterator[Reply]:
        """What to write, until the request stream has ended and every request is answered."""
        reading = True
        while reading or self._unfinished:
            item = await self._queue.get()
            if item is None:
                reading = False
                continue
            reply, last = item
            if last:
                self._unfinished -= 1
            if reply is not None:
                yield reply

    def close(self) -> None:
        """The stream has ended: cancel the requests still open."""
        for req in self._open:
            req.cancel()
        self._open.clear()

    # ------------------------------------------------------------------ internals

    def _respond(self, req: _StreamRequest, response: InferResult | InferenceError | None, final: bool) -> None:
        """The engine's callback (on the event loop) for each of ``req``'s responses."""
        if final:
            self._open.discard(req)
        reply: Reply | None
        if isinstance(response, InferenceError):
            reply = response if self._grpc_errors else req.error(response, final)
        elif response is not None:
            reply = grpc_codec.stream_response(response, final)
        elif req.empty_final:  # a final flag alone, written only when the client asked for it
            reply = grpc_codec.stream_empty_final(req.id, req.model, req.version)
        else:  # a bare final flag: nothing to write
            reply = None
        self._put(req, reply, final)

    def _hold_place(self, req: _StreamRequest) -> None:
        req.ordered = True
        self._in_order.add(req)

    def _put(self, req: _StreamRequest, reply: Reply | None, last: bool) -> None:
        if req.ordered:
            req.outcome = (reply, last)
            self._in_order.release_ready()
        else:
            self._queue.put_nowait((reply, last))

    def _release(self, req: _StreamRequest) -> None:
        self._queue.put_nowait(req.outcome)


class _StreamRequest:
    """One request of the stream, from submit to its last reply."""

    __slots__ = ("cancel", "empty_final", "id", "model", "ordered", "outcome", "version")

    def __init__(self, request_id: str, model: str, version: str) -> None:
        self.id = request_id
        self.model = model  # as requested, for the replies that carry no result
        self.version = version
        self.empty_final = False
        self.ordered = False  # its reply waits for those of the requests before it
        self.outcome: _Item | None = None  # ordered: its reply, once known
        self.cancel: Callable[[], None] = _nothing

    def error(self, err: InferenceError, final: bool | None = None) -> pb.ModelStreamInferResponse:
        return grpc_codec.stream_error(self.id, self.model, self.version, err, final)


def _nothing() -> None:
    pass


def _internal(e: Exception) -> InferenceError:
    log.exception("stream request failed")
    return InferenceError(Code.INTERNAL, f"{type(e).__name__}: {e}")
