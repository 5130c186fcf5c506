"""The HTTP status of every error a route can meet, in one place: engine errors by their
``Code`` (Triton's mapping), and the front-end's own (body too large, too slow, cut short).
Every route answers an error with ``error_reply`` (a JSON ``{"error": ...}`` body)."""

from __future__ import annotations

import math

import orjson

from seqserve.api.errors import internal_error
from seqserve.api.http.body import BodyTimeout, ClientGone
from seqserve.api.limits import TooLarge
from seqserve.api.transport.exchange import HttpReply
from seqserve.engine import Code, InferenceError, SessionGoneError

#: an engine error's status, by its code (Triton's mapping)
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

#: limits.content_encoding's refusal of an unknown Content-Encoding
UNSUPPORTED_ENCODING = "Unsupported compression type"

JSON_HEADER = (b"content-type", b"application/json")


def http_status(e: InferenceError) -> int:
    """An engine error's HTTP status: Triton's mapping, 410 Gone for a session that ended or
    expired, and 415 for an unknown Content-Encoding (a client fault; Triton answers 501 with
    the same message)."""
    if isinstance(e, SessionGoneError):
        return 410
    if e.message == UNSUPPORTED_ENCODING:
        return 415
    return HTTP_STATUS.get(e.code, 400)


def json_reply(doc: object, status: int = 200) -> HttpReply:
    return HttpReply(status, [JSON_HEADER], orjson.dumps(doc))


def error_reply(message: str, status: int, *, close: bool = False) -> HttpReply:
    return HttpReply(status, [JSON_HEADER], orjson.dumps({"error": message}), close)


def reply_for(e: Exception, site: str) -> HttpReply:
    """The reply to an exception a route raised. ``site`` names the route in the log of an
    unexpected one (a 500 with a request id). A limit the client broke closes the connection:
    the rest of its body is not worth reading."""
    if isinstance(e, InferenceError):
        reply = error_reply(e.message, http_status(e))
        if e.message == UNSUPPORTED_ENCODING:
            reply.headers.append((b"accept-encoding", b"gzip, deflate"))
        if e.retry_after_s is not None:  # a full backlog: worth trying again later
            reply.headers.append((b"retry-after", str(max(1, math.ceil(e.retry_after_s))).encode()))
        return reply
    if isinstance(e, TooLarge):
        return error_reply(str(e), 413, close=True)
    if isinstance(e, BodyTimeout):
        return error_reply(str(e), 408, close=True)
    if isinstance(e, ClientGone):
        return error_reply(ClientGone.MESSAGE, 400, close=True)
    return error_reply(internal_error(site, e).message, 500)
