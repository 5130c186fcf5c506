"""Keyword conveniences for embedding applications: each builds one ``InferRequest``
and hands it to ``enqueue`` / ``enqueue_streaming``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from seqserve.engine.errors import InferenceError
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult, ResponseCallback
from seqserve.engine.server_state import (
    _version_str,
)


class KeywordAPI:
    """Part of ``Server``; see ``seqserve.engine.server``."""

    if TYPE_CHECKING:  # provided by Server

        def enqueue(self, request: InferRequest) -> asyncio.Future[InferResult]: ...

        def enqueue_streaming(self, request: InferRequest, on_response: ResponseCallback) -> Callable[[], None]: ...

    def submit(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> asyncio.Future[InferResult]:
        """``enqueue`` with the request given as keywords."""
        return self.enqueue(
            InferRequest(
                model,
                dict(inputs),
                _version_str(version),
                request_id,
                sequence_id,
                sequence_start,
                sequence_end,
                tuple(outputs or ()),
                priority,
                timeout_us,
            )
        )

    def submit_streaming(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        on_response: ResponseCallback,
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> Callable[[], None]:
        """``enqueue_streaming`` with the request given as keywords."""
        return self.enqueue_streaming(
            InferRequest(
                model,
                dict(inputs),
                _version_str(version),
                request_id,
                sequence_id,
                sequence_start,
                sequence_end,
                tuple(outputs or ()),
                priority,
                timeout_us,
            ),
            on_response,
        )

    async def stream(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> AsyncIterator[InferResult]:
        """Run one request and yield its responses as they come (one for most models, any
        number for decoupled ones). An error response is raised, which ends the iteration.
        Leaving the iteration early cancels the request (models see ``is_cancelled()``)."""
        queue: asyncio.Queue[tuple[InferResult | InferenceError | None, bool]] = asyncio.Queue()
        cancel = self.submit_streaming(
            model,
            inputs,
            lambda response, final: queue.put_nowait((response, final)),
            version=version,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            outputs=outputs,
            request_id=request_id,
            timeout_us=timeout_us,
            priority=priority,
        )
        final = False
        try:
            while not final:
                response, final = await queue.get()
                if isinstance(response, InferenceError):
                    raise response
                if response is not None:
                    yield response
        finally:
            if not final:
                cancel()

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: str | int = "",
        sequence_id: SequenceId = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        timeout_us: int = 0,
        priority: int = 0,
    ) -> InferResult:
        """Run one request and wait for its result; see `submit`."""
        return await self.submit(
            model,
            inputs,
            version=version,
            sequence_id=sequence_id,
            sequence_start=sequence_start,
            sequence_end=sequence_end,
            outputs=outputs,
            request_id=request_id,
            timeout_us=timeout_us,
            priority=priority,
        )
