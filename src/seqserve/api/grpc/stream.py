"""One ModelStreamInfer call: the requests a client sends on a gRPC stream and the replies
written back, as Triton writes them (or, on request, as they complete)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.errors import internal_error
from seqserve.api.grpc import codec, wire
from seqserve.api.grpc.shared_memory_rpcs import placed_stream_entries
from seqserve.api.limits import DEFAULT_GRPC_STREAM_BACKLOG, offload
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.tensor_extensions import TensorExtensions
from seqserve.engine import (
    Code,
    InferenceError,
    InferRequest,
    InferResult,
    OrderedRelease,
    SequenceId,
    SequenceScope,
    Server,
)

log = logging.getLogger("seqserve.grpc")

#: stream header (gRPC metadata): "completion" writes each reply as soon as it is known instead of
#: in request order; replies carry their request's id, which tritonclient matches them by
REPLY_ORDER_HEADER = "seqserve-reply-order"
#: stream header: "true" ends the sequences started on the stream when it closes (freeing their
#: slots at once), "false" keeps them to the idle timeout whatever the server's default
STREAM_SCOPED_HEADER = "seqserve-stream-scoped"
#: how long the head reply of a request-order stream may hold back later replies that are ready
#: before the stream counts as stalled (and a line is logged)
DEFAULT_STALL_THRESHOLD_S = 1.0
#: at most one stall line per this many seconds per server (the others are counted)
STALL_LOG_INTERVAL_S = 10.0

#: why a stream ends with UNAVAILABLE when the drain begins on a replica with a state store: its
#: sequences are on their way to the store, and a new stream (through the balancer) continues them
DRAIN_HANDOFF_MESSAGE = "server is draining: reopen the stream; its sequences continue on another replica"
#: why a stream ends with UNAVAILABLE in a plain shutdown (no state store), once the engine has
#: drained: every request the stream took was answered
SHUTDOWN_MESSAGE = "server is shutting down: the stream is closed; requests that got no reply were not run"

#: what the session writes: a serialized ModelStreamInferResponse (``wire``), or
#: (``triton_grpc_error``) the error that ends the stream
Reply = bytes | InferenceError
#: a reply (None: nothing to write) and whether it is its request's last
_Item = tuple[Reply | None, bool]


@dataclass(slots=True)
class StreamStats:
    """Counters of one gRPC front-end's streams (event loop only), for the operator and the
    metrics endpoint: how streams are used and how often request order held replies back."""

    streams: int = 0  # ModelStreamInfer calls opened
    completion_order_streams: int = 0  # ... with seqserve-reply-order: completion
    stream_scoped_streams: int = 0  # ... whose sequences end with the stream
    scoped_sequences_ended: int = 0  # sequences ended because their stream closed
    stalls: int = 0  # head replies that held back ready replies longer than the threshold
    stalls_by_model: dict[str, int] = field(default_factory=dict)  # the head request's model
    stall_threshold_s: float = DEFAULT_STALL_THRESHOLD_S
    refused_at_once: int = 0  # temporary refusals written ahead of the replies before them
    reading_paused: int = 0  # times a stream stopped reading: its backlog of unanswered requests was full
    _last_log: float = -1e9
    _unlogged: int = 0

    def stalled(self, model: str, line: str) -> None:
        self.stalls += 1
        self.stalls_by_model[model] = self.stalls_by_model.get(model, 0) + 1
        now = time.monotonic()
        if now - self._last_log < STALL_LOG_INTERVAL_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more since the last such line)" if self._unlogged else ""
        log.warning("%s%s", line, more)
        self._last_log = now
        self._unlogged = 0


class StreamSession:
    """``read_calls`` submits the stream's requests in arrival order, so each sequence keeps
    its order; ``next_replies`` hands out what to write as the responses come: one per request
    for most models, any number for decoupled ones.

    As in Triton, the replies to non-decoupled requests (and refusals) are written in request
    order; a decoupled request's responses are written as they come. With ``completion_order``
    (the ``seqserve-reply-order: completion`` header) every reply is written as it comes.
    A temporary refusal (UNAVAILABLE with a retry hint: a full backlog, a draining server) is
    written at once in either order, with ``[request id: ...]`` leading its message in request
    order: held in line behind a START that waits for a slot, a flood of refusals would cost
    memory the client never takes back, and the client could not learn of them in time.

    At most ``max_backlog`` requests are read and not yet answered (their last reply not yet
    taken by the writer): beyond, reading pauses until replies are written, so a client that
    sends without reading waits on HTTP/2 flow control instead of growing the server.
    Every response carries ``triton_final_response``; a final flag that comes without a
    response is written (as an empty response) only for requests that set
    ``triton_enable_empty_final_response``. A failing request gets an ``error_message`` reply
    and the stream goes on, unless the client sent the ``triton_grpc_error: true`` header
    (``grpc_errors``): then ``next_replies`` hands out the first error as an ``InferenceError`` and the
    servicer ends the stream with its status.

    ``close`` runs when the stream ends (the client half-closed and every reply was written,
    or it cancelled or disconnected): with a ``scope`` (stream-scoped sequences) the sequences
    started on the stream end, then the requests still open are cancelled: those not yet run
    leave the queues, running ones see ``is_cancelled()``.

    ``drain`` (the server's drain, see ``StreamDrain``; or, with ``triton_grpc_error``, the
    first UNAVAILABLE error) stops reading at once: a request read after it is not submitted
    and gets no reply. The requests submitted before it are answered as usual, except that an
    UNAVAILABLE error (the step was refused or never ran: it was not applied) is not written;
    then ``next_replies`` ends and the servicer ends the stream with UNAVAILABLE. So when a stream
    ends that way, every request that got a result was run (a sequence's checkpoint in the
    store includes it), one that got an error reply failed as it would at any time, and one
    that got no reply was not run: the client sends exactly those again, in order, on a new
    stream.

    In request order, a reply that holds back later ones that are ready for longer than
    ``stats.stall_threshold_s`` is a stall: counted in ``stats`` and logged (rate-limited).
    """

    __slots__ = (
        "_completion_order",
        "_drain_reason",
        "_forwarded",
        "_grpc_errors",
        "_in_order",
        "_loop",
        "_max_backlog",
        "_open",
        "_reader",
        "_reading",
        "_ready",
        "_room",
        "_scope",
        "_server",
        "_shared_memory",
        "_stall_head",
        "_stall_timer",
        "_stats",
        "_trace_parent",
        "_unfinished",
        "_waiter",
    )

    def __init__(
        self,
        server: Server,
        *,
        grpc_errors: bool,
        completion_order: bool = False,
        scope: SequenceScope | None = None,
        stats: StreamStats | None = None,
        shared_memory: SharedMemoryRegistry | None = None,
        trace_parent: str = "",
        forwarded: tuple[tuple[str, str], ...] = (),
        max_backlog: int = DEFAULT_GRPC_STREAM_BACKLOG,
    ) -> None:
        """``shared_memory``: the server's regions, for requests that place tensors in them.
        ``trace_parent``: the call's W3C ``traceparent``: its requests' traces continue it.
        ``forwarded``: the call's metadata that --grpc-header-forward-pattern forwards, set as
        parameters of each of its requests (a parameter a request sets itself wins)."""
        self._server = server
        self._shared_memory = shared_memory if shared_memory is not None else SharedMemoryRegistry()
        self._trace_parent = trace_parent
        self._forwarded = forwarded
        self._grpc_errors = grpc_errors
        self._completion_order = completion_order
        self._scope = scope
        self._stats = stats if stats is not None else StreamStats()
        # Replies ready to write, in writing order, and the writer's wake-up when it waits for
        # one. A deque and one future instead of an asyncio.Queue: the queue's get() costs a
        # coroutine, a loop look-up and a getters deque per reply, on the stream's hottest path.
        self._ready: collections.deque[_Item] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._reading = True  # the request stream has not ended
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_order: OrderedRelease[_StreamRequest] = OrderedRelease(self._release)
        self._open: set[_StreamRequest] = set()  # submitted, final response not yet come
        self._unfinished = 0  # requests read whose last reply has not been taken from the queue
        self._max_backlog = max(1, max_backlog)
        self._room: asyncio.Future[None] | None = None  # the reader, waiting for _unfinished to fall
        self._stall_timer: asyncio.TimerHandle | None = None
        self._stall_head: _StreamRequest | None = None  # the head reply the stall timer watches
        self._reader: asyncio.Task[None] | None = None
        self._drain_reason: str | None = None  # set by drain(): the stream ends with UNAVAILABLE

    def start_calls(self, read: Callable[[], Awaitable[object]]) -> None:
        """Read the requests by calling ``read`` in a task of its own (see ``read_calls``)."""
        self._reader = asyncio.create_task(self.read_calls(read))

    @property
    def drain_reason(self) -> str | None:
        """Why the stream must end with UNAVAILABLE (``drain`` was called), or None."""
        return self._drain_reason

    def drain(self, reason: str) -> None:
        """The server drains: submit nothing more (a request read from now on gets no reply and
        must be sent again elsewhere), answer the requests submitted, then end (``next_replies``
        stops and the servicer ends the stream with UNAVAILABLE and ``reason``). Idempotent."""
        if self._drain_reason is not None:
            return
        self._drain_reason = reason
        if self._reader is not None:
            # The reader waits in an await (next request, or an off-loop decode) and submits
            # synchronously, so cancelling it now submits nothing more.
            self._reader.cancel()
        self._end_reading()  # the reader's own end may never come (cancelled before it started)

    async def read_calls(self, read: Callable[[], Awaitable[object]]) -> None:
        """Submit each request as it arrives, taken by calling ``read`` (the call context's)
        until it returns None: serialized (the rpc is registered without a deserializer) or
        already a message. A request whose decoding grows with its size is decoded off the
        event loop, and the next one waits for it: order is kept."""
        parse = codec.parse_infer_request
        try:
            while True:
                if self._unfinished >= self._max_backlog:
                    await self._until_room()
                item = await read()
                if item is None or self._drain_reason is not None:  # read after the drain began: not run
                    break
                msg = parse(item) if type(item) is bytes else item
                decoded: tuple[InferRequest, codec.GrpcReplyOptions] | Exception | None = None
                if not isinstance(msg, codec.Undecodable):
                    try:
                        decoded = codec.decode_request(msg, inline=True)  # type: ignore[arg-type]
                    except codec.DecodeOffLoop:
                        try:
                            decoded = await offload(codec.decode_request, msg)
                        except Exception as e:
                            decoded = e
                    except Exception as e:  # refused: submit() orders its error reply
                        decoded = e
                if self._drain_reason is not None:  # the drain began during an off-loop decode
                    break
                self.submit(msg, decoded)  # type: ignore[arg-type]
        except Exception as e:  # the call broke (the client went away): nothing more to read
            log.debug("stream request reader ended: %s: %s", type(e).__name__, e)
        finally:  # however reading ends, the replies end once the requests read are answered
            self._end_reading()

    def submit(
        self,
        msg: pb.ModelInferRequest | codec.Undecodable,
        decoded: tuple[InferRequest, codec.GrpcReplyOptions] | Exception | None = None,
    ) -> None:
        """Decode and queue one request; a refusal is its one (error) reply. A message that
        did not decode at all is refused too (with no request id to echo) and the stream goes
        on: gRPC's framing is intact, only that message's bytes are bad."""
        self._unfinished += 1
        if isinstance(msg, codec.Undecodable):
            req = _StreamRequest("", "", "")
            self._hold_place(req)
            err = msg.error()
            self._put(req, err if self._grpc_errors else req.error(err), True)
            return
        req = _StreamRequest(msg.id, msg.model_name, msg.model_version)
        try:
            # looked up once: enqueue_streaming takes the model version found here
            model = None if self._completion_order else self._server.model(msg.model_name, msg.model_version)
            if model is not None and not model.decoupled:
                self._hold_place(req)
            if decoded is None:
                request, options = codec.decode_request(msg)
            elif isinstance(decoded, Exception):
                raise decoded
            else:
                request, options = decoded
            if options.extensions is not None:  # shared memory, classification
                options.extensions.prepare(self._server, request, self._shared_memory)
                req.extensions = options.extensions
            req.empty_final = options.empty_final
            req.sequence_id = request.sequence_id
            req.start = request.sequence_start
            request.scope = self._scope
            if self._trace_parent:
                request.trace_parent = self._trace_parent
            for name, value in self._forwarded:
                request.parameters.setdefault(name, value)
            req.session = self
            req.cancel = self._server.enqueue_streaming(request, req.respond, model=model)
            self._open.add(req)
        except Exception as e:  # refused: one error reply, and the stream goes on
            err = e if isinstance(e, InferenceError) else internal_error("gRPC ModelStreamInfer", e)
            if not req.ordered and not self._completion_order:  # an unknown model: Triton orders its reply too
                self._hold_place(req)
            if _temporary(err):
                self._refuse_at_once(req, err, None)
            else:
                self._put(req, self._error_reply(req, err, None), True)

    async def next_replies(self) -> list[Reply] | None:
        """The replies ready to write now, in order (waiting for one if none is); None once the
        request stream has ended and every request is answered. The servicer writes them from
        its own loop: no async generator between it and the session."""
        ready = self._ready
        while True:
            if ready:
                out: list[Reply] = []
                while ready:
                    reply, last = ready.popleft()
                    if last:
                        self._unfinished -= 1
                        if self._room is not None and self._unfinished < self._max_backlog:
                            self._room.set_result(None)
                            self._room = None
                    if reply is not None:
                        out.append(reply)
                if out:
                    return out
                continue
            if not self._reading and not self._unfinished:
                return None
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def _until_room(self) -> None:
        self._stats.reading_paused += 1
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        room = self._room = loop.create_future()
        try:
            await room
        finally:
            self._room = None

    def _end_reading(self) -> None:
        self._reading = False
        self._wake()

    def _push(self, item: _Item) -> None:
        self._ready.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        """The stream has ended: end its scoped sequences, cancel the requests still open."""
        if self._reader is not None:
            self._reader.cancel()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._scope is not None:
            self._stats.scoped_sequences_ended += self._scope.close()
        for req in self._open:
            req.cancel()
        self._open.clear()

    # ------------------------------------------------------------------ internals

    def respond(self, req: _StreamRequest, response: InferResult | InferenceError | None, final: bool) -> None:
        """The engine's callback (on the event loop) for each of ``req``'s responses, through
        ``_StreamRequest.respond``."""
        if final:
            self._open.discard(req)
            # Nothing left to cancel: dropping the engine's canceller breaks the request <->
            # pending-record cycle, so both are freed now, not by the cyclic collector.
            req.cancel = _nothing
        reply: Reply | None
        if isinstance(response, InferenceError):
            if final and not req.responded and _temporary(response):  # refused after an await (replicas)
                self._refuse_at_once(req, response, final)
                return
            reply = self._error_reply(req, response, final)
        elif response is not None:
            req.responded = True
            if req.extensions is None:
                reply = wire.stream_response(response, final)
            else:
                reply = self._extended_reply(req, req.extensions, response, final)
        elif req.empty_final:  # a final flag alone, written only when the client asked for it
            reply = wire.stream_reply(req.id, req.model, req.version, True)
        else:  # a bare final flag: nothing to write
            reply = None
        self._put(req, reply, final)

    def _extended_reply(
        self, req: _StreamRequest, extensions: TensorExtensions, response: InferResult, final: bool
    ) -> Reply | None:
        """A response whose outputs are classified or placed in shared memory first."""
        try:
            placed = extensions.finish(self._server, response, self._shared_memory)
        except InferenceError as e:
            return self._error_reply(req, e, final)
        return wire.stream_response(response, final) + placed_stream_entries(placed)

    def _error_reply(self, req: _StreamRequest, err: InferenceError, final: bool | None) -> Reply | None:
        """What to write for a request that failed. UNAVAILABLE means the request was not run
        (refused, or never reached an instance): on a draining stream it gets no reply, which
        tells the client to send it again on its new stream (see the class's doc); with
        ``triton_grpc_error`` it drains the stream, so that the stream ends with its status
        only once the requests submitted before it are answered, and the client can tell
        exactly which to send again (those without a reply). Not for a (decoupled) request that
        has sent responses already: it ran, and its error is written as usual."""
        if err.code is Code.UNAVAILABLE and not req.responded and (self._drain_reason is not None or self._grpc_errors):
            self.drain(err.message)  # no-op when draining already
            return None
        return err if self._grpc_errors else req.error(err, final)

    def _refuse_at_once(self, req: _StreamRequest, err: InferenceError, final: bool | None) -> None:
        """Write a temporary refusal now, ahead of the replies in line before it (see the class's
        doc); its message names the request in request order, where tritonclient's callback gets
        only the message of an error."""
        if req.ordered:
            req.ordered = False
            self._in_order.withdraw(req)
            if req.id and not err.message.startswith("[request id:"):
                err = InferenceError(err.code, f"[request id: {req.id}] {err.message}", retry_after_s=err.retry_after_s)
            self._stats.refused_at_once += 1
        self._push((self._error_reply(req, err, final), True))

    def _hold_place(self, req: _StreamRequest) -> None:
        req.ordered = True
        self._in_order.add(req)

    def _put(self, req: _StreamRequest, reply: Reply | None, last: bool) -> None:
        if req.ordered:
            req.outcome = (reply, last)
            self._in_order.release_ready()
            if req.ordered and self._stall_timer is None:  # held back by the head reply
                self._watch_stall()
        else:
            self._push((reply, last))

    def _release(self, req: _StreamRequest) -> None:
        req.ordered = False  # no longer waiting for its place
        self._push(req.outcome)  # type: ignore[arg-type]  # set before release

    # ------------------------------------------------------------------ stalls

    def _watch_stall(self) -> None:
        self._stall_head = self._in_order.head()
        self._stall_timer = asyncio.get_running_loop().call_later(self._stats.stall_threshold_s, self._check_stall)

    def _check_stall(self) -> None:
        """The threshold has passed since a head reply started holding back ready replies."""
        self._stall_timer = None
        head = self._in_order.head()
        held = self._in_order.held_back()
        if head is None or held == 0:
            return
        if head is not self._stall_head:  # another head since: watch it from now
            self._watch_stall()
            return
        if head.stall_counted:
            return
        head.stall_counted = True
        self._stats.stalled(head.model, self._stall_line(head, held))

    def _stall_line(self, head: _StreamRequest, held: int) -> str:
        what = f"request '{head.id}' to model '{head.model}'"
        if head.sequence_id:
            what += f" (sequence {head.sequence_id}{', START' if head.start else ''}"
            try:
                waiting = self._server.model(head.model, head.version).sequence_slot(head.sequence_id) == -1
            except InferenceError:
                waiting = False
            what += ", waiting in the backlog for a slot)" if waiting else ")"
        return (
            f"gRPC stream stalled: the reply to {what} has held back {held} later replies that are ready for "
            f"over {self._stats.stall_threshold_s:g} s. A stream writes replies in request order (as Triton "
            "does), so a stream that carries more sequences than the model has slots stalls until idle "
            f"timeouts free one. Open the stream with the header '{REPLY_ORDER_HEADER}: completion' to get "
            "replies as they complete (tritonclient matches them by request id), or use one stream per sequence"
        )


class _StreamRequest:
    """One request of the stream, from submit to its last reply."""

    __slots__ = (
        "cancel",
        "empty_final",
        "extensions",
        "id",
        "model",
        "ordered",
        "outcome",
        "responded",
        "sequence_id",
        "session",
        "stall_counted",
        "start",
        "version",
    )

    def __init__(self, request_id: str, model: str, version: str) -> None:
        self.id = request_id
        self.model = model  # as requested, for the replies that carry no result
        self.version = version
        self.empty_final = False
        self.extensions: TensorExtensions | None = None  # shared memory, classification
        self.ordered = False  # its reply waits for those of the requests before it
        self.outcome: _Item | None = None  # ordered: its reply, once known
        self.responded = False  # a response (not an error) has come for it
        self.cancel: Callable[[], None] = _nothing
        self.sequence_id: SequenceId = 0  # for the stall line
        self.start = False
        self.stall_counted = False
        self.session: StreamSession | None = None

    def respond(self, response: InferResult | InferenceError | None, final: bool) -> None:
        """The engine's callback: a bound method instead of a partial made per request."""
        self.session.respond(self, response, final)  # type: ignore[union-attr]  # set before submit

    def error(self, err: InferenceError, final: bool | None = None) -> bytes:
        return wire.stream_reply(self.id, self.model, self.version, final, err.message)


def _nothing() -> None:
    pass


def _temporary(err: Exception) -> bool:
    """A refusal that says "not run, try again" (a full backlog, a draining server, a sequence
    on its way between replicas): it needs no place in the stream's reply order."""
    return isinstance(err, InferenceError) and err.code is Code.UNAVAILABLE and err.retry_after_s is not None


class StreamDrain:
    """The open ModelStreamInfer streams of one gRPC front-end, for the shutdown (event loop
    only). ``begin`` (the first SIGTERM/SIGINT): new streams get UNAVAILABLE at once; with a
    state store (``handoff``) the open streams drain now (``StreamSession.drain``), since their
    sequences move to the store and continue on another replica; without one they go on
    while the engine drains (their running sequences may still end here, as in Triton) and
    ``end`` drains them once it is done. Either way a stream ends with UNAVAILABLE after every
    request it submitted was answered, never with a reset."""

    __slots__ = ("_closed", "_reason", "_sessions")

    def __init__(self) -> None:
        self._sessions: set[StreamSession] = set()
        self._reason: str | None = None  # set: new streams are refused with it
        self._closed = asyncio.Event()
        self._closed.set()

    @property
    def refusal(self) -> str | None:
        """Why a new stream is refused (UNAVAILABLE), or None while streams are served."""
        return self._reason

    def add(self, session: StreamSession) -> None:
        self._sessions.add(session)
        self._closed.clear()
        if self._reason == DRAIN_HANDOFF_MESSAGE:
            session.drain(self._reason)  # opened just as the drain began

    def discard(self, session: StreamSession) -> None:
        self._sessions.discard(session)
        if not self._sessions:
            self._closed.set()

    def begin(self, *, handoff: bool) -> None:
        if self._reason is not None:
            return
        self._reason = DRAIN_HANDOFF_MESSAGE if handoff else SHUTDOWN_MESSAGE
        if handoff:
            for session in self._sessions:
                session.drain(self._reason)

    def end(self) -> None:
        """The engine has drained: every open stream ends once its requests are answered."""
        reason = self._reason or SHUTDOWN_MESSAGE
        self._reason = reason
        for session in self._sessions:
            session.drain(reason)

    async def wait_closed(self, timeout_s: float) -> bool:
        """Wait (up to ``timeout_s``) for every stream to have ended; True when they have."""
        try:
            await asyncio.wait_for(self._closed.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._sessions)
