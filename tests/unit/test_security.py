"""api/security.py: the route and method tables, Triton's flag syntax and messages, and the
guards (the HTTP handler wrapper, the gRPC rpc wrappers) in process."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from seqserve._proto import grpc_service_pb2 as pb
from seqserve._proto import health_pb2
from seqserve.api import cli, security
from seqserve.api.cli import arguments
from seqserve.api.grpc.serve import method_table
from seqserve.api.grpc.servicer import HealthServicer, InferenceServicer
from seqserve.api.http.router import Route
from seqserve.api.http.routes import INFER_PATH, HttpFrontend
from seqserve.api.security import GRPC_API, HTTP_API, Restriction, RestrictionError, Restrictions, http_group
from seqserve.api.transport.exchange import HttpReply, HttpRequest
from seqserve.api.transport.grpc_context import CallAborted, Status

TRITON_NAMES = [
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
]


def _routes() -> list[Route]:
    routes = HttpFrontend(None).routes()  # type: ignore[arg-type]  # routes only, no server needed
    assert routes and all(isinstance(r, Route) for r in routes)
    return routes


# ------------------------------------------------------------------------------ tables


def test_groups_are_tritons_plus_sequence() -> None:
    assert list(security.TRITON_GROUPS) == TRITON_NAMES
    assert list(security.GROUPS) == [*TRITON_NAMES, "sequence"]
    assert {g for _, g in HTTP_API} == set(security.GROUPS)
    assert set(GRPC_API.values()) <= set(security.GROUPS)


def test_every_http_route_is_in_the_table_once() -> None:
    templates = [t for t, _ in HTTP_API]
    assert len(templates) == len(set(templates)), "a template is listed twice"
    missing = [r.path for r in _routes() if r.path not in templates]
    assert not missing, f"HTTP routes without a group in security.HTTP_API: {missing}"


# Path parameter values that look like other routes' literals, to catch ordering mistakes.
_TRICKY = ["m", "stats", "ready", "config", "infer", "versions", "models", "index", "sequences", "x.y", "a b", "é"]


def _sample_paths() -> set[str]:
    paths = set()
    for template, _ in HTTP_API:
        names = [seg for seg in template.split("/") if seg.startswith("{")]
        for values in itertools.product(_TRICKY, repeat=len(names)):
            path = template
            for name, value in zip(names, values, strict=True):
                value = "7" if name.endswith(":int}") else value
                value = f"{value}/deeper" if name.endswith(":path}") else value
                path = path.replace(name, value, 1)
            paths.add(path)
            paths.add(path + "/")
            paths.add(path + "/extra")
    return paths


def test_the_group_is_that_of_the_route_that_answers() -> None:
    """For every path some route answers (as the router routes it), http_group names that
    route's group; a path that no route answers and no template lists has no group."""
    routes = _routes()
    table = dict(HTTP_API)
    answered = 0
    for path in sorted(_sample_paths()):
        route = next((r for r in routes if r.match(path) is not None), None)
        if route is not None:
            answered += 1
            assert http_group(path) == table[route.path], (path, route.path)
        m = INFER_PATH.match(path)
        if m is not None:  # infer, answered before routing
            assert http_group(path) == "inference", path
    assert answered > 100


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/v2", "metadata"),
        ("/v2/health/live", "health"),
        ("/v2/models/stats", "statistics"),
        ("/v2/models/stats/ready", "health"),
        ("/v2/models/m", "metadata"),
        ("/v2/models/m/versions/3", "metadata"),
        ("/v2/models/m/versions/3/infer", "inference"),
        ("/v2/models/m/generate_stream", "inference"),
        ("/v2/models/m/sequences", "sequence"),
        ("/v2/models/m/sequences/s1/end", "sequence"),
        ("/v2/models/m/versions/2/sequences/s1", "sequence"),
        ("/v2/models/m/trace/setting", "trace"),
        ("/v2/trace/setting", "trace"),
        ("/v2/logging", "logging"),
        ("/v2/systemsharedmemory/status", "shared-memory"),
        ("/v2/cudasharedmemory/region/r0/unregister", "shared-memory"),
        ("/v2/repository/index", "model-repository"),
        ("/v2/repository/models/m/unload", "model-repository"),
        ("/v2/repository/other/models/m/load", "model-repository"),
        ("/v2/models/m/versions/x/infer", None),  # Triton and Starlette: versions are digits
        ("/v2/nothing", None),
        ("/metrics", None),
    ],
)
def test_http_group(path: str, group: str | None) -> None:
    assert http_group(path) == group


