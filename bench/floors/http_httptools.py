"""HTTP floor without ASGI: ``python bench/floors/http_httptools.py PORT [--host H]``.

The least an HTTP/1.1 server on the event loop can cost per request: an asyncio protocol on
uvloop whose httptools parser calls back as the request arrives, and the echo reply of
:mod:`bench.floors.asgi_app` written in one ``write`` when the request is complete. No ASGI
scope, no task, no routing table, no limits: seqserve's builtin server (``http_builtin.py``)
is this plus a task per request, the routing table and the limits of docs/security.md.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

if __package__ in (None, ""):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httptools
import orjson

from bench.floors import common
from bench.floors.asgi_app import infer_echo


class EchoProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.header_length: str | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self.header_length = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path = self.url.decode().split("?", 1)[0]
        body, self.body, self.url = b"".join(self.body), [], b""
        parts = path.split("/")  # /v2/models/{name}[/versions/{v}][/infer|/ready]
        extra = b""
        if path.endswith("/infer"):
            kind, out, json_len = infer_echo(parts[3], self.header_length, body)
            if json_len is not None:
                extra = b"inference-header-content-length: %d\r\n" % json_len
        elif len(parts) >= 4 and parts[2] == "models" and not path.endswith("/ready"):
            kind, out = "application/json", orjson.dumps(common.model_metadata(parts[3]))
        elif path == "/v2":
            kind, out = "application/json", orjson.dumps({"name": "floor-http", "version": "0", "extensions": []})
        else:  # readiness and liveness
            kind, out = "text/plain", b""
        self.header_length = None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
            % (kind.encode(), len(out), extra, out)
        )


async def serve(host: str, port: int) -> None:
    await common.serve_protocol(EchoProtocol, host, port)


def main(argv: list[str] | None = None) -> int:
    return common.serve_main("http_httptools.py", serve, argv)


if __name__ == "__main__":
    sys.exit(main())
