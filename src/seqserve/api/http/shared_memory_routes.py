"""The HTTP routes of Triton's system and CUDA shared-memory extensions over one registry:
status (GET), register and unregister (POST), for every region of the kind or one
(``/region/<name>/``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from seqserve.api.cuda_shared_memory import raw_handle_from_json
from seqserve.api.http.kserve_json import loads
from seqserve.api.http.router import Route
from seqserve.api.http.status import error_reply, json_reply
from seqserve.api.kserve import bad
from seqserve.api.shared_memory import SharedMemoryRegistry
from seqserve.api.transport.exchange import HttpReply, HttpRequest

#: reads a request's body within the front-end's limits
BodyReader = Callable[[HttpRequest], Awaitable[bytes]]

_SYSTEM = "/v2/systemsharedmemory"
#: (action, whether the path names a region) -> (the endpoint's name, its method)
_ACTIONS = {
    ("status", False): ("status", "GET"),
    ("status", True): ("status", "GET"),
    ("register", True): ("register", "POST"),
    ("unregister", False): ("unregister", "POST"),
    ("unregister", True): ("unregister", "POST"),
}
_CUDA = "/v2/cudasharedmemory"


class SharedMemoryRoutes:
    """Register, unregister and status of system (``cuda`` false) or CUDA shared-memory regions."""

    def __init__(self, registry: SharedMemoryRegistry, read_body: BodyReader, *, cuda: bool = False) -> None:
        self.registry = registry
        self.read_body = read_body
        self.cuda = cuda

    async def status(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        return json_reply(self.registry.status(p.get("region", ""), cuda=self.cuda))

    async def register(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        doc = loads(await self.read_body(request))
        if self.cuda:
            if not isinstance(doc, dict):
                raise bad("the register request must be a JSON object with 'raw_handle', 'device_id' and 'byte_size'")
            handle = raw_handle_from_json(doc)
            self.registry.register_cuda(p["region"], handle, _size(doc, "device_id", 0), _size(doc, "byte_size", None))
            return json_reply({})
        if not isinstance(doc, dict):
            raise bad("the register request must be a JSON object with 'key', 'offset' and 'byte_size'")
        key = doc.get("key")
        if not isinstance(key, str):
            raise bad("Unable to parse 'key': expected a string")
        offset, size = _size(doc, "offset", 0), _size(doc, "byte_size", None)
        self.registry.register(p["region"], key, offset, size)
        return json_reply({})

    async def unregister(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        await self.read_body(request)
        self.registry.unregister(p.get("region", ""), cuda=self.cuda)
        return json_reply({})

    async def action(self, request: HttpRequest, p: dict[str, Any]) -> HttpReply:
        """``status`` (GET), ``register`` (POST, one region) or ``unregister`` (POST)."""
        found = _ACTIONS.get((p["action"], "region" in p))
        if found is None:
            return error_reply("Not Found", 404)
        endpoint, method = found
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return error_reply("Method Not Allowed", 405)
        reply: HttpReply = await getattr(self, endpoint)(request, p)
        return reply

    def routes(self) -> list[Route]:
        """The templates of ``security.HTTP_API`` (one group, "shared-memory")."""
        base = _CUDA if self.cuda else _SYSTEM
        return [
            Route(base + "/{action}", self.action, ["GET", "POST"]),
            Route(base + "/region/{region}/{action}", self.action, ["GET", "POST"]),
        ]


def _size(doc: dict[str, Any], field: str, default: int | None) -> int:
    value = doc.get(field, default)
    if type(value) is not int or value < 0:
        raise bad(f"Unable to parse '{field}': expected a non-negative integer")
    return value
