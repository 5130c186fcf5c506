"""KServe v2 HTTP/REST front-end (starlette), a thin adapter from the wire to engine.Server."""

from __future__ import annotations

import base64
import binascii
import logging
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
from seqserve.api.kserve import EXTENSIONS, SESSION_END_KEY, SESSION_ID_KEY, apply_session, enqueue_single
from seqserve.engine import SERVER_EXITING, SERVER_NOT_READY, Code, InferenceError, Server, SessionGoneError

_ENDPOINT = "HTTP end point"  # names this front-end in the refusal of decoupled models

log = logging.getLogger("seqserve.http")

SESSION_HEADER = SESSION_ID_KEY
# Model names cannot contain "/" (as in Triton); versions are decimal.
_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
DEFAULT_MAX_BODY_BYTES = 1 << 30

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


def http_status(e: InferenceError) -> int:
    """An engine error's HTTP status: Triton's mapping, and 410 Gone for a session that ended
    or expired."""
    if isinstance(e, SessionGoneError):
        return 410
    return HTTP_STATUS.get(e.code, 400)


def _from_error(e: InferenceError) -> Response:
    headers = {"Accept-Encoding": "gzip, deflate"} if e.message == "Unsupported compression type" else None
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
        except _TooLarge as e:
            return error_response(str(e), 413)

    wrapped.__name__ = fn.__name__
    return wrapped


class HttpFrontend:
    """Routes of the KServe v2 REST protocol and Triton's extensions over one Server."""

    def __init__(self, server: Server, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.server = server
        self.max_body_bytes = max_body_bytes

    async def _body(self, request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise _TooLarge(int(length), self.max_body_bytes)
        chunks = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.max_body_bytes:
                raise _TooLarge(total, self.max_body_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

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

    async def infer(self, request: Request) -> Response:
        """Starlette route for infer (the ASGI app from `asgi()` answers infer without it)."""
        p = request.path_params
        try:
            body = await self._body(request)
        except _TooLarge as e:
            return error_response(str(e), 413)
        status, headers, out = await self.infer_reply(p["model"], str(p.get("version", "")), request.headers, body)
        return Response(out, status_code=status, headers={k.decode(): v.decode() for k, v in headers})

    async def infer_reply(
        self, model: str, version: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One infer request, whatever HTTP server carries it: (status, response headers, body).
        `headers` is looked up by lower-case name; `version` is "" or the path's digits."""
        session = None
        try:
            encoding = headers.get("content-encoding")
            if encoding:
                body = kserve_json.decompress(body, encoding)
            ihcl_raw = headers.get("inference-header-content-length")
            ihcl = None
            if ihcl_raw is not None:
                if not ihcl_raw.strip().isdigit():
                    raise InferenceError(
                        Code.INVALID_ARG,
                        f"Inference-Header-Content-Length '{ihcl_raw}' is not a non-negative integer",
                    )
                ihcl = int(ihcl_raw)
            req, options = kserve_json.decode_request(body, ihcl, model, version)
            session = headers.get(SESSION_HEADER)
            if session is not None or SESSION_END_KEY in headers:
                apply_session(self.server, req, session, headers.get(SESSION_END_KEY))
            result = await enqueue_single(self.server, req, _ENDPOINT)
            out, json_len = kserve_json.encode_response(result, options)
        except InferenceError as e:
            reply = [(b"content-type", b"application/json")]
            if e.message == "Unsupported compression type":
                reply.append((b"accept-encoding", b"gzip, deflate"))
            return http_status(e), reply, orjson.dumps({"error": e.message})
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
                out = kserve_json.compress(out, enc)
                reply.append((b"content-encoding", enc.encode()))
        return 200, reply, out

    async def _infer_asgi(self, scope: Scope, receive: Receive, send: Send, model: str, version: str) -> None:
        """The infer hot path as a bare ASGI handler: no Request/Response objects."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        limit = self.max_body_bytes
        length = headers.get("content-length")
        status: int
        if length is not None and length.isdigit() and int(length) > limit:
            status, reply, out = 413, [(b"content-type", b"application/json")], b""
            out = orjson.dumps({"error": str(_TooLarge(int(length), limit))})
        else:
            chunks: list[bytes] = []
            total = 0
            more = True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunk = msg.get("body", b"")
                total += len(chunk)
                if total > limit:
                    break
                chunks.append(chunk)
                more = msg.get("more_body", False)
            if total > limit:
                status, reply = 413, [(b"content-type", b"application/json")]
                out = orjson.dumps({"error": str(_TooLarge(total, limit))})
            else:
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                status, reply, out = await self.infer_reply(model, version, headers, body)
        reply.append((b"content-length", str(len(out)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": reply})
        await send({"type": "http.response.body", "body": out})

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

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            return error_response(exc.detail, exc.status_code)

        async def server_error(request: Request, exc: Exception) -> Response:
            log.exception("unhandled error on %s", request.url.path, exc_info=exc)
            return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)

        return Starlette(
            routes=routes,
            exception_handlers={HTTPException: http_error, Exception: server_error},
        )


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


class _TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"request body of {size} bytes exceeds the server's limit of {limit} bytes")


def _stats_json(stats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for s in stats:
        s.setdefault("response_stats", {})
        s.setdefault("memory_usage", [])
    return stats
