"""Requests a worker does not answer itself go whole to the engine over the control channel,
and the engine answers them with its own handlers, so their status codes and messages are
exactly those of a single process: every HTTP route but infer and generate, every gRPC rpc
but the two infer ones, and infer requests that need the engine's state (shared-memory tensors,
classification, a compressed body).

The worker side (``WorkerHttp``, ``RelayingServicer``) and the engine side (``EngineAnswers``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from seqserve.api.grpc.servicer import RAW_RPCS, InferenceServicer
from seqserve.api.http.body import BodyWatch, read_body
from seqserve.api.http.generate import GenerateRoutes
from seqserve.api.http.routes import INFER_PATH, HttpFrontend
from seqserve.api.http.status import error_reply, reply_for
from seqserve.api.transport.exchange import HttpReply, HttpRequest
from seqserve.api.transport.grpc_context import CallAborted, CallContext, Metadata, Method, Status
from seqserve.api.workers.channel import Channel

#: bytes that mark an infer request the worker cannot run itself (its tensors in a registered
#: shared-memory region, or a classification output): a false match only costs a relay
_ENGINE_ONLY = (b"shared_memory_region", b"classification")
#: the generate routes (run in the worker, as infer is)
GENERATE_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/generate(_stream)?$")
MODEL_INFER = "ModelInfer"
MODEL_STREAM_INFER = "ModelStreamInfer"


def needs_engine(data: bytes | memoryview) -> bool:
    raw = bytes(data) if isinstance(data, memoryview) else data
    return any(mark in raw for mark in _ENGINE_ONLY)


# ------------------------------------------------------------------------- worker: HTTP


class WorkerHttp:
    """A worker's HTTP handler: infer runs here (``HttpFrontend.infer_reply`` over the
    RemoteEngine), everything else is relayed."""

    def __init__(self, frontend: HttpFrontend, control: Channel) -> None:
        self._frontend = frontend
        self._control = control
        self._watch = BodyWatch(frontend.body_timeout_s)

    async def handle(self, request: HttpRequest) -> HttpReply | None:
        m = INFER_PATH.match(request.path) if request.method == "POST" else None
        site = f"HTTP infer {m.group(1)}" if m is not None else "HTTP"
        try:
            body = await read_body(
                request.body, request.header(b"content-length"), self._frontend.max_body_bytes, self._watch
            )
        except Exception as e:
            return reply_for(e, site)
        if m is not None and not self._relayed_infer(request, body):
            try:
                return await self._frontend.infer_reply(m.group(1), m.group(2) or "", request, body, watch=True)
            except Exception as e:
                return reply_for(e, site)
        g = GENERATE_PATH.match(request.path) if request.method == "POST" else None
        if g is not None and not request.header(b"content-encoding"):
            return await self._generate(request, body, g)
        return await self.relay(request, body)

    async def _generate(self, request: HttpRequest, body: bytes, g: re.Match[str]) -> HttpReply:
        """generate and generate_stream run here too: a relayed reply is one body, and a stream
        of events must reach its client as the model answers."""

        async def read(_: HttpRequest) -> bytes:
            return body

        routes = GenerateRoutes(self._frontend.server, read)
        p: dict[str, Any] = {"model": g.group(1)}
        if g.group(2):
            p["version"] = int(g.group(2))
        try:
            reply = await (routes.generate_stream if g.group(3) else routes.generate)(request, p)
        except Exception as e:
            return reply_for(e, f"HTTP generate {g.group(1)}")
        if g.group(3) and reply.status >= 400 and reply.body.startswith(b"data: "):
            # One process refuses a request before any event (JSON); here the refusal comes from
            # the engine as the first answer: the same JSON error then.
            with contextlib.suppress(ValueError):
                message = json.loads(reply.body[len(b"data: ") :])["error"]
                if reply.stream is not None:
                    await reply.stream.aclose()  # type: ignore[attr-defined]
                return error_reply(str(message), reply.status)
        return reply

    @staticmethod
    def _relayed_infer(request: HttpRequest, body: bytes) -> bool:
        if request.header(b"content-encoding"):
            return True
        length = request.header(b"inference-header-content-length")
        if length is not None and length.strip().isdigit():
            return needs_engine(memoryview(body)[: int(length.strip())])
        return needs_engine(body)

    async def relay(self, request: HttpRequest, body: bytes) -> HttpReply | None:
        answer = await self._control.call(
            "http",
            (
                request.method,
                request.path,
                request.query,
                request.headers,
                request.scheme,
                request.server,
                request.peer,
                body,
            ),
        )
        if answer is None:
            return None
        status, headers, reply_body, close = answer
        return HttpReply(status, headers, reply_body, close)


# ------------------------------------------------------------------------- worker: gRPC


class RelayingServicer:
    """A worker's gRPC servicer: the infer rpcs run here (``local``), every other rpc of the
    service goes to the engine as bytes (registered raw, see ``raw_rpcs``)."""

    def __init__(self, local: InferenceServicer | None, control: Channel, service: str) -> None:
        self._local = local
        self._control = control
        self._service = service

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name == MODEL_STREAM_INFER and self._local is not None:
            return self._local.ModelStreamInfer
        if name == MODEL_INFER and self._local is not None:
            return self._model_infer
        path = f"/{self._service}/{name}"

        async def relayed(request: bytes, context: CallContext) -> bytes:
            return await relay_grpc(self._control, path, request, context)

        return relayed

    async def _model_infer(self, request: bytes, context: CallContext) -> bytes:
        assert self._local is not None
        if needs_engine(request):
            return await relay_grpc(self._control, f"/{self._service}/{MODEL_INFER}", request, context)
        result: bytes = await self._local.ModelInfer(request, context)
        return result


def raw_rpcs(service: Any) -> frozenset[str]:
    """The rpcs a worker registers raw: all of them (relays carry bytes)."""
    return frozenset(m.name for m in service.methods) | RAW_RPCS


async def relay_grpc(control: Channel, path: str, request: bytes, context: CallContext) -> bytes:
    status, data = await control.call("grpc", (path, bytes(request), context.metadata, context.peer()))
    if status != Status.OK:
        raise CallAborted(Status(status), data)
    reply: bytes = data
    return reply


# ------------------------------------------------------------------------- engine side


class _RelayedBody:
    """A relayed request's body, read whole by the worker already."""

    __slots__ = ("_body",)

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body

    async def receive(self) -> tuple[bytes, bool] | None:
        body, self._body = self._body, None
        return (body or b"", False)

    async def wait_disconnect(self) -> None:
        await asyncio.get_running_loop().create_future()  # the worker's client is not seen here


