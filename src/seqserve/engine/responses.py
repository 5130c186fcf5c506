"""What a request gets back: results, and responders for answering late or many times.

Most requests are answered once, when their batch's ``execute`` returns. A backend whose
instances set ``uses_responders`` may instead answer a request through its ``Responder``:
from any thread, after ``execute`` has returned, and, for decoupled models
(``model_transaction_policy { decoupled: true }``), with any number of responses before
the final one. Such a request's entry in ``RequestResults.outcomes`` is ``DEFERRED``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seqserve.engine.errors import InferenceError


@dataclass(slots=True)
class InferResult:
    model_name: str
    model_version: str
    id: str
    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)


#: Called on the event loop for each response of a streaming submit: the response (or its
#: error, or None for a final flag that carries no response) and whether it is the last.
ResponseCallback = Callable[[InferResult | InferenceError | None, bool], None]

#: What a responder sends: a request's outputs (shaped as its reply), an error for this
#: response, or None (a bare final flag).
Outcome = Mapping[str, np.ndarray] | InferenceError | None


class _Deferred:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


#: A ``RequestResults`` outcome: this request is answered through its responder.
DEFERRED: Any = _Deferred()


class _Reschedule:
    __slots__ = ()

    def __repr__(self) -> str:
        return "RESCHEDULE"


#: A ``RequestResults`` outcome of an iterative sequence model: answered through its responder
#: like ``DEFERRED``, and queued again as its sequence's next step (engine/model/iterations.py).
RESCHEDULE: Any = _Reschedule()


class Responder:
    """Sends one request's responses. Thread-safe; usable until the final response.

    ``send`` raises ``InferenceError`` once the final response has been sent, or once the
    request has failed as part of its batch. Outputs are checked against the config and
    copied before ``send`` returns, so the caller may reuse its buffers.
    """

    __slots__ = ("_cancelled", "_post")

    def __init__(self, post: Callable[[Outcome, bool], None], cancelled: Callable[[], bool]) -> None:
        self._post = post
        self._cancelled = cancelled

    def send(self, outcome: Outcome = None, *, final: bool = False) -> None:
        self._post(outcome, final)

    def is_cancelled(self) -> bool:
        """True once the client has gone (its stream closed or cancelled): a model may stop
        producing. Sending stays allowed; the responses go nowhere."""
        return self._cancelled()
