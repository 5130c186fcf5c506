"""HTTP floor: a bare starlette app for the KServe v2 endpoints, served by each HTTP server
(``http_builtin.py``, ``http_hypercorn.py``, ``http_granian.py``, ``http_uvicorn.py``);
``http_httptools.py`` answers the same requests without ASGI.

``POST /v2/models/{name}/infer`` decodes the request (JSON, or a JSON header plus binary tensor
data when ``Inference-Header-Content-Length`` is set) and echoes its first input as ``OUTPUT``:
binary when the request asked for binary outputs (or sent binary inputs and named no output),
JSON otherwise.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.floors import common

_HDR = "inference-header-content-length"


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


async def ready(request: Request) -> Response:
    return Response(b"", status_code=200)


async def server_metadata(request: Request) -> Response:
    return _json({"name": "floor-http", "version": "0", "extensions": []})


async def metadata(request: Request) -> Response:
    return _json(common.model_metadata(request.path_params["name"]))


def infer_echo(name: str, header_length: str | None, body: bytes) -> tuple[str, bytes, int | None]:
    """The echo reply to an infer request: (content type, body, Inference-Header-Content-Length
    of a binary reply or None)."""
    if header_length is not None:
        n = int(header_length)
        header, blob = orjson.loads(body[:n]), body[n:]
    else:
        header, blob = orjson.loads(body), b""
    inputs = header.get("inputs") or [{}]
    first = inputs[0]
    outs = header.get("outputs") or []
    out_name = outs[0].get("name", common.OUTPUT_NAME) if outs else common.OUTPUT_NAME
    sent_binary = "binary_data_size" in (first.get("parameters") or {})
    if outs:
        binary = bool((outs[0].get("parameters") or {}).get("binary_data", False))
    else:
        binary = bool((header.get("parameters") or {}).get("binary_data_output", sent_binary))
    dtype = first.get("datatype", common.DATATYPE)
    shape = first.get("shape", [1, 1])
    out: dict[str, Any] = {"name": out_name, "datatype": dtype, "shape": shape}
    reply: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": [out]}
    if "id" in header:
        reply["id"] = header["id"]
    raw = blob[: int(first["parameters"]["binary_data_size"])] if sent_binary else b""
    if binary:
        if not raw:  # JSON in, binary out
            import numpy as np

            raw = np.asarray(first.get("data", [0]), dtype=np.float32).tobytes()
        out["parameters"] = {"binary_data_size": len(raw)}
        head = orjson.dumps(reply)
        return "application/octet-stream", head + raw, len(head)
    if sent_binary:  # binary in, JSON out
        import numpy as np

        out["data"] = np.frombuffer(raw, dtype=np.float32).tolist()
    else:
        out["data"] = first.get("data", [0])
    return "application/json", orjson.dumps(reply), None


async def infer(request: Request) -> Response:
    kind, body, json_len = infer_echo(request.path_params["name"], request.headers.get(_HDR), await request.body())
    headers = {} if json_len is None else {"Inference-Header-Content-Length": str(json_len)}
    return Response(body, media_type=kind, headers=headers)


app = Starlette(
    routes=[
        Route("/v2/health/ready", ready),
        Route("/v2/health/live", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/{name}/ready", ready),
        Route("/v2/models/{name}/versions/{version}/ready", ready),
        Route("/v2/models/{name}", metadata),
        Route("/v2/models/{name}/infer", infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
    ]
)