class _RelayedContext:
    """A relayed unary call's context: its metadata and peer as the worker saw them."""

    __slots__ = ("_peer", "metadata")

    def __init__(self, metadata: Metadata, peer: str) -> None:
        self.metadata = metadata
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def read(self) -> Any:
        return None


class EngineAnswers:
    """The engine's answers to relayed requests: its own HTTP routes and gRPC method table
    (built as a single process builds them, without the restrictions: the worker checked those)."""

    def __init__(self, http: HttpFrontend | None, grpc_methods: Mapping[bytes, Method]) -> None:
        self._http = http
        self._grpc = grpc_methods

    async def http(self, payload: tuple[Any, ...]) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool] | None:
        method, path, query, headers, scheme, server, peer, body = payload
        if self._http is None:
            return 404, [], b"", False
        request = HttpRequest(method, path, query, headers, _RelayedBody(body), scheme, server, peer)
        reply = await self._http.handle(request)
        if reply is None:
            return None
        return reply.status, reply.headers, reply.body, reply.close

    async def grpc(self, payload: tuple[Any, ...]) -> tuple[int, Any]:
        path, data, metadata, peer = payload
        method = self._grpc.get(path.encode())
        if method is None or method.streaming:
            return Status.UNIMPLEMENTED, f"Method not found: {path}"
        request = data if method.deserialize is None else method.deserialize(data)
        try:
            reply = await method.behaviour(request, _RelayedContext(metadata, peer))
        except CallAborted as e:
            return e.status, e.details
        return Status.OK, reply if method.serialize is None else method.serialize(reply)


__all__ = ["EngineAnswers", "RelayingServicer", "WorkerHttp", "raw_rpcs"]
