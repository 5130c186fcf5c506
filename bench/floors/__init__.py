"""Floor servers: the least a KServe v2 front-end can do per request (decode, encode, reply).

Each is a script with a port argument (``python bench/floors/grpc_stream.py 9001``) that
``python -m bench --spawn-floor NAME`` starts to measure (a) the server CPU per step that a
front-end costs with no engine behind it and (b) the load generator's own ceiling against an
endpoint that is never the bottleneck. They answer any model name as if it were the demo
``accumulator`` (metadata: FP32 ``INPUT`` [-1, 1] -> FP32 ``OUTPUT`` [-1, 1]); a reply echoes the
request's first input under the first requested output name (default ``OUTPUT``).
"""

from __future__ import annotations

from pathlib import Path

# name -> (script, transports it can stand in for)
FLOORS: dict[str, tuple[str, tuple[str, ...]]] = {
    "grpc-builtin": ("grpc_builtin.py", ("grpc-stream", "grpc-unary")),  # seqserve's default gRPC server
    "grpc-stream": ("grpc_stream.py", ("grpc-stream", "grpc-unary")),  # grpc.aio
    "http-builtin": ("http_builtin.py", ("http-binary", "http-json")),
    "http-hypercorn": ("http_hypercorn.py", ("http-binary", "http-json")),
    "http-granian": ("http_granian.py", ("http-binary", "http-json")),
    # uvicorn is not installed with seqserve: `pip install uvicorn` to run this one
    "http-uvicorn": ("http_uvicorn.py", ("http-binary", "http-json")),
    # no ASGI: the least an HTTP/1.1 server on the loop costs (bench/docs/front-ends.md, "HTTP: the builtin server")
    "http-httptools": ("http_httptools.py", ("http-binary", "http-json")),
    # the ways to serve gRPC unary, compared in bench/docs/front-ends.md ("gRPC unary: the floors of each way")
    "grpc-sync": ("grpc_sync.py", ("grpc-unary",)),
    "grpc-sync-handoff": ("grpc_sync_handoff.py", ("grpc-unary",)),
    "grpc-h2": ("grpc_h2.py", ("grpc-unary",)),
}


def script_path(name: str) -> Path:
    return Path(__file__).resolve().parent / FLOORS[name][0]
