"""``--grpc-server grpcio``: the method table (``methods.methods_of``) served by grpc.aio. Each
behaviour gets grpc.aio's context wrapped as seqserve's ``CallContext`` (``AioContext``), and
a ``CallAborted`` it raises becomes grpc.aio's ``abort``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from seqserve.api.transport.grpc_context import CallAborted, Metadata, Method

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class AioContext:
    """grpc.aio's servicer context as a ``CallContext``."""

    __slots__ = ("_context", "_metadata")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self._metadata: Metadata | None = None

    @property
    def metadata(self) -> Metadata:
        if self._metadata is None:
            self._metadata = tuple(self._context.invocation_metadata() or ())
        return self._metadata

    def peer(self) -> str:
        return str(self._context.peer())

    async def read(self) -> Any:
        message = await self._context.read()
        return None if message is grpc.aio.EOF else message


async def _abort(context: grpc.aio.ServicerContext, e: CallAborted) -> None:
    await context.abort(_STATUS_CODES[int(e.status)], e.details)


def _unary(behaviour: Any) -> Any:
    async def rpc(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behaviour(request, AioContext(context))
        except CallAborted as e:
            await _abort(context, e)

    return rpc


def _stream(behaviour: Any) -> Any:
    async def rpc(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        replies = behaviour(requests, AioContext(context))
        try:
            async for reply in replies:
                yield reply
        except CallAborted as e:
            await _abort(context, e)
        finally:
            await replies.aclose()  # the rpc's own clean-up runs now

    return rpc


def add_service(g: grpc.aio.Server, service: ServiceDescriptor, methods: Mapping[bytes, Method]) -> None:
    """Register ``service``'s rows of the method table on grpc.aio, as the generated
    ``add_*_to_server`` does, but as a generic handler only, none as a "registered method":
    grpc.aio keeps a pending request-call future per registered method and runs ``asyncio.wait``
    over them and the generic one for every incoming call: registering none measured 6% less
    server CPU per unary call than registering ModelInfer and ModelStreamInfer
    (bench/docs/front-ends.md, "Where a unary call's time goes")."""
    prefix = f"/{service.full_name}/".encode()
    handlers = {}
    for path, m in methods.items():
        if not path.startswith(prefix):
            continue
        if m.streaming:
            handler = grpc.stream_stream_rpc_method_handler(
                _stream(m.behaviour), request_deserializer=m.deserialize, response_serializer=m.serialize
            )
        else:
            handler = grpc.unary_unary_rpc_method_handler(
                _unary(m.behaviour), request_deserializer=m.deserialize, response_serializer=m.serialize
            )
        handlers[path[len(prefix) :].decode()] = handler
    g.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
