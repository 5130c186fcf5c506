"""The seqserve engine: model repository, schedulers over the compiled core, backends and
the in-process API. Nothing here knows about HTTP, gRPC or wire formats."""

from __future__ import annotations

from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, InferenceError, ModelConfigError
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult
from seqserve.engine.server import Server

__all__ = [
    "Code",
    "ExecuteBatch",
    "InferRequest",
    "InferResult",
    "InferenceError",
    "ModelConfigError",
    "SequenceId",
    "Server",
]
