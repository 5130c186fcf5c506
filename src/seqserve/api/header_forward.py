"""Triton's --http-header-forward-pattern / --grpc-header-forward-pattern: request headers
(gRPC metadata) whose name matches the pattern (a search, case-insensitive unless the pattern
starts with (?-i)) become string parameters of the inference request, which the model reads
as the client's parameters. A parameter the request sets itself is not replaced."""

from __future__ import annotations

import re
from collections.abc import Iterable

from seqserve.engine import InferRequest


def forward_headers(
    request: InferRequest, headers: Iterable[tuple[str, str | bytes]], pattern: re.Pattern[str]
) -> None:
    parameters = request.parameters
    for name, value in headers:
        if type(value) is str and pattern.search(name) and name not in parameters:
            parameters[name] = value


def decoded_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str | bytes]]:
    """HTTP header pairs as text (names are lower-case ASCII; values latin-1, as HTTP's)."""
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]


def forwarded_metadata(
    metadata: Iterable[tuple[str, str | bytes]], pattern: re.Pattern[str] | None
) -> tuple[tuple[str, str], ...]:
    """The entries of a stream's metadata that become parameters of each of its requests."""
    if pattern is None:
        return ()
    return tuple((name, value) for name, value in metadata if type(value) is str and pattern.search(name))
