"""Routing of the KServe HTTP routes by path template and method, with the answers clients
had from Starlette's router before (404 ``Not Found``, 405 ``Method Not Allowed``, a 307 to
the path with or without its trailing slash when that one has a route, ``HEAD`` wherever
``GET`` is served) and no ASGI in between."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

from seqserve.api.http.status import error_reply, reply_for
from seqserve.api.transport.exchange import HttpReply, HttpRequest

#: a route's handler: the request and its path parameters (``{version:int}`` as an int)
Endpoint = Callable[[HttpRequest, dict[str, Any]], Awaitable[HttpReply]]

#: the regular expression of each kind of path parameter (Starlette's convertors)
PARAM_PATTERNS = {"": "[^/]+", "str": "[^/]+", "int": "[0-9]+", "path": ".*"}
_PARAM = re.compile(r"{([a-zA-Z_]\w*)(?::(\w*))?}")


def template_regex(template: str, *, named: bool = False) -> str:
    """A path template (``/v2/models/{model}/versions/{version:int}``) as a regular expression;
    ``named``: with a named group per parameter."""
    out = []
    pos = 0
    for m in _PARAM.finditer(template):
        out.append(re.escape(template[pos : m.start()]))
        pattern = PARAM_PATTERNS[m.group(2) or ""]
        out.append(f"(?P<{m.group(1)}>{pattern})" if named else pattern)
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return "".join(out)


class Route:
    """A path template, the methods it answers and its endpoint."""

    __slots__ = ("endpoint", "int_params", "methods", "path", "pattern")

    def __init__(self, path: str, endpoint: Endpoint, methods: Sequence[str]) -> None:
        self.path = path
        self.endpoint = endpoint
        self.methods = frozenset(methods) | ({"HEAD"} if "GET" in methods else set())
        self.pattern = re.compile(template_regex(path, named=True), re.DOTALL)
        self.int_params = tuple(m.group(1) for m in _PARAM.finditer(path) if m.group(2) == "int")

    def match(self, path: str) -> dict[str, Any] | None:
        """The path parameters when ``path`` is this route's, else None."""
        m = self.pattern.fullmatch(path)
        if m is None:
            return None
        params: dict[str, Any] = m.groupdict()
        for name in self.int_params:
            params[name] = int(params[name])
        return params


class Router:
    """The first route whose template matches the path and that answers the method serves it."""

    __slots__ = ("routes",)

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes

    async def dispatch(self, request: HttpRequest) -> HttpReply:
        path = request.path
        allowed_elsewhere = False
        for route in self.routes:
            params = route.match(path)
            if params is None:
                continue
            if request.method not in route.methods:
                allowed_elsewhere = True
                continue
            try:
                return await route.endpoint(request, params)
            except Exception as e:
                return reply_for(e, f"HTTP {request.method} {path[:100]}")
        if allowed_elsewhere:
            return error_reply("Method Not Allowed", 405)
        if path != "/":
            other = path.rstrip("/") if path.endswith("/") else path + "/"
            if any(route.match(other) is not None for route in self.routes):
                return HttpReply(307, [(b"location", _url(request, other).encode("latin-1"))])
        return error_reply("Not Found", 404)


def _url(request: HttpRequest, path: str) -> str:
    """The absolute URL of ``path`` on the server the request came to (as Starlette builds it)."""
    host = next((v.decode("latin-1") for k, v in request.headers if k == b"host"), None)  # the first
    if host is not None:
        url = f"{request.scheme}://{host}{path}"
    elif request.server is None:
        url = path
    else:
        name, port = request.server
        default = {"http": 80, "https": 443}.get(request.scheme)
        url = f"{request.scheme}://{name}{path}" if port == default else f"{request.scheme}://{name}:{port}{path}"
    if request.query:
        url += "?" + request.query.decode("latin-1")
    return quote(url, safe=":/%#?=@[]!$&'()*+,;")