def test_every_grpc_method_is_in_the_table() -> None:
    methods = {
        f"/{s.full_name}/{m.name}"
        for s in (
            pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
            health_pb2.DESCRIPTOR.services_by_name["Health"],
        )
        for m in s.methods
    }
    assert set(GRPC_API) == methods
    # as Triton files them (grpc_server.cc)
    assert GRPC_API["/inference.GRPCInferenceService/ModelReady"] == "health"
    assert GRPC_API["/grpc.health.v1.Health/Check"] == "health"
    assert GRPC_API["/inference.GRPCInferenceService/ModelStreamInfer"] == "inference"


# ----------------------------------------------------------------------------- parsing


def test_parse_groups_keys_and_values() -> None:
    r = Restrictions.parse(
        "http-restricted-api", ["model-repository:admin-key=admin-value", "inference,metadata:Infer-Key=a:b=c"]
    )
    assert dict(r) == {
        "model-repository": Restriction("admin-key", "admin-value"),
        "inference": Restriction("Infer-Key", "a:b=c"),  # the value is all after the first '='
        "metadata": Restriction("Infer-Key", "a:b=c"),
    }
    assert r["inference"].lookup == "infer-key"
    assert "a:b=c" not in repr(r) and "admin-value" not in r.describe()
    g = Restrictions.parse("grpc-restricted-protocol", ["health:k=v"])
    assert g["health"].header == "triton-grpc-protocol-k"
    assert not Restrictions.parse("http-restricted-api", [])


@pytest.mark.parametrize(
    ("option", "spec", "message"),
    [
        ("http-restricted-api", "health", "--http-restricted-api option format is "
         "'<config name>:<setting>=<value>'. Got health"),
        ("http-restricted-api", "health:k", "option format is '<config name>:<setting>=<value>'. Got health:k"),
        ("http-restricted-api", "health=k:v", "option format is '<config name>:<setting>=<value>'. Got health=k:v"),
        ("http-restricted-api", ":k=v", "Got :k=v"),
        ("http-restricted-api", "health:=v", "Got health:=v"),
        ("http-restricted-api", "health:k=", "Got health:k="),
        ("grpc-restricted-protocol", "health", "--grpc-restricted-protocol option format is "
         "'<config name>:<setting>=<value>'. Got health"),
        ("http-restricted-api", "model-reposit,health:k1=v1", "unknown restricted api 'model-reposit'"),
        ("grpc-restricted-protocol", "inferenc:k=v", "unknown restricted protocol 'inferenc'"),
        ("http-restricted-api", "health,:k=v", "unknown restricted api ''"),
        ("http-restricted-api", "Health:k=v", "unknown restricted api 'Health'"),
        ("http-restricted-api", "health,health:k=v", "restricted api 'health' can not be specified in multiple "
         "config groups"),
        ("http-restricted-api", "a b:k=v", "unknown restricted api 'a b'"),
        ("http-restricted-api", "health:a b=v", "'a b' is not an HTTP header name"),
        ("grpc-restricted-protocol", "health:k@=v", "'k@' is not a gRPC metadata key"),
        ("grpc-restricted-protocol", "health:key-bin=v", "'key-bin' is not a gRPC metadata key"),
        ("http-restricted-api", "health:k= v", "the value for 'k' must be printable ASCII"),
        ("http-restricted-api", "health:k=v\n", "the value for 'k' must be printable ASCII"),
    ],
)  # fmt: skip
def test_parse_errors_are_tritons(option: str, spec: str, message: str) -> None:
    with pytest.raises(RestrictionError) as e:
        Restrictions.parse(option, [spec])
    assert message in str(e.value)
    assert "\n" not in str(e.value).replace(spec, "")


def test_an_api_in_two_groups_is_refused_even_with_the_same_key() -> None:
    # Triton's qa (L0_http): --http-restricted-api=model-repository,health:k1=v1
    # --http-restricted-api=metadata,health:k2=v2 -> "api 'health' can not be specified in multiple config groups"
    for specs in (["model-repository,health:k1=v1", "metadata,health:k2=v2"], ["health:k=v", "health:k=v"]):
        with pytest.raises(RestrictionError, match="restricted api 'health' can not be specified in multiple"):
            Restrictions.parse("http-restricted-api", specs)


# ------------------------------------------------------------------------- HTTP guard


class _Body:
    def __init__(self) -> None:
        self.received = False

    async def receive(self) -> tuple[bytes, bool] | None:
        self.received = True
        return b"", False

    async def wait_disconnect(self) -> None:
        await asyncio.sleep(3600)


async def _call(handler: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes, bool]:
    body = _Body()
    reply = await handler(HttpRequest("POST", path, b"", headers, body))
    return reply.status, reply.body, body.received


async def _ok_handler(request: HttpRequest) -> HttpReply:
    await request.body.receive()
    return HttpReply(200, [], b"ok")


