"""The keyword form of a request, for embedding applications (``Server.submit``, ``infer``,
``stream``, ``submit_streaming``): its options are declared once here, and one function turns
them into an ``InferRequest``, field by field by name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np

from seqserve.engine.request import InferRequest, SequenceId


class RequestOptions(TypedDict, total=False):
    """A request's options besides its model and inputs; each defaults to the request's own
    default (``InferRequest``)."""

    version: str | int  # "", -1, "-1": the highest loaded version
    sequence_id: SequenceId
    sequence_start: bool
    sequence_end: bool
    outputs: Sequence[str] | None  # None: every output
    request_id: str
    timeout_us: int
    priority: int
    client: str  # whom a session's tombstones count against ("": the in-process callers' shared key)


_OPTION_NAMES = frozenset(RequestOptions.__annotations__)


def keyword_request(caller: str, model: str, inputs: Mapping[str, np.ndarray], options: RequestOptions) -> InferRequest:
    """The ``InferRequest`` that ``caller`` (a Server method) was given as keywords; an
    unknown keyword is the TypeError Python raises for one."""
    unknown = options.keys() - _OPTION_NAMES
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument '{min(unknown)}'")
    version = options.get("version", "")
    return InferRequest(
        model=model,
        inputs=dict(inputs),
        version="" if version in ("", None, -1, "-1") else str(version),
        id=options.get("request_id", ""),
        sequence_id=options.get("sequence_id", 0),
        sequence_start=options.get("sequence_start", False),
        sequence_end=options.get("sequence_end", False),
        outputs=tuple(options.get("outputs") or ()),
        priority=options.get("priority", 0),
        timeout_us=options.get("timeout_us", 0),
        client=options.get("client", ""),
    )
