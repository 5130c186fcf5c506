"""HTTP floor: a bare starlette app for the KServe v2 endpoints, served by hypercorn or granian
(``http_hypercorn.py`` / ``http_granian.py``).

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


async def infer(request: Request) -> Response:
    body = await request.body()
    hlen = request.headers.get(_HDR)
    if hlen is not None:
        n = int(hlen)
        header, blob = orjson.loads(body[:n]), body[n:]
    else:
        header, blob = orjson.loads(body), b""
    inputs = header.get("inputs") or [{}]
    first = inputs[0]
    outs = header.get("outputs") or []
    name = outs[0].get("name", common.OUTPUT_NAME) if outs else common.OUTPUT_NAME
    sent_binary = "binary_data_size" in (first.get("parameters") or {})
    if outs:
        binary = bool((outs[0].get("parameters") or {}).get("binary_data", False))
    else:
        binary = bool((header.get("parameters") or {}).get("binary_data_output", sent_binary))
    dtype = first.get("datatype", common.DATATYPE)
    shape = first.get("shape", [1, 1])
    out: dict[str, Any] = {"name": name, "datatype": dtype, "shape": shape}
    reply: dict[str, Any] = {"model_name": request.path_params["name"], "model_version": "1", "outputs": [out]}
    if "id" in header:
        reply["id"] = header["id"]
    raw = blob[: int(first["parameters"]["binary_data_size"])] if sent_binary else b""
    if binary:
        if not raw:  # JSON in, binary out
            import numpy as np

            raw = np.asarray(first.get("data", [0]), dtype=np.float32).tobytes()
        out["parameters"] = {"binary_data_size": len(raw)}
        head = orjson.dumps(reply)
        return Response(
            head + raw,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(head))},
        )
    if sent_binary:  # binary in, JSON out
        import numpy as np

        out["data"] = np.frombuffer(raw, dtype=np.float32).tolist()
    else:
        out["data"] = first.get("data", [0])
    return _json(reply)


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