def test_http_guard() -> None:
    assert security.restrict_http(_ok_handler, Restrictions()) is _ok_handler  # nothing configured: no wrapper
    app = security.restrict_http(
        _ok_handler, Restrictions.parse("http-restricted-api", ["inference,model-repository:Admin-Key=s3cr3t"])
    )
    run = asyncio.run
    refusal = b'{"error":"This API is restricted, expecting header \'Admin-Key\'"}'
    assert run(_call(app, "/v2/models/m/infer", [])) == (403, refusal, True)  # its body read and dropped
    too_long = [(b"content-length", b"2000000000")]
    assert run(_call(app, "/v2/models/m/infer", too_long)) == (403, refusal, False)
    assert run(_call(app, "/v2/models/m/infer", [(b"admin-key", b"s3cr3")]))[0] == 403
    assert run(_call(app, "/v2/models/m/infer", [(b"admin-key", b"s3cr3tt")]))[0] == 403
    assert run(_call(app, "/v2/models/m/infer", [(b"other", b"s3cr3t")]))[0] == 403
    assert run(_call(app, "/v2/models/m/infer", [(b"x", b"1"), (b"admin-key", b"s3cr3t")])) == (200, b"ok", True)
    assert run(_call(app, "/v2/repository/index", [(b"admin-key", b"s3cr3t")]))[0] == 200
    assert run(_call(app, "/v2/health/ready", []))[0] == 200  # not restricted
    assert run(_call(app, "/unknown", []))[0] == 200  # no group: the app answers (404)


# ------------------------------------------------------------------------- gRPC guard


class _Context:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def peer(self) -> str:
        return "test"

    async def read(self) -> Any:
        return None


def test_grpc_guard_wraps_only_restricted_rpcs() -> None:
    inference, health = InferenceServicer(None), HealthServicer(None)  # type: ignore[arg-type]

    def guarded(table: dict[bytes, Any]) -> set[str]:
        return {
            p.decode().rsplit("/", 1)[1] for p, m in table.items() if m.behaviour.__qualname__.startswith("_guard_")
        }

    assert not guarded(method_table(inference, health, Restrictions()))  # nothing configured: nothing wrapped
    r = Restrictions.parse("grpc-restricted-protocol", ["health,inference:Key=v"])
    restricted = method_table(inference, health, r)
    wrapped = guarded(restricted)
    assert wrapped == {"ServerLive", "ServerReady", "ModelReady", "ModelInfer", "ModelStreamInfer", "Check"}
    assert not vars(inference).keys() & set(pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name)
    server_live = restricted[b"/inference.GRPCInferenceService/ServerLive"].behaviour
    stream_infer = restricted[b"/inference.GRPCInferenceService/ModelStreamInfer"].behaviour

    async def unary() -> None:
        with pytest.raises(CallAborted) as aborted:
            await server_live(pb.ServerLiveRequest(), _Context((("other", "v"),)))
        assert (aborted.value.status, aborted.value.details) == (
            Status.PERMISSION_DENIED,
            "This protocol is restricted, expecting header 'triton-grpc-protocol-Key'",
        )
        inference.server = type("S", (), {"is_live": lambda self: True})()
        reply = await server_live(pb.ServerLiveRequest(), _Context((("triton-grpc-protocol-key", "v"),)))
        assert reply.live

    async def stream() -> None:
        ctx = _Context((("triton-grpc-protocol-key", "w"),))

        async def nothing() -> Any:
            raise AssertionError("a refused stream reads no message")
            yield

        with pytest.raises(CallAborted):
            async for _ in stream_infer(nothing(), ctx):
                pass

    asyncio.run(unary())
    asyncio.run(stream())


# -------------------------------------------------------------------------------- CLI


def test_cli_refuses_client_ca_without_tls(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--tls-client-ca", "ca.pem"]) == 2
    err = capsys.readouterr().err
    assert err == "seqserve: HTTP mutual TLS (a client CA) needs TLS: give a certificate and a key\n"
    assert cli.main(["serve", "--http-port", "off", "--grpc-tls-client-ca", "ca.pem"]) == 2
    assert "gRPC mutual TLS" in capsys.readouterr().err


def test_cli_refuses_mtls_on_a_granian_that_cannot(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(security, "granian_client_verify_supported", lambda: False)
    monkeypatch.setattr(security, "check_tls", lambda what, tls: None)  # no files here
    monkeypatch.setattr(cli, "run", lambda opts: pytest.fail("must not start"))
    tls = ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"]
    assert cli.main(["serve", *tls, "--http-server", "granian"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqserve: this granian cannot require client certificates") and err.count("\n") == 1

    started: list[Any] = []

    def run(opts: Any) -> int:
        started.append(opts)
        return 0

    monkeypatch.setattr(cli, "run", run)
    monkeypatch.setattr(arguments, "resolve_http_server", lambda choice: "granian" if choice == "auto" else choice)
    assert cli.main(["serve", *tls]) == 0  # auto: hypercorn, which can
    assert started[0].http.server == "hypercorn"
    assert started[0].http.tls.client_ca == started[0].grpc.tls.client_ca == "ca.pem"
