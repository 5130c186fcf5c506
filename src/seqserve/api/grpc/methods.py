"""The method table both gRPC servers serve: each rpc of a servicer by its path, with its
(de)serializer and the guards composed around it once, here, instead of on the servicer
(``methods_of``). The builtin server serves the table as it is; grpc.aio through ``aio``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor

from seqserve.api import security
from seqserve.api.grpc.codec import Undecodable, safe_deserializer
from seqserve.api.grpc.status import unexpected
from seqserve.api.transport.grpc_context import CallAborted, CallContext, Method, Status

Behaviour = Callable[..., Any]


def methods_of(
    servicer: Any,
    service: ServiceDescriptor,
    *,
    raw: Iterable[str] = (),
    unimplemented: Mapping[str, str] | None = None,
    guarded: bool = False,
    checks_itself: Iterable[str] = (),
    restrictions: Mapping[str, security.Restriction] | None = None,
) -> dict[bytes, Method]:
    """``servicer``'s rpcs of ``service`` by path. ``raw``: the rpcs that take and return bytes
    (no (de)serializer); ``unimplemented``: rpcs answered UNIMPLEMENTED with the message given;
    ``guarded``: the unary rpcs (but those in ``checks_itself``) answer an undecodable request
    with INVALID_ARGUMENT and an unexpected exception with INTERNAL (``guard``); then the
    ``restrictions`` of their groups, checked first (``security.restrict_grpc``)."""
    raw = set(raw)
    unimplemented = unimplemented or {}
    checks_itself = set(checks_itself)
    methods: dict[bytes, Method] = {}
    for m in service.methods:
        if m.client_streaming != m.server_streaming:
            raise TypeError(f"{service.full_name}/{m.name}: only unary and bidirectional rpcs are served")
        if m.name in raw:
            deserialize = serialize = None
        else:
            deserialize = safe_deserializer(message_factory.GetMessageClass(m.input_type))
            serialize = message_factory.GetMessageClass(m.output_type).SerializeToString
        refusal = unimplemented.get(m.name)
        behaviour = getattr(servicer, m.name) if refusal is None else refuse(Status.UNIMPLEMENTED, refusal)
        if guarded and not m.client_streaming and m.name not in checks_itself:
            behaviour = guard(m.name, behaviour)
        path = f"/{service.full_name}/{m.name}"
        if restrictions:
            behaviour = security.restrict_grpc(behaviour, path, m.server_streaming, restrictions)
        methods[path.encode()] = Method(behaviour, m.client_streaming, deserialize, serialize)
    return methods


def refuse(status: Status, message: str) -> Behaviour:
    """A unary rpc that ends every call with ``status`` and ``message``."""

    async def rpc(request: Any, context: CallContext) -> Any:
        raise CallAborted(status, message)

    return rpc


def guard(name: str, behaviour: Behaviour) -> Behaviour:
    """A unary rpc that answers an undecodable request with INVALID_ARGUMENT and an unexpected
    exception with INTERNAL and a request id (grpcio would say UNKNOWN)."""

    async def rpc(request: Any, context: CallContext) -> Any:
        if type(request) is Undecodable:
            raise CallAborted(Status.INVALID_ARGUMENT, request.message)
        try:
            return await behaviour(request, context)
        except (CallAborted, asyncio.CancelledError):
            raise
        except Exception as e:
            raise unexpected(name, e) from None

    return rpc
