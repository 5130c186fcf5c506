"""Clients for a running server: one async face over the four tritonclient flavours,
raw HTTP requests, and running-sum sequence steps."""

from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import queue
import secrets
import uuid
from collections.abc import AsyncIterator, Iterable
from functools import partial
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from tests.support.process import ServerProcess

FLAVOURS = ["http", "http_aio", "grpc", "grpc_aio"]


def grpc_server_for(http_server: str) -> str:
    """The gRPC server a test parametrized over HTTP servers runs with: grpc.aio beside hypercorn,
    the builtin one (the default) otherwise, so both gRPC servers meet the TLS and limits tests."""
    return "grpcio" if http_server == "hypercorn" else "builtin"


# engine status -> (HTTP status, gRPC status), as protocol.md 4.1 / 4.2 map them
CODES = {
    "INVALID_ARG": ("400", "StatusCode.INVALID_ARGUMENT"),
    "NOT_FOUND": ("404", "StatusCode.NOT_FOUND"),
    "UNAVAILABLE": ("503", "StatusCode.UNAVAILABLE"),
    "UNSUPPORTED": ("501", "StatusCode.UNIMPLEMENTED"),
    "INTERNAL": ("500", "StatusCode.INTERNAL"),
}

# gRPC calls that return protobuf unless as_json=True
_JSON_METHODS = {
    "get_server_metadata",
    "get_model_metadata",
    "get_model_config",
    "get_inference_statistics",
    "get_model_repository_index",
}


def new_int_id() -> int:
    return secrets.randbelow(2**62) + 1


def new_str_id() -> str:
    return f"seq-{uuid.uuid4().hex[:12]}"


class Client:
    """One tritonclient flavour behind an async interface: `await cl("method", ...)`."""

    def __init__(self, flavour: str, srv: ServerProcess) -> None:
        self.flavour = flavour
        self.is_http = flavour.startswith("http")
        self.is_aio = flavour.endswith("_aio")
        self.mod: Any = httpclient if self.is_http else grpcclient
        url = srv.http_url if self.is_http else srv.grpc_url
        cls = {
            "http": httpclient.InferenceServerClient,
            "http_aio": httpaio.InferenceServerClient,
            "grpc": grpcclient.InferenceServerClient,
            "grpc_aio": grpcaio.InferenceServerClient,
        }[flavour]
        self.raw: Any = cls(url)

    async def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if not self.is_http and method in _JSON_METHODS:
            kwargs.setdefault("as_json", True)
        result = getattr(self.raw, method)(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def close(self) -> None:
        result = self.raw.close()
        if inspect.isawaitable(result):
            await result

    def input(self, name: str, value: np.ndarray, datatype: str | None = None, *, binary: bool = True) -> Any:
        datatype = datatype or ("BYTES" if value.dtype.kind in "OSU" else _np_to_wire(value.dtype))
        inp = self.mod.InferInput(name, list(value.shape), datatype)
        if self.is_http:
            inp.set_data_from_numpy(value, binary_data=binary)
        else:
            inp.set_data_from_numpy(value)
        return inp

    def output(self, name: str, *, binary: bool = True) -> Any:
        if self.is_http:
            return self.mod.InferRequestedOutput(name, binary_data=binary)
        return self.mod.InferRequestedOutput(name)

    def code(self, kind: str) -> str:
        """The status() an InferenceServerException carries for an engine error kind."""
        return CODES[kind][0 if self.is_http else 1]

    async def step(self, model: str, seq_id: int | str, value: float, **kwargs: Any) -> float:
        """One accumulator request; returns the running sum."""
        inp = self.input("INPUT", np.array([[value]], dtype=np.float32))
        result = await self("infer", model, [inp], sequence_id=seq_id, **kwargs)
        return float(result.as_numpy("OUTPUT")[0, 0])


def add_sub_inputs(client_module: Any, rows: int = 1) -> list[Any]:
    """INPUT0 and INPUT1 of the demo add_sub model, ones of FP32 [rows, 4], as tritonclient.http's
    or tritonclient.grpc's (`client_module`) InferInput."""
    ins = []
    for name in ("INPUT0", "INPUT1"):
        inp = client_module.InferInput(name, [rows, 4], "FP32")
        inp.set_data_from_numpy(np.ones((rows, 4), dtype=np.float32))
        ins.append(inp)
    return ins


def _np_to_wire(dtype: np.dtype[Any]) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(dtype))


