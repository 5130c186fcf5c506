"""The task that runs a call's handler: a unary handler's one reply, a streaming handler's
replies as the client's window takes them, and the status the call ends with for whatever the
handler raised; and the builtin server's ``CallContext``, which the handler is given."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from seqserve.api.transport.grpc_context import CallAborted, Status
from seqserve.api.transport.grpc_messages import inflate_message

if TYPE_CHECKING:
    from seqserve.api.transport.grpc_calls import GrpcCall

log = logging.getLogger("seqserve.grpc")


async def run_unary(call: GrpcCall) -> None:
    try:
        request: Any = call.request
        if call.compressed:
            request = await inflate_message(request, call.encoding, call.conn.max_receive)
        deserialize = call.method.deserialize
        if deserialize is not None:
            request = deserialize(request)
        reply = await call.method.behaviour(request, BuiltinContext(call))
        call.send_message(reply, last=True)
    except (Exception, asyncio.CancelledError) as e:
        end_by(call, e)
    finally:
        if call.deadline is not None:
            call.deadline.cancel()
        call.release()


async def run_stream(call: GrpcCall) -> None:
    context = BuiltinContext(call)
    replies = call.method.behaviour(context, context)
    try:
        async for reply in replies:
            if not call.send_message(reply, last=False):
                await call.until_drained()
            if not call.state.local_open:
                break
        call.finish(Status.OK, "")
    except (Exception, asyncio.CancelledError) as e:
        end_by(call, e)
    finally:
        if call.deadline is not None:
            call.deadline.cancel()
        with contextlib.suppress(BaseException):  # the handler's own cleanup, now, not at GC
            await replies.aclose()
        call.release()


def end_by(call: GrpcCall, e: BaseException) -> None:
    """End the call for what its handler raised (inside its ``except``). The handlers' own
    errors are turned into statuses above this (``api/grpc/status.py``); what is left here is
    an abort, a cancellation, or a bug."""
    if isinstance(e, CallAborted):
        call.finish(e.status, e.details)
    elif isinstance(e, asyncio.CancelledError):
        # reset by the client, past its deadline, the server closing (the call has ended:
        # finish does nothing), or cancelled from elsewhere: the client must hear of it
        call.finish(Status.CANCELLED, "the call was cancelled")
    else:
        log.exception("gRPC %s failed", call.method.behaviour)
        call.finish(Status.UNKNOWN, f"Unexpected error in RPC handler: {type(e).__name__}")


class BuiltinContext:
    """The builtin server's ``CallContext``: the call's metadata and peer, and (for a stream)
    its request messages, which the context also iterates."""

    __slots__ = ("_call", "metadata")

    def __init__(self, call: GrpcCall) -> None:
        self._call = call
        self.metadata = call.metadata

    def peer(self) -> str:
        return self._call.conn.peer

    async def read(self) -> Any:
        return await self._call.read()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        read = self._call.read
        while (message := await read()) is not None:
            yield message
