"""KServe v2 HTTP/REST front-end (starlette), a thin adapter from the wire to engine.Server."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seqserve.api import kserve_json, sequences
from seqserve.api.errors import internal_error
from seqserve.api.http_body import BodyTimeout, BodyWatch, ClientGone, read_body
from seqserve.api.kserve import EXTENSIONS, NO_SHM, SESSION_END_KEY, SESSION_ID_KEY, apply_session, enqueue_single
from seqserve.api.limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    OFFLOAD_BYTES,
    TooLarge,
    content_encoding,
    inflate,
    offload,
)
from seqserve.engine import SERVER_EXITING, SERVER_NOT_READY, Code, InferenceError, Server, SessionGoneError

_ENDPOINT = "HTTP end point"  # names this front-end in the refusal of decoupled models

log = logging.getLogger("seqserve.http")

SESSION_HEADER = SESSION_ID_KEY
# Model names cannot contain "/" (as in Triton); versions are decimal.
_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
#: an infer request still waiting after one to two of these starts watching for its client's
#: disconnect, which then takes the request out of the queues (a quick step pays one list append)
DISCONNECT_GRACE_S = 0.05
_CLIENT_GONE = 499  # infer_reply's status when the client disconnected: nothing is sent
_DISCONNECTED = "the HTTP client disconnected"  # the cancel message of a request whose client left

HTTP_STATUS = {
    Code.UNKNOWN: 400,
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.INVALID_ARG: 400,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
}

_JSON = "application/json"


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type=_JSON, headers=headers)


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return _json({"error": message}, status, headers)


_UNSUPPORTED_ENCODING = "Unsupported compression type"
_JSON_HEADER = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")


def http_status(e: InferenceError) -> int:
    """An engine error's HTTP status: Triton's mapping, 410 Gone for a session that ended or
    expired, and 415 for an unknown Content-Encoding (a client fault; Triton answers 501 with
    the same message)."""
    if isinstance(e, SessionGoneError):
        return 410
    if e.message == _UNSUPPORTED_ENCODING:
        return 415
    return HTTP_STATUS.get(e.code, 400)


def _from_error(e: InferenceError) -> Response:
    headers = {"Accept-Encoding": "gzip, deflate"} if e.message == _UNSUPPORTED_ENCODING else None
    return error_response(e.message, http_status(e), headers)


def _empty(status: int = 200) -> Response:
    return Response(b"", status_code=status, media_type="text/plain")


Handler = Callable[["HttpFrontend", Request], Awaitable[Response]]


def _errors(fn: Handler) -> Handler:
    """Turn engine errors raised by a route method into Triton-style JSON error replies."""

    async def wrapped(self: HttpFrontend, request: Request) -> Response:
        try:
            return await fn(self, request)
        except InferenceError as e:
            return _from_error(e)
        except TooLarge as e:
            return error_response(str(e), 413, {"Connection": "close"})
        except BodyTimeout as e:
            return error_response(str(e), 408, {"Connection": "close"})

    wrapped.__name__ = fn.__name__
    return wrapped


class HttpFrontend:
    """Routes of the KServe v2 REST protocol and Triton's extensions over one Server."""

    def __init__(
        self,
        server: Server,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        self.server = server
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self._body_watch = BodyWatch(body_timeout_s)
        self._disconnects = _DisconnectWatch()

    async def _body(self, request: Request) -> bytes:
        try:
            return await read_body(
                request.receive, request.headers.get("content-length"), self.max_body_bytes, self._body_watch
            )
        except ClientGone:
            raise InferenceError(Code.INVALID_ARG, ClientGone.MESSAGE) from None

    # ------------------------------------------------------------------------- health

    # Once the shutdown has begun these answer as Triton does then: 503 with "Server exiting"
    # (server health) or "Server not ready" (model readiness).

    async def live(self, request: Request) -> Response:
        if self.server.exiting:
            return error_response(SERVER_EXITING, 503)
        return _empty(200 if self.server.is_live() else 400)

    async def ready(self, request: Request) -> Response:
        if self.server.exiting:
            return error_response(SERVER_EXITING, 503)
        return _empty(200 if self.server.is_ready() else 400)

    async def model_ready(self, request: Request) -> Response:
        if self.server.exiting:
            return error_response(SERVER_NOT_READY, 503)
        p = request.path_params
        if self.server.is_model_ready(p["model"], p.get("version", "")):
            return _empty()
        return error_response("Model version not ready", 400)

    # ----------------------------------------------------------------------- metadata

    async def metadata(self, request: Request) -> Response:
        return _json({**self.server.metadata(), "extensions": EXTENSIONS})

    @_errors
    async def model_metadata(self, request: Request) -> Response:
        p = request.path_params
        return _json(self.server.model_metadata(p["model"], p.get("version", "")))

    @_errors
    async def model_config(self, request: Request) -> Response:
        p = request.path_params
        return _json(self.server.model_config_json(p["model"], p.get("version", "")))

    async def stats(self, request: Request) -> Response:
        p = request.path_params
        try:
            return _json({"model_stats": _stats_json(self.server.statistics(p.get("model", ""), p.get("version", "")))})
        except InferenceError:
            return error_response(f"requested model '{p.get('model', '')}' is not available", 400)

    # ---------------------------------------------------------------------- repository

    @_errors
    async def repository_index(self, request: Request) -> Response:
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
        return _json([{k: v for k, v in e.items() if v} for e in index])

    @_errors
    async def load(self, request: Request) -> Response:
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
        await self.server.request_load_model(request.path_params["model"], config_json=config, files=files or None)
        return _empty()

    @_errors
    async def unload(self, request: Request) -> Response:
        await self._body(request)
        await self.server.request_unload_model(request.path_params["model"])
        return _empty()

    # -------------------------------------------------------------------------- infer

    @_errors
    async def infer(self, request: Request) -> Response:
        """Starlette route for infer (the ASGI app from `asgi()` answers infer without it)."""
        p = request.path_params
        body = await self._body(request)
        status, headers, out = await self.infer_reply(p["model"], str(p.get("version", "")), request.headers, body)
        return Response(out, status_code=status, headers={k.decode(): v.decode() for k, v in headers})

    async def infer_reply(
        self, model: str, version: str, headers: Mapping[str, str], body: bytes, receive: Receive | None = None
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One infer request, whatever HTTP server carries it: (status, response headers, body).
        `headers` is looked up by lower-case name; `version` is "" or the path's digits.
        `receive`: the ASGI channel the body came on; a client that disconnects while its request
        waits (past DISCONNECT_GRACE_S) cancels it, and the status is 499: send nothing."""
        session = None
        try:
            encoding = headers.get("content-encoding")
            if encoding:
                enc = content_encoding(encoding)
                if enc is not None:
                    body = await inflate(body, enc, self.max_body_bytes)
            ihcl_raw = headers.get("inference-header-content-length")
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
            session = headers.get(SESSION_HEADER)
            if session is not None or SESSION_END_KEY in headers:
                apply_session(self.server, req, session, headers.get(SESSION_END_KEY))
            fut = enqueue_single(self.server, req, _ENDPOINT)
            if receive is not None:
                self._disconnects.add(fut, receive)
            try:
                result = await fut
            except asyncio.CancelledError as e:
                if e.args == (_DISCONNECTED,):  # the request, not this handler, was cancelled
                    return _CLIENT_GONE, [], b""
                raise
            out, json_len = kserve_json.encode_response(result, options)
        except InferenceError as e:
            reply = [_JSON_HEADER]
            if e.message == _UNSUPPORTED_ENCODING:
                reply.append((b"accept-encoding", b"gzip, deflate"))
            if e.retry_after_s is not None:  # a full backlog: worth trying again later
                reply.append((b"retry-after", str(max(1, math.ceil(e.retry_after_s))).encode()))
            return http_status(e), reply, orjson.dumps({"error": e.message})
        except TooLarge as e:
            return 413, [_JSON_HEADER, _CLOSE], orjson.dumps({"error": str(e)})
        reply = []
        if json_len is not None:
            reply.append((b"content-type", b"application/octet-stream"))
            reply.append((b"inference-header-content-length", str(json_len).encode()))
        else:
            reply.append((b"content-type", b"application/json"))
        generated = result.parameters.get("sequence_id")
        if generated is not None or session:
            reply.append((b"inference-session-id", str(generated if generated is not None else session).encode()))
        accept = headers.get("accept-encoding")
        if accept:
            enc = kserve_json.choose_encoding(accept)
            if enc:
                if len(out) > OFFLOAD_BYTES:
                    out = await offload(kserve_json.compress, out, enc)
                else:
                    out = kserve_json.compress(out, enc)
                reply.append((b"content-encoding", enc.encode()))
        return 200, reply, out

    async def _infer_asgi(self, scope: Scope, receive: Receive, send: Send, model: str, version: str) -> None:
        """The infer hot path as a bare ASGI handler: no Request/Response objects."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status: int
        try:
            body = await read_body(receive, headers.get("content-length"), self.max_body_bytes, self._body_watch)
            status, reply, out = await self.infer_reply(model, version, headers, body, receive)
        except ClientGone:
            status, reply, out = 400, [_JSON_HEADER, _CLOSE], orjson.dumps({"error": ClientGone.MESSAGE})
        except TooLarge as e:
            status, reply, out = 413, [_JSON_HEADER, _CLOSE], orjson.dumps({"error": str(e)})
        except BodyTimeout as e:
            status, reply, out = 408, [_JSON_HEADER, _CLOSE], orjson.dumps({"error": str(e)})
        except Exception as e:
            err = internal_error(f"HTTP infer {model}", e)
            status, reply, out = 500, [_JSON_HEADER], orjson.dumps({"error": err.message})
        if status == _CLIENT_GONE:
            return
        reply.append((b"content-length", str(len(out)).encode()))
        try:
            await send({"type": "http.response.start", "status": status, "headers": reply})
            await send({"type": "http.response.body", "body": out})
        except OSError:  # the client is gone (ASGI servers may raise on a closed connection)
            pass

    def asgi(self) -> ASGIApp:
        """The whole HTTP API as one ASGI app: infer on the bare fast path, the rest through
        Starlette's routing."""
        app = self.app()

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "POST":
                m = _INFER_PATH.match(scope["path"])
                if m is not None:
                    await self._infer_asgi(scope, receive, send, m.group(1), m.group(2) or "")
                    return
            # An exception here was answered by Starlette's error middleware (500 with a request
            # id) and logged by internal_error within its rate limit; the middleware re-raises
            # it for the server to log, which would log every one in full.
            with contextlib.suppress(Exception):
                await app(scope, receive, send)

        return serve

    # ------------------------------------------------------------------ sequence API

    @_errors
    async def sequences(self, request: Request) -> Response:
        p = request.path_params
        return _json(sequences.list_doc(self.server, p["model"], str(p.get("version", "")), request.query_params))

    @_errors
    async def sequence(self, request: Request) -> Response:
        p = request.path_params
        version = str(p.get("version", ""))
        if request.method == "DELETE":
            doc = sequences.end_doc(self.server, p["model"], version, p["sequence_id"], request.query_params)
        else:
            doc = sequences.show_doc(self.server, p["model"], version, p["sequence_id"], request.query_params)
        return _json(doc)

    # -------------------------------------------------------------------------- app

    def app(self) -> Starlette:
        s = self
        v = "/versions/{version:int}"
        routes = [
            Route("/v2/health/live", s.live, methods=["GET"]),
            Route("/v2/health/ready", s.ready, methods=["GET"]),
            Route("/v2", s.metadata, methods=["GET"]),
            # stats before /v2/models/{model}: "stats" is not a model name
            Route("/v2/models/stats", s.stats, methods=["GET"]),
            Route("/v2/models/{model}/stats", s.stats, methods=["GET"]),
            Route("/v2/models/{model}" + v + "/stats", s.stats, methods=["GET"]),
            Route("/v2/models/{model}/ready", s.model_ready, methods=["GET"]),
            Route("/v2/models/{model}" + v + "/ready", s.model_ready, methods=["GET"]),
            Route("/v2/models/{model}/config", s.model_config, methods=["GET"]),
            Route("/v2/models/{model}" + v + "/config", s.model_config, methods=["GET"]),
            Route("/v2/models/{model}/infer", s.infer, methods=["POST"]),
            Route("/v2/models/{model}" + v + "/infer", s.infer, methods=["POST"]),
            # the sequence API (restrictable group "sequence"): docs/sequence-api.md
            Route("/v2/models/{model}/sequences", s.sequences, methods=["GET"]),
            Route("/v2/models/{model}" + v + "/sequences", s.sequences, methods=["GET"]),
            Route("/v2/models/{model}/sequences/{sequence_id:path}", s.sequence, methods=["GET", "DELETE"]),
            Route("/v2/models/{model}" + v + "/sequences/{sequence_id:path}", s.sequence, methods=["GET", "DELETE"]),
            Route("/v2/models/{model}", s.model_metadata, methods=["GET"]),
            Route("/v2/models/{model}" + v, s.model_metadata, methods=["GET"]),
            Route("/v2/repository/index", s.repository_index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", s.load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", s.unload, methods=["POST"]),
        ]
        # Triton's extensions that seqserve does not implement: a clear 501 (the HTTP twin of the
        # gRPC UNIMPLEMENTED they get), not a bare 404.
        for path, methods, message in _UNIMPLEMENTED_ROUTES:
            routes.append(Route(path, _unimplemented(message), methods=methods))

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            return error_response(exc.detail, exc.status_code)

        async def server_error(request: Request, exc: Exception) -> Response:
            err = internal_error(f"HTTP {request.method} {request.url.path[:100]}", exc)
            return error_response(err.message, 500)

        return Starlette(
            routes=routes,
            exception_handlers={HTTPException: http_error, Exception: server_error},
        )


class _DisconnectWatch:
    """Watches for the disconnect of HTTP clients whose requests still wait after one to two
    grace periods: requests join a list, and one timer per grace period (while any wait) moves
    the list on, starting a watcher for each request of the older list still waiting."""

    __slots__ = ("_newer", "_older", "_timer")

    def __init__(self) -> None:
        self._newer: list[tuple[asyncio.Future[Any], Receive]] = []
        self._older: list[tuple[asyncio.Future[Any], Receive]] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, fut: asyncio.Future[Any], receive: Receive) -> None:
        self._newer.append((fut, receive))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(DISCONNECT_GRACE_S, self._tick)

    def _tick(self) -> None:
        older, self._older, self._newer = self._older, self._newer, []
        for fut, receive in older:
            if not fut.done():
                task = asyncio.ensure_future(_cancel_on_disconnect(fut, receive))
                fut.add_done_callback(functools.partial(_stop_watching, task))
        self._timer = asyncio.get_running_loop().call_later(DISCONNECT_GRACE_S, self._tick) if self._older else None


def _stop_watching(task: asyncio.Task[None], fut: asyncio.Future[Any]) -> None:
    task.cancel()


async def _cancel_on_disconnect(fut: asyncio.Future[Any], receive: Receive) -> None:
    while not fut.done():
        msg = await receive()
        if msg["type"] == "http.disconnect":
            fut.cancel(_DISCONNECTED)  # the engine drops it from the queues (RequestFuture)
            return


def close_when_exiting(app: ASGIApp, server: Server) -> ASGIApp:
    """``app``, whose replies close their connections once the server's shutdown has begun: no
    keep-alive connection then sits idle, to be cut when the front-end stops."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        await app(scope, receive, _closing(send) if server.exiting else send)

    return serve


def _closing(send: Send) -> Send:
    """``send`` with ``connection: close`` added to the response head."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return closing_send


_NO_EXTENSION = "seqserve does not implement this extension"
_UNIMPLEMENTED_ROUTES = [
    ("/v2/logging", ["GET", "POST"], f"log settings: {_NO_EXTENSION}"),
    ("/v2/trace/setting", ["GET", "POST"], f"trace settings: {_NO_EXTENSION}"),
    ("/v2/models/{model}/trace/setting", ["GET", "POST"], f"trace settings: {_NO_EXTENSION}"),
    # status (GET), register and unregister (POST), for all regions or one
    *[
        (f"/v2/{kind}sharedmemory{path}", ["GET", "POST"], NO_SHM)
        for kind in ("system", "cuda")
        for path in ("/{action}", "/region/{region}/{action}")
    ],
]


def _unimplemented(message: str) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        return error_response(message, 501)

    return route


def _stats_json(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for s in stats:
        s.setdefault("response_stats", {})
        s.setdefault("memory_usage", [])
    return stats
