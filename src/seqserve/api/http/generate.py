"""Triton's generate extension: ``POST /v2/models/<m>[/versions/<v>]/generate`` (one JSON
response) and ``.../generate_stream`` (server-sent events, one ``data:`` event per response,
decoupled models event by event). The JSON is generate_json's; this module queues the request
and streams its answers.

Bounded as the infer route: the body by the front-end's size and time limits, the request by
the engine's admission (a full backlog answers 503 with Retry-After), restricted with the
``inference`` category (api/security.py). Sequence ids come from the ``sequence_id``,
``sequence_start`` and ``sequence_end`` parameters or from the ``Inference-Session-Id``
header. A client that disconnects cancels its request (a queued one leaves the queues; a
running one sees ``is_cancelled()``; an iterative sequence ends).

Errors: before the request is queued (bad JSON, an unknown model, a refusal), a JSON error
object with the status of the error; after, ``generate`` answers the first error with its
status, and ``generate_stream`` sends ``data: {"error": ...}`` as an event (the status is
the first response's: 200 unless the first response is an error, as in Triton)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from seqserve.api.http.generate_json import NOT_ONE_RESPONSE, decode_generate, encode_generate, sse_event
from seqserve.api.http.router import Route
from seqserve.api.http.status import error_reply, http_status, json_reply
from seqserve.api.kserve import SESSION_END_KEY, SESSION_ID_KEY, apply_session
from seqserve.api.transport.exchange import HttpReply, HttpRequest
from seqserve.engine import InferenceError, InferResult, Server

SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_SESSION_ID = SESSION_ID_KEY.encode()
_SESSION_END = SESSION_END_KEY.encode()

#: what arrives for a queued generate request: a response (or its error, or None for a bare
#: final flag) and whether it is the last; (None, True) also when the client is gone
Arrival = tuple[InferResult | InferenceError | None, bool]


class GenerateRoutes:
    """The generate routes over one Server; ``read_body`` reads a request body within the
    front-end's limits."""

    def __init__(self, server: Server, read_body: Callable[[HttpRequest], Awaitable[bytes]]) -> None:
        self.server = server
        self._read_body = read_body

    def routes(self) -> list[Route]:
        v = "/versions/{version:int}"
        return [
            Route("/v2/models/{model}/generate", self.generate, ["POST"]),
            Route("/v2/models/{model}" + v + "/generate", self.generate, ["POST"]),
            Route("/v2/models/{model}/generate_stream", self.generate_stream, ["POST"]),
            Route("/v2/models/{model}" + v + "/generate_stream", self.generate_stream, ["POST"]),
        ]

    async def generate(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        answers = await self._queue(request, p)
        try:
            results = []
            while True:
                result, final = await answers.next()
                if answers.gone:
                    return error_reply("the HTTP client disconnected", 400)
                if result is not None:
                    results.append(result)
                if final:
                    break
        finally:
            answers.close()
        if results and isinstance(results[0], InferenceError):
            return error_reply(results[0].message, http_status(results[0]))
        if len(results) != 1:
            return error_reply(NOT_ONE_RESPONSE, 500)
        error = next((r for r in results if isinstance(r, InferenceError)), None)
        if error is not None:
            return error_reply(error.message, http_status(error))
        assert isinstance(results[0], InferResult)
        return json_reply(encode_generate(results[0]))

    async def generate_stream(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        answers = await self._queue(request, p)
        try:
            result, final = await answers.next()
        except BaseException:
            answers.close()
            raise
        status = http_status(result) if isinstance(result, InferenceError) else 200
        first = b"" if result is None else _event(result)
        stream = None if final or answers.gone else _events(answers)
        if stream is None:
            answers.close()
        if answers.gone:  # nothing to send to anyone
            return HttpReply(status, list(SSE_HEADERS), b"", close=True)
        return HttpReply(status, list(SSE_HEADERS), first, stream=stream or _nothing())

    async def _queue(self, request: HttpRequest, p: dict[str, Any]) -> Answers:
        body = await self._read_body(request)
        model, version = p["model"], str(p.get("version", ""))
        inputs = self.server.model_metadata(model, version)["inputs"]
        req = decode_generate(body, inputs, model, version)
        session = request.header(_SESSION_ID)
        end = request.header(_SESSION_END)
        if session is not None or end is not None:
            req.client = request.peer
            apply_session(self.server, req, session, end)
        answers = Answers()
        answers.cancel = self.server.enqueue_streaming(req, answers.put)
        answers.watch(request)
        return answers


class Answers:
    """The responses of one queued request, in order, and the watch on its client."""

    __slots__ = ("_queue", "_watch", "cancel", "done", "gone")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Arrival] = asyncio.Queue()
        self._watch: asyncio.Task[None] | None = None
        self.cancel: Callable[[], None] = _nothing_to_cancel
        self.gone = False  # the client disconnected (the request is cancelled)
        self.done = False  # the final response has come

    def put(self, result: InferResult | InferenceError | None, final: bool) -> None:
        self.done = self.done or final
        self._queue.put_nowait((result, final))

    async def next(self) -> Arrival:
        return await self._queue.get()

    def watch(self, request: HttpRequest) -> None:
        self._watch = asyncio.ensure_future(self._wait_disconnect(request))

    async def _wait_disconnect(self, request: HttpRequest) -> None:
        await request.body.wait_disconnect()
        self.gone = True
        if not self.done:
            self.cancel()
        self._queue.put_nowait((None, True))  # wakes a reader waiting for the next response

    def close(self) -> None:
        """Done with the request: the watch ends; a request not answered for good is
        cancelled (its client will read no more)."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if not self.done:
            self.cancel()
        self.cancel = _nothing_to_cancel


def _event(result: InferResult | InferenceError) -> bytes:
    if isinstance(result, InferenceError):
        return sse_event({"error": result.message})
    return sse_event(encode_generate(result))


async def _events(answers: Answers) -> AsyncIterator[bytes]:
    """The events after the first, until the final response or the client's leaving."""
    try:
        while True:
            result, final = await answers.next()
            if answers.gone:
                return
            if result is not None:
                yield _event(result)
            if final:
                return
    finally:
        answers.close()


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


def _nothing_to_cancel() -> None:
    pass
