"""Who may call what: Triton's restricted APIs, and the TLS settings of both front-ends.

**Restricted APIs** (``--http-restricted-api``, ``--grpc-restricted-protocol``, Triton's flags
with Triton's syntax, messages and statuses). Every HTTP route and every gRPC method belongs
to exactly one group (the tables below, the only place that says so); a restricted group
answers only requests that carry its header with its value. A refused request gets what
Triton answers: HTTP 403 ``{"error": "This API is restricted, expecting header '<key>'"}``,
gRPC PERMISSION_DENIED ``This protocol is restricted, expecting header
'triton-grpc-protocol-<key>'`` (Triton's message; its status there is UNAVAILABLE, see
``GRPC_REFUSAL``). With no restriction configured nothing here runs: no
handler wrapper, no wrapped rpc. With some, an HTTP request costs one regular-expression match of its
path, and a request to a restricted group one header look-up and a constant-time comparison;
a gRPC call to an unrestricted method costs nothing.

**TLS**: the arguments that hypercorn, granian and grpc take for a certificate, a key and a
client CA (mutual TLS: the client must present a certificate that CA signed).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import inspect
import re
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson

from seqserve.api.http.router import template_regex
from seqserve.api.transport.exchange import Handler, HttpReply, HttpRequest
from seqserve.api.transport.grpc_context import CallAborted, CallContext, Status

# ------------------------------------------------------------------------------ groups

#: Triton's categories (``RESTRICTED_CATEGORY_NAMES`` in triton-inference-server/server
#: ``src/restricted_features.h``), in Triton's order, then seqserve's own.
TRITON_GROUPS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
#: ``sequence``: seqserve's sequence API (``/v2/models/{m}/sequences...``, docs/sequence-api.md).
GROUPS = (*TRITON_GROUPS, "sequence")

#: Triton prefixes the key of ``--grpc-restricted-protocol`` (``kRestrictedProtocolHeaderTemplate``).
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

#: gRPC status of a refusal. Triton answers UNAVAILABLE (``grpc_server.cc``, ``infer_handler.cc``,
#: ``stream_infer_handler.cc``); we answer PERMISSION_DENIED, the status that means it, because
#: UNAVAILABLE is what retry policies and balancers retry by default (a refusal would be retried
#: until attempts run out) and what this server uses for "try again elsewhere". The message is
#: Triton's, so clients that match on it keep working.
GRPC_REFUSAL = Status.PERMISSION_DENIED
HTTP_REFUSAL = 403

# --------------------------------------------------------------------------- the tables

_V = "/versions/{version:int}"

#: Every HTTP route, as a path template (api/http/router.py), and its group. The first template
#: that matches a path names its group, so the order is that of the routing in api/http/routes.py
#: where templates overlap (the literal ``/v2/models/stats`` before ``/v2/models/{model}``);
#: infer comes first, which no other template matches, so that the hot path matches at once.
#: Templates that seqserve does not serve yet (Triton's shared-memory, trace, logging and
#: generate routes, the repository segment) are listed too: a restriction holds there as well
#: (403, else 501 or 404), and holds for them the day they are served.
HTTP_API: tuple[tuple[str, str], ...] = (
    ("/v2/models/{model}/infer", "inference"),
    ("/v2/models/{model}" + _V + "/infer", "inference"),
    ("/v2/models/{model}/generate", "inference"),
    ("/v2/models/{model}" + _V + "/generate", "inference"),
    ("/v2/models/{model}/generate_stream", "inference"),
    ("/v2/models/{model}" + _V + "/generate_stream", "inference"),
    ("/v2/health/live", "health"),
    ("/v2/health/ready", "health"),
    ("/v2", "metadata"),
    ("/v2/logging", "logging"),
    ("/v2/trace/setting", "trace"),
    ("/v2/models/stats", "statistics"),
    ("/v2/models/{model}/stats", "statistics"),
    ("/v2/models/{model}" + _V + "/stats", "statistics"),
    ("/v2/models/{model}/ready", "health"),
    ("/v2/models/{model}" + _V + "/ready", "health"),
    ("/v2/models/{model}/config", "model-config"),
    ("/v2/models/{model}" + _V + "/config", "model-config"),
    ("/v2/models/{model}/trace/setting", "trace"),
    ("/v2/models/{model}/sequences", "sequence"),
    ("/v2/models/{model}/sequences/{sequence_id:path}", "sequence"),
    ("/v2/models/{model}" + _V + "/sequences", "sequence"),
    ("/v2/models/{model}" + _V + "/sequences/{sequence_id:path}", "sequence"),
    ("/v2/models/{model}", "metadata"),
    ("/v2/models/{model}" + _V, "metadata"),
    ("/v2/repository/index", "model-repository"),
    ("/v2/repository/{repository}/index", "model-repository"),
    ("/v2/repository/models/{model}/load", "model-repository"),
    ("/v2/repository/models/{model}/unload", "model-repository"),
    ("/v2/repository/{repository}/models/{model}/load", "model-repository"),
    ("/v2/repository/{repository}/models/{model}/unload", "model-repository"),
    ("/v2/systemsharedmemory/{action}", "shared-memory"),
    ("/v2/systemsharedmemory/region/{region}/{action}", "shared-memory"),
    ("/v2/cudasharedmemory/{action}", "shared-memory"),
    ("/v2/cudasharedmemory/region/{region}/{action}", "shared-memory"),
)

_INFERENCE_SERVICE = "/inference.GRPCInferenceService/"

#: Every gRPC method (``/<service>/<method>``) and its group, as Triton files them
#: (``src/grpc/grpc_server.cc``): ModelReady and the standard health Check are ``health``.
GRPC_API: Mapping[str, str] = {
    **{
        _INFERENCE_SERVICE + method: group
        for method, group in (
            ("ServerLive", "health"),
            ("ServerReady", "health"),
            ("ModelReady", "health"),
            ("ServerMetadata", "metadata"),
            ("ModelMetadata", "metadata"),
            ("ModelInfer", "inference"),
            ("ModelStreamInfer", "inference"),
            ("ModelConfig", "model-config"),
            ("ModelStatistics", "statistics"),
            ("RepositoryIndex", "model-repository"),
            ("RepositoryModelLoad", "model-repository"),
            ("RepositoryModelUnload", "model-repository"),
            ("SystemSharedMemoryStatus", "shared-memory"),
            ("SystemSharedMemoryRegister", "shared-memory"),
            ("SystemSharedMemoryUnregister", "shared-memory"),
            ("CudaSharedMemoryStatus", "shared-memory"),
            ("CudaSharedMemoryRegister", "shared-memory"),
            ("CudaSharedMemoryUnregister", "shared-memory"),
            ("TraceSetting", "trace"),
            ("LogSettings", "logging"),
        )
    },
    "/grpc.health.v1.Health/Check": "health",
}

_HTTP_PATH = re.compile("|".join(f"(?P<r{i}>{template_regex(t)})" for i, (t, _) in enumerate(HTTP_API)), re.DOTALL)
_HTTP_GROUP_OF = {f"r{i}": group for i, (_, group) in enumerate(HTTP_API)}


def http_group(path: str) -> str | None:
    """The group of an HTTP request path (percent-decoded); None for a path that no
    route answers."""
    m = _HTTP_PATH.fullmatch(path)
    return None if m is None else _HTTP_GROUP_OF[m.lastgroup or ""]


# ------------------------------------------------------------------------------ parsing


class RestrictionError(ValueError):
    """A bad ``--http-restricted-api`` / ``--grpc-restricted-protocol`` value (Triton's message)."""


_HTTP_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field-name
_GRPC_KEY = re.compile(r"[0-9A-Za-z_.-]+")  # gRPC metadata key (lower-cased on the wire)
_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")  # visible ASCII, no outer space


@dataclass(frozen=True, slots=True)
class Restriction:
    """A header and the value it must carry."""

    header: str  # as configured (gRPC: with Triton's prefix); named in the refusal
    value: str

    @property
    def lookup(self) -> str:
        return self.header.lower()  # header names are case-insensitive (gRPC: lower-case)

    @property
    def digest(self) -> bytes:
        return _digest(self.value.encode())


def _digest(value: bytes) -> bytes:
    # Comparing digests keeps the comparison constant-time in the length of the value too.
    return hashlib.sha256(value).digest()


class Restrictions(Mapping[str, Restriction]):
    """The restricted groups of one front-end: group -> restriction. Empty: all open."""

    __slots__ = ("_by_group",)

    def __init__(self, by_group: Mapping[str, Restriction] | None = None) -> None:
        self._by_group = dict(by_group or {})

    def __getitem__(self, group: str) -> Restriction:
        return self._by_group[group]

    def __iter__(self) -> Any:
        return iter(self._by_group)

    def __len__(self) -> int:
        return len(self._by_group)

    def __repr__(self) -> str:  # never the values
        return f"Restrictions({self.describe() or 'none'})"

    def describe(self) -> str:
        """For the startup log: groups and headers, not the values."""
        headers: dict[str, list[str]] = {}
        for group, r in self._by_group.items():
            headers.setdefault(r.header, []).append(group)
        return "; ".join(f"{','.join(groups)} (header '{h}')" for h, groups in headers.items())

    @classmethod
    def parse(cls, option: str, specs: Iterable[str]) -> Restrictions:
        """Parse the values of ``--http-restricted-api`` (``option="http-restricted-api"``) or
        ``--grpc-restricted-protocol``, each ``<group>[,<group>...]:<key>=<value>``, as
        Triton's ``TritonParser::ParseRestrictedFeatureOption`` does, with its messages."""
        grpc_side = option == "grpc-restricted-protocol"
        if not grpc_side and option != "http-restricted-api":
            raise ValueError(f"unknown option {option!r}")
        feature_type = "protocol" if grpc_side else "api"
        prefix = GRPC_HEADER_PREFIX if grpc_side else ""
        by_group: dict[str, Restriction] = {}
        for spec in specs:
            groups, key, value = _split_spec(spec, option)
            for group in groups.split(","):
                if group not in GROUPS:
                    raise RestrictionError(f"unknown restricted {feature_type} '{group}'")
                if group in by_group:
                    raise RestrictionError(
                        f"restricted {feature_type} '{group}' can not be specified in multiple config groups"
                    )
                by_group[group] = Restriction(prefix + key, value)
            # seqserve's checks (Triton takes these and then no client can ever match them)
            if grpc_side and not (_GRPC_KEY.fullmatch(key) and not key.lower().endswith("-bin")):
                raise RestrictionError(
                    f"--{option}: '{key}' is not a gRPC metadata key (letters, digits, '-', '_' and '.', "
                    "not ending in '-bin')"
                )
            if not grpc_side and not _HTTP_TOKEN.fullmatch(key):
                raise RestrictionError(f"--{option}: '{key}' is not an HTTP header name")
            if not _VALUE.fullmatch(value):
                raise RestrictionError(
                    f"--{option}: the value for '{key}' must be printable ASCII without leading or trailing spaces"
                )
        return cls(by_group)


def _split_spec(arg: str, option: str) -> tuple[str, str, str]:
    """Triton's ``ParseGenericConfigOption(arg, ":", "=", ...)``: the first ':' ends the
    groups, the first '=' after it ends the key; all three must be non-empty."""
    error = f"--{option} option format is '<config name>:<setting>=<value>'. Got {arg}"
    colon = arg.find(":")
    equals = arg.find("=", colon + 1) if colon >= 0 else -1
    if colon < 0 or equals < 0:
        raise RestrictionError(error)
    groups, key, value = arg[:colon], arg[colon + 1 : equals], arg[equals + 1 :]
    if not (groups and key and value):
        raise RestrictionError(error)
    return groups, key, value


# ------------------------------------------------------------------------------- HTTP


def http_refusal(r: Restriction) -> str:
    return f"This API is restricted, expecting header '{r.header}'"


def restrict_http(
    handler: Handler,
    restrictions: Mapping[str, Restriction],
    *,
    max_body_bytes: int = 1 << 30,
    body_timeout_s: float = 10.0,
) -> Handler:
    """``handler`` behind the restrictions: a request to a restricted group without its header
    and value gets Triton's 403 and never reaches ``handler``. Its body is read and dropped first
    (up to ``max_body_bytes``, while it keeps arriving within ``body_timeout_s``), as Triton
    reads it, so that the client, still sending it, gets the answer and the keep-alive
    connection stays usable. Without restrictions, ``handler`` itself."""
    if not restrictions:
        return handler
    # group -> (lower-case header name, value digest, the refusal's body)
    rules: dict[str, tuple[bytes, bytes, bytes]] = {}
    for group, r in restrictions.items():
        rules[group] = (r.lookup.encode("latin-1"), r.digest, orjson.dumps({"error": http_refusal(r)}))
    match = _HTTP_PATH.fullmatch
    group_of = _HTTP_GROUP_OF

    async def restricted(request: HttpRequest) -> HttpReply | None:
        m = match(request.path)
        rule = None if m is None else rules.get(group_of[m.lastgroup or ""])
        if rule is not None:
            name, digest, body = rule
            for k, v in request.headers:
                if k == name:
                    ok = hmac.compare_digest(_digest(v), digest)
                    break
            else:
                ok = False
            if not ok:
                await _drop_body(request, max_body_bytes, body_timeout_s)
                return HttpReply(HTTP_REFUSAL, [(b"content-type", b"application/json")], body)
        return await handler(request)

    return restricted


async def _drop_body(request: HttpRequest, limit: int, timeout_s: float) -> None:
    for k, v in request.headers:
        if k == b"content-length":
            if not v.isdigit() or int(v) > limit:
                return  # not worth reading: the server closes the connection after the answer
            break
    total = 0
    while True:
        try:
            got = await asyncio.wait_for(request.body.receive(), timeout_s)
        except asyncio.TimeoutError:
            return  # a stalled body: answered now, and the connection closes after the answer
        if got is None:
            return
        chunk, more = got
        total += len(chunk)
        if not more or total > limit:
            return


# ------------------------------------------------------------------------------- gRPC


def grpc_refusal(r: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{r.header}'"


def restrict_grpc(
    behaviour: Callable[..., Any], path: str, streaming: bool, restrictions: Mapping[str, Restriction]
) -> Callable[..., Any]:
    """``behaviour`` (the rpc at ``path``) as the method table serves it: guarded when its
    group is restricted (the call's metadata is checked and the call refused with Triton's
    status and message), else as it is. ``path`` must be in GRPC_API (KeyError otherwise)."""
    if not restrictions:
        return behaviour
    r = restrictions.get(GRPC_API[path])
    if r is None:
        return behaviour
    return _guard_stream(behaviour, r) if streaming else _guard_unary(behaviour, r)


def _allowed(r: Restriction, digest: bytes, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    name = r.lookup
    for k, v in metadata or ():
        if k == name:
            return hmac.compare_digest(_digest(v if isinstance(v, bytes) else v.encode()), digest)
    return False


def _guard_unary(rpc: Callable[[Any, Any], Any], r: Restriction) -> Callable[[Any, Any], Any]:
    digest, message = r.digest, grpc_refusal(r)

    async def guarded(request: Any, context: CallContext) -> Any:
        if not _allowed(r, digest, context.metadata):
            raise CallAborted(GRPC_REFUSAL, message)
        return await rpc(request, context)

    return guarded


def _guard_stream(rpc: Callable[[Any, Any], AsyncGenerator[Any, None]], r: Restriction) -> Callable[[Any, Any], Any]:
    # Like Triton, refuse the stream when it opens, before any message is read.
    digest, message = r.digest, grpc_refusal(r)

    async def guarded(requests: Any, context: CallContext) -> AsyncIterator[Any]:
        if not _allowed(r, digest, context.metadata):
            raise CallAborted(GRPC_REFUSAL, message)
        replies = rpc(requests, context)
        try:
            async for reply in replies:
                yield reply
        finally:
            await replies.aclose()  # the rpc's own clean-up (open requests cancelled) runs now

    return guarded


# -------------------------------------------------------------------------------- TLS


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One front-end's TLS: PEM certificate and key, and for mutual TLS the PEM CA bundle
    whose certificates clients must present one of (None: no client certificate asked)."""

    cert: str
    key: str
    client_ca: str | None = None


def check_tls(what: str, tls: TlsFiles) -> None:
    """Load the files as the servers will, before anything starts: ValueError with a one-line
    message when one cannot be read or is not what it should be."""
    for label, path in (("certificate", tls.cert), ("key", tls.key), ("client CA", tls.client_ca)):
        if path is not None:
            try:
                open(path, "rb").close()
            except OSError as e:
                raise ValueError(f"{what} TLS: cannot read the {label} '{path}': {e.strerror}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    def no_password() -> str:
        raise ValueError(f"{what} TLS: the key '{tls.key}' is encrypted; give an unencrypted PEM key")

    try:
        ctx.load_cert_chain(tls.cert, tls.key, password=no_password)
    except ssl.SSLError as e:
        raise ValueError(
            f"{what} TLS: '{tls.cert}' and '{tls.key}' are not a PEM certificate and its key ({e.reason or e})"
        ) from None
    if tls.client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca)
        except ssl.SSLError as e:
            raise ValueError(
                f"{what} TLS: the client CA '{tls.client_ca}' holds no PEM certificate ({e.reason or e})"
            ) from None


def grpc_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    with open(tls.cert, "rb") as f_cert, open(tls.key, "rb") as f_key:
        pair = (f_key.read(), f_cert.read())
    if tls.client_ca is None:
        return grpc.ssl_server_credentials([pair])
    with open(tls.client_ca, "rb") as f_ca:
        ca = f_ca.read()
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=True)


def hypercorn_tls(cfg: Any, tls: TlsFiles) -> None:
    """Set TLS on a hypercorn Config."""
    cfg.certfile = tls.cert
    cfg.keyfile = tls.key
    if tls.client_ca is not None:
        cfg.ca_certs = tls.client_ca
        cfg.verify_mode = ssl.CERT_REQUIRED


def builtin_tls(tls: TlsFiles, alpn: str = "http/1.1") -> ssl.SSLContext:
    """The TLS context of the builtin servers (api/transport/http1_server.py, api/transport/grpc_server.py): TLS 1.2 and
    1.3, ``alpn`` (HTTP/1.1, or h2 for gRPC), client certificates required when there is a
    client CA (mutual TLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert, tls.key)
    ctx.set_alpn_protocols([alpn])
    ctx.options |= ssl.OP_NO_RENEGOTIATION  # TLS 1.2 renegotiation: CPU for the client's asking
    if tls.client_ca is not None:
        ctx.load_verify_locations(tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def granian_client_verify_supported() -> bool:
    """Whether the installed granian's embedded server can require client certificates
    (its ``ssl_ca`` and ``ssl_client_verify`` arguments)."""
    try:
        from granian.server.embed import Server
    except ImportError:
        return False
    params = inspect.signature(Server).parameters
    return "ssl_ca" in params and "ssl_client_verify" in params


def granian_tls(tls: TlsFiles | None) -> dict[str, Any]:
    """Keyword arguments of granian's embedded Server."""
    if tls is None:
        return {}
    kwargs: dict[str, Any] = {"ssl_cert": Path(tls.cert), "ssl_key": Path(tls.key)}
    if tls.client_ca is not None:
        if not granian_client_verify_supported():  # the CLI refuses this before it starts
            raise RuntimeError("this granian cannot require client certificates")
        kwargs.update(ssl_ca=Path(tls.client_ca), ssl_client_verify=True)
    return kwargs
