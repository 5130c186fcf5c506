"""The gRPC status a failure ends its call with: one table from the engine's error codes, and
the INTERNAL answer (with a request id) for what the servicers did not expect."""

from __future__ import annotations

from seqserve.api.errors import internal_error
from seqserve.api.kserve import clip
from seqserve.api.transport.grpc_context import CallAborted, Status
from seqserve.engine import Code, InferenceError

GRPC_STATUS = {
    Code.UNKNOWN: Status.UNKNOWN,
    Code.INTERNAL: Status.INTERNAL,
    Code.NOT_FOUND: Status.NOT_FOUND,
    Code.INVALID_ARG: Status.INVALID_ARGUMENT,
    Code.UNAVAILABLE: Status.UNAVAILABLE,
    Code.UNSUPPORTED: Status.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: Status.ALREADY_EXISTS,
    Code.CANCELLED: Status.CANCELLED,
}

#: the longest message a status carries: it travels in a trailer, clients drop trailers over
#: 16 KiB, and a message that quotes a huge client string must be cut or the client never
#: sees the answer
MAX_STATUS_MESSAGE = 4000


def aborted(err: InferenceError) -> CallAborted:
    """What ends a call that failed with ``err``."""
    return CallAborted(GRPC_STATUS.get(err.code, Status.UNKNOWN), clip(err.message, MAX_STATUS_MESSAGE))


def unexpected(rpc: str, e: BaseException) -> CallAborted:
    """What ends a call whose servicer raised ``e`` unexpectedly: INTERNAL and a request id
    (grpcio would say UNKNOWN), the exception logged (``errors.internal_error``)."""
    return aborted(internal_error(f"gRPC {rpc}", e))
