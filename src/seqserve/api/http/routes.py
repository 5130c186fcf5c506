"""KServe v2 HTTP/REST front-end: the routes over one engine ``Server``, written once as
``Handler``s (api/transport/exchange.py) that the builtin server calls directly and that
hypercorn and granian serve through ``asgi``."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import re
from typing import Any

import orjson
from starlette.datastructures import QueryParams
from starlette.types import ASGIApp

from seqserve.api import sequences
from seqserve.api.header_forward import decoded_headers, forward_headers
from seqserve.api.http import kserve_json
from seqserve.api.http.body import BodyWatch, read_body
from seqserve.api.http.generate import GenerateRoutes
from seqserve.api.http.router import Route, Router
from seqserve.api.http.shared_memory_routes import SharedMemoryRoutes
from seqserve.api.http.status import error_reply, json_reply, reply_for
from seqserve.api.kserve import (
    EXTENSIONS,
    SESSION_END_KEY,
    SESSION_ID_KEY,
    apply_session,
    enqueue_single,
)
from seqserve.api.limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    OFFLOAD_BYTES,
    content_encoding,
    inflate,
    offload,
)
from seqserve.api.logs import log_settings_request
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.statistics import statistics_json
from seqserve.api.tracing import http_trace_setting
from seqserve.api.transport.asgi import asgi_app
from seqserve.api.transport.exchange import BodySource, Handler, HttpReply, HttpRequest
from seqserve.engine import SERVER_EXITING, SERVER_NOT_READY, Code, InferenceError, Server

_ENDPOINT = "HTTP end point"  # names this front-end in the refusal of decoupled models

_SESSION_ID = SESSION_ID_KEY.encode()
_SESSION_END = SESSION_END_KEY.encode()
# Model names cannot contain "/" (as in Triton); versions are decimal.
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
#: an infer request still waiting after one to two of these starts watching for its client's
#: disconnect, which then takes the request out of the queues (a quick step pays one list append)
DISCONNECT_GRACE_S = 0.05
_DISCONNECTED = "the HTTP client disconnected"  # the cancel message of a request whose client left

_TEXT_HEADER = (b"content-type", b"text/plain; charset=utf-8")


def _empty(status: int = 200) -> HttpReply:
    return HttpReply(status, [_TEXT_HEADER])


class HttpFrontend:
    """Routes of the KServe v2 REST protocol and Triton's extensions over one Server."""

    def __init__(
        self,
        server: Server,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        shared_memory: SharedMemoryRegistry | None = None,
        header_forward: re.Pattern[str] | None = None,
    ) -> None:
        """``shared_memory``: the regions registered with the server (shared with gRPC).
        header_forward: headers whose name matches become request parameters (Triton's
        --http-header-forward-pattern)."""
        self.server = server
        self.shared_memory = shared_memory if shared_memory is not None else SharedMemoryRegistry()
        self.header_forward = header_forward
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self._body_watch = BodyWatch(body_timeout_s)
        self._disconnects = _DisconnectWatch()
        self.router = Router(self.routes())

    async def handle(self, request: HttpRequest) -> HttpReply | None:
        """Every route (a ``Handler``): infer first, on its own path, the rest by the router."""
        if request.method == "POST":
            m = INFER_PATH.match(request.path)
            if m is not None:
                model = m.group(1)
                try:
                    body = await self._body(request)
                    return await self.infer_reply(model, m.group(2) or "", request, body, watch=True)
                except Exception as e:
                    return reply_for(e, f"HTTP infer {model}")
        return await self.router.dispatch(request)

    def asgi(self) -> ASGIApp:
        """The whole HTTP API as one ASGI app (hypercorn, granian)."""
        return asgi_app(self.handle)

    async def _body(self, request: HttpRequest) -> bytes:
        return await read_body(request.body, request.header(b"content-length"), self.max_body_bytes, self._body_watch)

    # ------------------------------------------------------------------------- health

    # Once the shutdown has begun these answer as Triton does then: 503 with "Server exiting"
    # (server health) or "Server not ready" (model readiness).

    async def live(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        if self.server.exiting:
            return error_reply(SERVER_EXITING, 503)
        return _empty(200 if self.server.is_live() else 400)

    async def ready(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        if self.server.exiting:
            return error_reply(SERVER_EXITING, 503)
        return _empty(200 if self.server.is_ready() else 400)

    async def model_ready(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        if self.server.exiting:
            return error_reply(SERVER_NOT_READY, 503)
        if self.server.is_model_ready(p["model"], p.get("version", "")):
            return _empty()
        return error_reply("Model version not ready", 400)

    # ----------------------------------------------------------------------- metadata

    async def metadata(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        return json_reply({**self.server.metadata(), "extensions": EXTENSIONS})

    async def model_metadata(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        return json_reply(self.server.model_metadata(p["model"], p.get("version", "")))

    async def model_config(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        return json_reply(self.server.model_config_json(p["model"], p.get("version", "")))

    async def stats(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        try:
            stats = self.server.statistics(p.get("model", ""), p.get("version", ""))
        except InferenceError:
            return error_reply(f"requested model '{p.get('model', '')}' is not available", 400)
        return json_reply(statistics_json(stats))

    async def logging(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        """The logging extension: GET reads the log settings, POST changes some of them."""
        changes: Any = {}
        if request.method == "POST":
            body = await self._body(request)
            if body.strip():
                try:
                    changes = orjson.loads(body)
                except orjson.JSONDecodeError as e:
                    raise InferenceError(Code.INVALID_ARG, f"failed to parse the request JSON: {e}") from None
        return json_reply(log_settings_request(changes))

    # ---------------------------------------------------------------------- repository

    async def repository_index(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        body = await self._body(request)
        ready_only = False
        if body.strip():
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise InferenceError(Code.INVALID_ARG, f"failed to parse the request JSON: {e}") from None
            ready_only = bool(doc.get("ready", False)) if isinstance(doc, dict) else False
        index = self.server.repository_index()
        if ready_only:
            index = [e for e in index if e["state"] == "READY"]
        return json_reply([{k: v for k, v in e.items() if v} for e in index])

    async def load(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        body = await self._body(request)
        self.server.check_model_control()  # before anything of the request is decoded
        params: dict[str, Any] = {}
        if body.strip():
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise InferenceError(Code.INVALID_ARG, f"failed to parse the request JSON: {e}") from None
            params = (doc.get("parameters") if isinstance(doc, dict) else None) or {}
        config = params.get("config")
        files = {}
        for key, value in params.items():
            if key.startswith("file:"):
                try:
                    files[key[len("file:") :]] = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError, TypeError) as e:
                    raise InferenceError(Code.INVALID_ARG, f"'{key}' is not valid base64: {e}") from None
        if config is not None and not isinstance(config, str):
            raise InferenceError(Code.INVALID_ARG, "the 'config' load parameter must be a string of JSON")
        await self.server.request_load_model(p["model"], config_json=config, files=files or None)
        return _empty()

    async def unload(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        await self._body(request)
        await self.server.request_unload_model(p["model"])
        return _empty()

    # -------------------------------------------------------------------------- infer

    async def infer_reply(
        self, model: str, version: str, request: HttpRequest, body: bytes, *, watch: bool = False
    ) -> HttpReply | None:
        """One infer request (``version``: "" or the path's digits). ``watch``: a client that
        disconnects while its request waits (past DISCONNECT_GRACE_S) cancels it, and the reply
        is None: send nothing."""
        header = request.header
        encoding = header(b"content-encoding")
        if encoding:
            enc = content_encoding(encoding)
            if enc is not None:
                body = await inflate(body, enc, self.max_body_bytes)
        ihcl_raw = header(b"inference-header-content-length")
        ihcl = None
        if ihcl_raw is not None:
            ihcl_raw = ihcl_raw.strip()
            if not (ihcl_raw.isascii() and ihcl_raw.isdigit()):
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"Inference-Header-Content-Length '{ihcl_raw[:40]}' is not a non-negative integer",
                )
            ihcl = int(ihcl_raw) if len(ihcl_raw) <= 20 else len(body) + 1  # out of range either way
        if len(body) > OFFLOAD_BYTES:  # parsing and BYTES decoding grow with the body: off the loop
            req, options = await offload(kserve_json.decode_request, body, ihcl, model, version)
        else:
            req, options = kserve_json.decode_request(body, ihcl, model, version)
        extensions = options.extensions  # shared memory, classification
        if extensions is not None:
            extensions.prepare(self.server, req, self.shared_memory)
        if self.header_forward is not None:
            forward_headers(req, decoded_headers(request.headers), self.header_forward)
        if self.server.tracer is not None:
            req.trace_parent = header(b"traceparent") or ""
        session = header(_SESSION_ID)
        end = header(_SESSION_END)
        if session is not None or end is not None:
            req.client = request.peer
            apply_session(self.server, req, session, end)
        fut = enqueue_single(self.server, req, _ENDPOINT)
        if watch:
            self._disconnects.add(fut, request.body)
        try:
            result = await fut
        except asyncio.CancelledError as e:
            if e.args == (_DISCONNECTED,):  # the request, not this handler, was cancelled
                return None
            raise
        placed = None if extensions is None else extensions.finish(self.server, result, self.shared_memory)
        out, json_len = kserve_json.encode_response(result, options, placed)
        reply = []
        if json_len is not None:
            reply.append((b"content-type", b"application/octet-stream"))
            reply.append((b"inference-header-content-length", str(json_len).encode()))
        else:
            reply.append((b"content-type", b"application/json"))
        generated = result.parameters.get("sequence_id")
        if generated is not None or session:
            reply.append((b"inference-session-id", str(generated if generated is not None else session).encode()))
        accept = header(b"accept-encoding")
        if accept:
            chosen = kserve_json.choose_encoding(accept)
            if chosen:
                if len(out) > OFFLOAD_BYTES:
                    out = await offload(kserve_json.compress, out, chosen)
                else:
                    out = kserve_json.compress(out, chosen)
                reply.append((b"content-encoding", chosen.encode()))
        return HttpReply(200, reply, out)

    # ------------------------------------------------------------------ sequence API

    async def sequences(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        query = QueryParams(request.query)
        return json_reply(sequences.list_doc(self.server, p["model"], str(p.get("version", "")), query))

    async def sequence(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        version = str(p.get("version", ""))
        query = QueryParams(request.query)
        if request.method == "DELETE":
            doc = sequences.end_doc(self.server, p["model"], version, p["sequence_id"], query)
        else:
            doc = sequences.show_doc(self.server, p["model"], version, p["sequence_id"], query)
        return json_reply(doc)

    async def trace_setting(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        body = await self._body(request) if request.method == "POST" else None
        return json_reply(http_trace_setting(self.server, p.get("model", ""), body))

    # ------------------------------------------------------------------------ routing

    def routes(self) -> list[Route]:
        """Every route but infer's fast path (POST infer), in the order they are matched."""
        s = self
        v = "/versions/{version:int}"
        routes = [
            Route("/v2/health/live", s.live, ["GET"]),
            Route("/v2/health/ready", s.ready, ["GET"]),
            Route("/v2", s.metadata, ["GET"]),
            # stats before /v2/models/{model}: "stats" is not a model name
            Route("/v2/models/stats", s.stats, ["GET"]),
            Route("/v2/models/{model}/stats", s.stats, ["GET"]),
            Route("/v2/models/{model}" + v + "/stats", s.stats, ["GET"]),
            Route("/v2/models/{model}/ready", s.model_ready, ["GET"]),
            Route("/v2/models/{model}" + v + "/ready", s.model_ready, ["GET"]),
            Route("/v2/models/{model}/config", s.model_config, ["GET"]),
            Route("/v2/models/{model}" + v + "/config", s.model_config, ["GET"]),
            # POST is answered before routing; listed for the other methods' 405
            Route("/v2/models/{model}/infer", _never, ["POST"]),
            Route("/v2/models/{model}" + v + "/infer", _never, ["POST"]),
            # the sequence API (restrictable group "sequence"): docs/sequence-api.md
            Route("/v2/models/{model}/sequences", s.sequences, ["GET"]),
            Route("/v2/models/{model}" + v + "/sequences", s.sequences, ["GET"]),
            Route("/v2/models/{model}/sequences/{sequence_id:path}", s.sequence, ["GET", "DELETE"]),
            Route("/v2/models/{model}" + v + "/sequences/{sequence_id:path}", s.sequence, ["GET", "DELETE"]),
            Route("/v2/models/{model}", s.model_metadata, ["GET"]),
            Route("/v2/models/{model}" + v, s.model_metadata, ["GET"]),
            Route("/v2/repository/index", s.repository_index, ["POST"]),
            Route("/v2/repository/models/{model}/load", s.load, ["POST"]),
            Route("/v2/repository/models/{model}/unload", s.unload, ["POST"]),
            Route("/v2/logging", s.logging, ["GET", "POST"]),
            Route("/v2/trace/setting", s.trace_setting, ["GET", "POST"]),
            Route("/v2/models/{model}/trace/setting", s.trace_setting, ["GET", "POST"]),
        ]
        routes += SharedMemoryRoutes(self.shared_memory, self._body).routes()
        routes += SharedMemoryRoutes(self.shared_memory, self._body, cuda=True).routes()
        routes += GenerateRoutes(self.server, self._body).routes()
        return routes


async def _never(request: HttpRequest, p: dict[str, Any]) -> HttpReply:
    raise AssertionError("POST infer is answered before routing")


class _DisconnectWatch:
    """Watches for the disconnect of HTTP clients whose requests still wait after one to two
    grace periods: requests join a list, and one timer per grace period (while any wait) moves
    the list on, starting a watcher for each request of the older list still waiting."""

    __slots__ = ("_newer", "_older", "_timer")

    def __init__(self) -> None:
        self._newer: list[tuple[asyncio.Future[Any], BodySource]] = []
        self._older: list[tuple[asyncio.Future[Any], BodySource]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, fut: asyncio.Future[Any], body: BodySource) -> None:
        self._newer.append((fut, body))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(DISCONNECT_GRACE_S, self._tick)

    def _tick(self) -> None:
        older, self._older, self._newer = self._older, self._newer, []
        for fut, body in older:
            if not fut.done():
                task = asyncio.ensure_future(_cancel_on_disconnect(fut, body))
                fut.add_done_callback(functools.partial(_stop_watching, task))
        self._timer = asyncio.get_running_loop().call_later(DISCONNECT_GRACE_S, self._tick) if self._older else None


def _stop_watching(task: asyncio.Task[None], fut: asyncio.Future[Any]) -> None:
    task.cancel()


async def _cancel_on_disconnect(fut: asyncio.Future[Any], body: BodySource) -> None:
    await body.wait_disconnect()
    if not fut.done():
        fut.cancel(_DISCONNECTED)  # the engine drops it from the queues (RequestFuture)


def close_when_exiting(handler: Handler, server: Server) -> Handler:
    """``handler``, whose replies close their connections once the server's shutdown has begun:
    no keep-alive connection then sits idle, to be cut when the front-end stops."""

    async def serve(request: HttpRequest) -> HttpReply | None:
        reply = await handler(request)
        if reply is not None and server.exiting:
            reply.close = True
        return reply

    return serve
