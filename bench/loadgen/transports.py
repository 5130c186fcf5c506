"""Transports: one sequence step = one inference request, through a tritonclient asyncio client.

Every transport has the same small interface (:class:`Transport`): ``open()``, ``step()`` (send
one step of one sequence: a payload of ``(name, datatype, array)`` input tensors, see
:mod:`bench.loadgen.workload`; return the requested output as an array), ``close()``. The load generator
knows nothing else about them, so a new transport (e.g. a raw-socket "ceiling" client) only has
to implement these three methods and register itself in :data:`TRANSPORTS`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import numpy as np

SeqId = int | str
Payload = tuple[tuple[str, str, np.ndarray], ...]


class Transport(Protocol):
    name: str

    async def open(self) -> None: ...

    async def step(self, seq_id: SeqId, payload: Payload, start: bool, end: bool, lane: int = 0) -> np.ndarray | None:
        """One step of sequence ``seq_id``; returns ``spec.output_name`` of the reply (None when the
        reply lacks it). ``lane`` is the index of the concurrent sequence slot (0..concurrency-1)
        of the caller, for transports that spread lanes over connections."""
        ...

    async def close(self) -> None: ...


class TransportSpec:
    """What every transport is given: where the server is and what to call."""

    def __init__(
        self,
        *,
        http_url: str | None,
        grpc_url: str | None,
        model: str,
        output_name: str | None = "OUTPUT",
        concurrency: int = 1,
        request_timeout_s: float = 30.0,
        streams: int = 1,
        reply_order: str = "request",
        channels: int = 1,
    ) -> None:
        self.http_url = http_url
        self.grpc_url = grpc_url
        self.model = model
        self.output_name = output_name  # the output to request and return; None: all, return none
        self.concurrency = concurrency
        self.request_timeout_s = request_timeout_s
        self.streams = streams  # grpc-stream: number of streams, 0 = one per concurrent sequence
        # grpc-stream: "completion" asks seqserve for replies as they complete (the
        # seqserve-reply-order header); "request" sends no header (Triton's request order)
        self.reply_order = reply_order
        # gRPC: channels (each its own TCP connection) the lanes are spread over; more than one lets
        # a server with worker processes (SO_REUSEPORT) spread one generator process's load
        self.channels = channels


def _grpc_clients(spec: TransportSpec) -> list[Any]:
    """``spec.channels`` tritonclient gRPC clients; beyond one, each gets its own subchannel pool,
    so its own connection (grpc otherwise shares one connection between channels to one target)."""
    import tritonclient.grpc.aio as grpcaio

    if spec.channels <= 1:
        return [grpcaio.InferenceServerClient(spec.grpc_url)]
    own_connection = [
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.max_receive_message_length", 2**31 - 1),
        ("grpc.use_local_subchannel_pool", 1),
    ]
    return [grpcaio.InferenceServerClient(spec.grpc_url, channel_args=own_connection) for _ in range(spec.channels)]


async def _close_clients(clients: list[Any]) -> None:
    for c in clients:
        await c.close()


def _output(result: Any, name: str | None) -> np.ndarray | None:
    return None if name is None else result.as_numpy(name)


def _grpc_inputs(mod: Any, payload: Payload) -> list[Any]:
    out = []
    for name, datatype, arr in payload:
        inp = mod.InferInput(name, arr.shape, datatype)
        inp.set_data_from_numpy(arr)
        out.append(inp)
    return out


class HttpTransport:
    """KServe v2 HTTP through tritonclient.http.aio (aiohttp): binary tensor data or JSON."""

    def __init__(self, spec: TransportSpec, *, binary: bool) -> None:
        if not spec.http_url:
            raise ValueError("this transport needs --http-url")
        import tritonclient.http as httpclient

        self.name = "http-binary" if binary else "http-json"
        self.spec = spec
        self.binary = binary
        self._mod = httpclient
        self._outputs = (
            [httpclient.InferRequestedOutput(spec.output_name, binary_data=binary)] if spec.output_name else None
        )
        self.client: Any = None

    async def open(self) -> None:
        import tritonclient.http.aio as httpaio

        # one keep-alive connection per concurrent sequence
        self.client = httpaio.InferenceServerClient(
            self.spec.http_url, conn_limit=max(self.spec.concurrency, 1), conn_timeout=self.spec.request_timeout_s
        )

    async def step(self, seq_id: SeqId, payload: Payload, start: bool, end: bool, lane: int = 0) -> np.ndarray | None:
        inputs = []
        for name, datatype, arr in payload:
            inp = self._mod.InferInput(name, arr.shape, datatype)
            inp.set_data_from_numpy(arr, binary_data=self.binary)
            inputs.append(inp)
        res = await self.client.infer(
            self.spec.model,
            inputs,
            outputs=self._outputs,
            sequence_id=seq_id,
            sequence_start=start,
            sequence_end=end,
        )
        return _output(res, self.spec.output_name)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None


class GrpcUnaryTransport:
    """One ModelInfer RPC per step (tritonclient.grpc.aio), all sequences on one channel (or lane
    ``i`` on channel ``i % spec.channels``)."""

    name = "grpc-unary"

    def __init__(self, spec: TransportSpec) -> None:
        if not spec.grpc_url:
            raise ValueError("this transport needs --grpc-url")
        import tritonclient.grpc as grpcclient

        self.spec = spec
        self._mod = grpcclient
        self._outputs = [grpcclient.InferRequestedOutput(spec.output_name)] if spec.output_name else None
        self.clients: list[Any] = []

    async def open(self) -> None:
        self.clients = _grpc_clients(self.spec)

    async def step(self, seq_id: SeqId, payload: Payload, start: bool, end: bool, lane: int = 0) -> np.ndarray | None:
        res = await self.clients[lane % len(self.clients)].infer(
            self.spec.model,
            _grpc_inputs(self._mod, payload),
            outputs=self._outputs,
            sequence_id=seq_id,
            sequence_start=start,
            sequence_end=end,
            client_timeout=self.spec.request_timeout_s,
        )
        return _output(res, self.spec.output_name)

    async def close(self) -> None:
        clients, self.clients = self.clients, []
        await _close_clients(clients)


class StreamError(RuntimeError):
    pass


class _Stream:
    """One ModelStreamInfer call: a request queue feeding tritonclient's ``stream_infer`` and a reader
    task that resolves the pending futures by request id."""

    def __init__(self, client: Any, headers: dict[str, str] | None = None) -> None:
        self.pending: dict[str, asyncio.Future[Any]] = {}
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.dead: BaseException | None = None
        self.orphans = 0  # responses that matched no pending request
        self.responses = client.stream_infer(self._requests(), headers=headers)
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _requests(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            yield item

    def _resolve(self, rid: str | None, result: Any, error: str | None) -> None:
        fut = self.pending.pop(rid, None) if rid else None
        if fut is None and error is not None and not rid and self.pending:
            fut = self.pending.pop(next(iter(self.pending)))  # unattributable error: oldest pending
        if fut is None:
            self.orphans += 1
            return
        if fut.done():
            return
        if error is not None:
            fut.set_exception(StreamError(error))
        else:
            fut.set_result(result)

    async def _read(self) -> None:
        try:
            call = getattr(self.responses, "_grpc_call", None)
            if call is not None:
                from tritonclient.grpc import InferResult

                async for msg in call:
                    if msg.error_message:
                        self._resolve(msg.infer_response.id, None, msg.error_message)
                    else:
                        self._resolve(msg.infer_response.id, InferResult(msg.infer_response), None)
            else:
                async for result, error in self.responses:
                    if error is not None:
                        self._resolve(None, None, str(error))
                    else:
                        self._resolve(result.get_response().id, result, None)
            raise StreamError("stream closed by the server")
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the stream is gone: fail everything pending and every later step
            self.dead = e
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(StreamError(f"stream failed: {e!r}"))
            self.pending.clear()

    async def close(self) -> None:
        self.queue.put_nowait(None)  # half-close: the server ends the stream after its last response
        try:
            await asyncio.wait_for(asyncio.shield(self.reader), timeout=5.0)
        except (asyncio.TimeoutError, Exception):
            self.reader.cancel()


class GrpcStreamTransport:
    """Sequences multiplexed on ModelStreamInfer bidi streams (tritonclient.grpc.aio ``stream_infer``
    fed by an async request iterator), all on one channel (or stream ``j`` on channel ``j %
    spec.channels``); responses are matched to requests by request id. ``spec.streams`` streams
    (0: one per concurrent sequence); lane ``i`` (the i-th concurrent sequence) always uses stream
    ``i % streams``. ``spec.reply_order == "completion"``
    opens them with the ``seqserve-reply-order: completion`` header.

    tritonclient's response iterator turns an error response into a bare exception and drops its
    id, so the reader takes the raw responses from the call underneath it when it can (servers put
    the request id in error responses too) and otherwise falls back to FIFO attribution.
    """

    name = "grpc-stream"

    def __init__(self, spec: TransportSpec) -> None:
        if not spec.grpc_url:
            raise ValueError("this transport needs --grpc-url")
        import tritonclient.grpc as grpcclient

        self.spec = spec
        self._mod = grpcclient
        self._outputs = [grpcclient.InferRequestedOutput(spec.output_name)] if spec.output_name else None
        self._ids = itertools.count(1)
        self._streams: list[_Stream] = []
        self.clients: list[Any] = []

    async def open(self) -> None:
        self.clients = _grpc_clients(self.spec)
        n = self.spec.streams if self.spec.streams > 0 else self.spec.concurrency
        headers = {"seqserve-reply-order": "completion"} if self.spec.reply_order == "completion" else None
        self._streams = [_Stream(self.clients[j % len(self.clients)], headers) for j in range(max(1, n))]

    @property
    def orphans(self) -> int:
        return sum(s.orphans for s in self._streams)

    async def step(self, seq_id: SeqId, payload: Payload, start: bool, end: bool, lane: int = 0) -> np.ndarray | None:
        stream = self._streams[lane % len(self._streams)]
        if stream.dead is not None:
            raise StreamError(f"stream failed: {stream.dead!r}")
        rid = str(next(self._ids))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        stream.pending[rid] = fut
        stream.queue.put_nowait(
            {
                "model_name": self.spec.model,
                "inputs": _grpc_inputs(self._mod, payload),
                "outputs": self._outputs,
                "request_id": rid,
                "sequence_id": seq_id,
                "sequence_start": start,
                "sequence_end": end,
            }
        )
        try:
            res = await fut
        finally:
            stream.pending.pop(rid, None)
        return _output(res, self.spec.output_name)

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self._streams))
        self._streams = []
        clients, self.clients = self.clients, []
        await _close_clients(clients)


TRANSPORTS: dict[str, Callable[[TransportSpec], Transport]] = {
    "http-binary": lambda spec: HttpTransport(spec, binary=True),
    "http-json": lambda spec: HttpTransport(spec, binary=False),
    "grpc-unary": GrpcUnaryTransport,
    "grpc-stream": GrpcStreamTransport,
}
ALIASES = {"http": "http-binary", "json": "http-json", "grpc": "grpc-unary", "stream": "grpc-stream"}


def resolve_transport(name: str) -> str:
    name = ALIASES.get(name.strip().lower(), name.strip().lower())
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r} (choose from {', '.join(TRANSPORTS)})")
    return name


__all__ = ["TRANSPORTS", "Transport", "TransportSpec", "resolve_transport"]
