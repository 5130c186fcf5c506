"""The trace extension over HTTP (``GET/POST /v2[/models/<m>]/trace/setting``) and gRPC
(``TraceSetting``): both read and change the same ``TraceManager``."""

from __future__ import annotations

from typing import Any

import orjson

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.tracing.manager import trace_manager
from seqserve.engine import Code, InferenceError, Server

MAX_SETTINGS_BODY = 64 * 1024


def http_trace_setting(server: Server, model: str, body: bytes | None) -> dict[str, Any]:
    """GET (``body`` None) or POST: the settings document after the update."""
    manager = trace_manager(server)
    if body is None:
        return manager.settings(model)
    if len(body) > MAX_SETTINGS_BODY:
        raise InferenceError(Code.INVALID_ARG, f"trace settings body over {MAX_SETTINGS_BODY} bytes")
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise InferenceError(Code.INVALID_ARG, f"trace settings: the body is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise InferenceError(Code.INVALID_ARG, "trace settings: the body must be a JSON object")
    return manager.update(model, doc)


def grpc_trace_setting(server: Server, request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
    """An empty ``settings`` map reads; an entry with no values clears that setting."""
    manager = trace_manager(server)
    if request.settings:
        update: dict[str, Any] = {}
        for key, value in request.settings.items():
            values = list(value.value)
            update[key] = values if key == "trace_level" else (values[0] if len(values) == 1 else values or None)
        doc = manager.update(request.model_name, update)
    else:
        doc = manager.settings(request.model_name)
    reply = pb.TraceSettingResponse()
    for key, v in doc.items():
        reply.settings[key].value.extend(v if isinstance(v, list) else [v])
    return reply
