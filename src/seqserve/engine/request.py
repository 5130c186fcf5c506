"""The one request type: built once by a front-end's codec (or by Server's keyword
helpers) and carried unchanged through Server -> model -> core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from seqserve.engine.scope import SequenceScope
    from seqserve.engine.tracing import RequestTrace

#: a sequence's correlation id: uint64 or string (5 and "5" are different sequences)
SequenceId = int | str


@dataclass(slots=True, eq=False)
class InferRequest:
    """One inference request, independent of the transport it came on."""

    model: str
    inputs: dict[str, np.ndarray]
    version: str = ""  # "" = the model's highest loaded version
    id: str = ""  # the client's request id, echoed in the response
    sequence_id: SequenceId = 0  # 0 / "" = none
    sequence_start: bool = False
    sequence_end: bool = False
    outputs: tuple[str, ...] = ()  # requested outputs; empty = all of them
    priority: int = 0  # 0 = the model's default level
    timeout_us: int = 0  # 0 = the queue policy's default
    parameters: dict[str, Any] = field(default_factory=dict)  # the client's other parameters
    #: named by a session (engine/sessions.py): START is implied when the sequence is not
    #: live, and a session that ended or expired is refused (SessionGoneError)
    session: bool = False
    #: who sent it: the peer's address without port as the front-end saw it ("": in-process).
    #: A session's tombstones are accounted to it (engine/sessions.py)
    client: str = ""
    #: the sequences this request starts end when the scope closes (a gRPC stream's, say)
    scope: SequenceScope | None = None
    #: the W3C ``traceparent`` the client sent (front-ends read it only while tracing is on)
    trace_parent: str = ""
    #: set by ``Server.tracer`` when this request is traced (engine/tracing.py)
    trace: RequestTrace | None = None