async def expect_error(coro: Any, status: str, *fragments: str) -> InferenceServerException:
    """Await `coro` (or its result), which must raise InferenceServerException with `status`
    and a message containing every fragment."""
    try:
        result = coro
        if inspect.isawaitable(result):
            await result
    except InferenceServerException as e:
        assert e.status() == status, f"status {e.status()} != {status}: {e.message()}"
        for f in fragments:
            assert f in (e.message() or ""), f"{f!r} not in {e.message()!r}"
        return e
    raise AssertionError(f"no error raised; expected {status} {fragments}")


# ------------------------------------------------------------------------------ raw HTTP


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers  # lower-case names
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        doc = self.json()
        assert isinstance(doc, dict) and set(doc) == {"error"}, doc
        assert isinstance(doc["error"], str) and doc["error"], doc
        return str(doc["error"])


def http_request(
    srv: ServerProcess,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | list[Any] | None = None,
    headers: dict[str, str] | None = None,
    conn: http.client.HTTPConnection | None = None,
    timeout: float = 30,
) -> RawResponse:
    """One raw HTTP request (dict/list bodies are sent as JSON)."""
    if isinstance(body, dict | list):
        body = json.dumps(body).encode()
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return RawResponse(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        if own:
            c.close()


def binary_body(doc: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    """JSON header + binary tail, with the matching Inference-Header-Content-Length."""
    head = json.dumps(doc).encode()
    return head + b"".join(chunks), {"Inference-Header-Content-Length": str(len(head))}


def acc_input(value: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [value], **extra}


def session_step(srv: ServerProcess, session: str, x: float, *, model: str = "accumulator") -> RawResponse:
    """One raw JSON accumulator step of the session `session` (Inference-Session-Id)."""
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "FP32", "data": [x]}]}
    headers = {"Content-Type": "application/json", "Inference-Session-Id": session}
    return http_request(srv, "POST", f"/v2/models/{model}/infer", body, headers, timeout=10)


def raw_output(resp: RawResponse, name: str = "OUTPUT") -> list[Any]:
    doc = resp.json()
    (out,) = [o for o in doc["outputs"] if o["name"] == name]
    return list(out["data"])


# ----------------------------------------------------------------------------- streams


class SyncStream:
    """tritonclient.grpc start_stream / async_stream_infer, results collected in a queue."""

    def __init__(self, srv: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(srv.grpc_url)
        self.results: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=partial(self._callback, self.results))

    @staticmethod
    def _callback(q: queue.Queue[Any], result: Any, error: Any) -> None:
        q.put((result, error))

    def send(self, *args: Any, **kwargs: Any) -> None:
        self.client.async_stream_infer(*args, **kwargs)

    def get(self, timeout: float = 10.0) -> tuple[Any, InferenceServerException | None]:
        return self.results.get(timeout=timeout)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def grpc_input(value: float) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return inp


async def aio_stream(
    srv: ServerProcess, requests: Iterable[dict[str, Any]], *, gap_s: float = 0.0
) -> list[tuple[Any, InferenceServerException | None]]:
    """Send `requests` (async_stream_infer keyword dicts) over one aio stream_infer call and
    collect one reply per request."""
    reqs = list(requests)
    client = grpcaio.InferenceServerClient(srv.grpc_url)
    done = asyncio.Event()

    async def gen() -> AsyncIterator[dict[str, Any]]:
        for r in reqs:
            yield r
            if gap_s:
                await asyncio.sleep(gap_s)
        await done.wait()  # keep the request side open until every reply is in

    replies = []
    try:
        async for item in client.stream_infer(gen()):
            replies.append(item)
            if len(replies) == len(reqs):
                done.set()
                break
    finally:
        await client.close()
    return replies
