"""``python -m bench.studies.stream_frontend``: the gRPC stream front-end's own CPU per message, without
grpc's core or the engine.

Drives ``InferenceServicer.ModelStreamInfer`` as grpc.aio does (a context whose ``read`` hands
out serialized requests, the same requests as the async iterator grpc.aio passes, the replies
taken from the handler's async generator) against a stand-in Server that answers each request
from a loop callback, as an inline batch does. Each stream is closed-loop: its next request is
readable once its previous reply was written. What is measured is process CPU per message: the
decode, the session's bookkeeping, the reply's encoding and the task switches between them.
Load-independent enough to compare two versions of the front-end on a busy machine (run them
alternately; see bench/docs/front-ends.md, "gRPC stream front-end").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import numpy as np

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.api.grpc.servicer import InferenceServicer
from seqserve.engine import InferRequest, InferResult


class _Server:
    """What the stream needs of a Server: a model lookup and enqueue_streaming, answering
    from a loop callback with a running-sum-sized result."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._decoupled = SimpleNamespace(decoupled=False)

    def model(self, name: str, version: str) -> Any:
        return self._decoupled

    def enqueue_streaming(
        self, request: InferRequest, on_response: Callable[[Any, bool], None], *, model: Any = None
    ) -> Callable[[], None]:
        out = {"OUTPUT": request.inputs["INPUT"] + 1.0}
        self._loop.call_soon(on_response, InferResult(request.model, "1", request.id, out), True)
        return _nothing


def _nothing() -> None:
    pass


class _Context:
    """A call context (``CallContext``) for one stream: ``read`` blocks until the previous reply
    was taken (closed loop), then returns the next request, and None after ``steps``."""

    def __init__(self, requests: list[bytes]) -> None:
        self._requests = requests
        self._next = 0
        self._turn: asyncio.Event = asyncio.Event()
        self._turn.set()

    metadata = ()

    def peer(self) -> str:
        return ""

    def replied(self) -> None:
        self._turn.set()

    async def read(self) -> Any:
        await self._turn.wait()
        self._turn.clear()
        if self._next == len(self._requests):
            return None
        self._next += 1
        return self._requests[self._next - 1]

    async def iterate(self) -> AsyncIterator[bytes]:
        while (item := await self.read()) is not None:
            yield item


def _requests(stream: int, steps: int) -> list[bytes]:
    out = []
    for step in range(steps):
        msg = pb.ModelInferRequest(model_name="accumulator", id=str(step))
        msg.parameters["sequence_id"].int64_param = stream + 1
        msg.parameters["sequence_start"].bool_param = step == 0
        msg.parameters["sequence_end"].bool_param = step == steps - 1
        t = msg.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
        msg.raw_input_contents.append(np.array([[1.0]], np.float32).tobytes())
        del t
        out.append(msg.SerializeToString())
    return out


async def _stream(servicer: InferenceServicer, ctx: _Context) -> int:
    n = 0
    async for _reply in servicer.ModelStreamInfer(ctx.iterate(), ctx):
        n += 1
        ctx.replied()
    return n


async def _round(streams: int, steps: int) -> float:
    servicer = InferenceServicer(_Server())  # type: ignore[arg-type]
    contexts = [_Context(_requests(s, steps)) for s in range(streams)]
    t0 = time.process_time()
    counts = await asyncio.gather(*[_stream(servicer, c) for c in contexts])
    cpu = time.process_time() - t0
    assert sum(counts) == streams * steps, counts
    return cpu / (streams * steps) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--steps", type=int, default=2000, help="messages per stream and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    args = ap.parse_args()
    run: Any = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        run = uvloop.run
    us = [run(_round(args.streams, args.steps)) for _ in range(args.rounds)]
    print(
        f"stream front-end: {args.streams} streams x {args.steps} messages, {args.loop}: "
        f"median {statistics.median(us):.2f} us CPU/message (rounds: {', '.join(f'{u:.2f}' for u in us)})"
    )


if __name__ == "__main__":
    main()
