"""Every non-infer call of the protocol through all four tritonclient flavours (protocol.md B.1)."""

from __future__ import annotations

import numpy as np

from seqserve.api.kserve import EXTENSIONS
from tests.support.clients import Client, expect_error, http_request
from tests.support.process import ServerProcess

DEMO_MODELS = {"accumulator", "accumulator_corrid", "add_sub"}


async def test_health(client: Client) -> None:
    assert await client("is_server_live") is True
    assert await client("is_server_ready") is True


async def test_model_ready(client: Client) -> None:
    assert await client("is_model_ready", "accumulator") is True
    assert await client("is_model_ready", "accumulator", "1") is True
    assert await client("is_model_ready", "add_sub", "1") is True
    # unknown model / version: False, never an exception
    assert await client("is_model_ready", "no_such_model") is False
    assert await client("is_model_ready", "accumulator", "2") is False


async def test_server_metadata(client: Client) -> None:
    meta = await client("get_server_metadata")
    assert meta["name"] == "seqserve"
    assert isinstance(meta["version"], str) and meta["version"]
    assert "sequence" in meta["extensions"]
    assert "sequence(string_id)" in meta["extensions"]
    assert list(meta["extensions"]) == list(EXTENSIONS)  # one list, the same on HTTP and gRPC


def _ints(shape: list[int | str]) -> list[int]:
    # gRPC as_json renders int64 as strings (client-side MessageToJson)
    return [int(d) for d in shape]


async def test_model_metadata(client: Client) -> None:
    for version in ("", "1"):
        meta = await client("get_model_metadata", "accumulator", version)
        assert meta["name"] == "accumulator"
        assert meta["versions"] == ["1"]
        assert meta["platform"] == "python"
        assert [(t["name"], t["datatype"], _ints(t["shape"])) for t in meta["inputs"]] == [("INPUT", "FP32", [-1, 1])]
        assert [(t["name"], t["datatype"], _ints(t["shape"])) for t in meta["outputs"]] == [("OUTPUT", "FP32", [-1, 1])]
    meta = await client("get_model_metadata", "add_sub")
    assert [t["name"] for t in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert [_ints(t["shape"]) for t in meta["outputs"]] == [[-1, 4], [-1, 4]]


async def test_model_metadata_unknown(client: Client) -> None:
    await expect_error(client("get_model_metadata", "no_such_model"), client.code("NOT_FOUND"), "no_such_model")
    await expect_error(client("get_model_metadata", "accumulator", "9"), client.code("NOT_FOUND"), "version 9")


async def test_model_config(client: Client) -> None:
    for version in ("", "1"):
        cfg = await client("get_model_config", "accumulator", version)
        if not client.is_http:
            cfg = cfg["config"]
        assert cfg["name"] == "accumulator"
        assert cfg["backend"] == "python"
        assert cfg["max_batch_size"] == 8
        assert cfg["input"][0]["name"] == "INPUT"
        assert cfg["input"][0]["data_type"] == "TYPE_FP32"
        assert "sequence_batching" in cfg
        if client.is_http:  # the server's JSON: int64 arrays and int32 fields are JSON numbers
            assert type(cfg["max_batch_size"]) is int
            assert cfg["input"][0]["dims"] == [1]
            assert all(type(d) is int for d in cfg["input"][0]["dims"])
            assert all(type(d) is int for d in cfg["output"][0]["dims"])
        else:
            assert _ints(cfg["input"][0]["dims"]) == [1]
    await expect_error(client("get_model_config", "no_such_model"), client.code("NOT_FOUND"))


async def test_statistics(client: Client) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    await client("infer", "add_sub", [client.input("INPUT0", a), client.input("INPUT1", a)])

    every = (await client("get_inference_statistics"))["model_stats"]
    assert {s["name"] for s in every} >= DEMO_MODELS

    for version in ("", "1"):
        (stat,) = (await client("get_inference_statistics", "add_sub", version))["model_stats"]
        assert stat["name"] == "add_sub"
        assert stat["version"] == "1"
        assert int(stat["inference_count"]) >= 1
        assert int(stat["execution_count"]) >= 1
        assert int(stat["inference_stats"]["success"]["count"]) >= 1
        if client.is_http:  # full Triton shape, counters as JSON numbers
            assert set(stat["inference_stats"]) >= {
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
                "cache_hit",
                "cache_miss",
            }
            assert type(stat["inference_count"]) is int
            assert stat["response_stats"] == {}
            assert isinstance(stat["batch_stats"], list)

    await expect_error(client("get_inference_statistics", "no_such_model"), client.code("INVALID_ARG"), "no_such_model")


async def test_repository_index(client: Client) -> None:
    index = await client("get_model_repository_index")
    entries = index if client.is_http else index["models"]
    assert isinstance(entries, list)
    by_name = {e["name"]: e for e in entries}
    assert set(by_name) >= DEMO_MODELS
    for name in DEMO_MODELS:
        assert by_name[name]["version"] == "1"
        assert by_name[name]["state"] == "READY"


def test_raw_http_routes(server: ServerProcess) -> None:
    """Framing details tritonclient relies on: empty 200 health bodies, JSON errors for
    unknown routes and wrong methods, the repository index with an empty or a JSON body."""
    r = http_request(server, "GET", "/v2/health/live")
    assert (r.status, r.body) == (200, b"")
    assert r.headers["content-length"] == "0"
    r = http_request(server, "GET", "/v2/models/no_such_model/ready")
    assert r.status == 400
    r = http_request(server, "GET", "/v2/no/such/route")
    assert r.status == 404 and r.error() == "Not Found"
    r = http_request(server, "DELETE", "/v2/models/accumulator")
    assert r.status == 405 and r.error() == "Method Not Allowed"
    r = http_request(server, "GET", "/v2/models/accumulator/versions/one")  # versions are digits only
    assert r.status == 404
    r = http_request(server, "POST", "/v2/repository/index", {"ready": True})
    assert r.status == 200 and {e["name"] for e in r.json()} >= DEMO_MODELS
    r = http_request(server, "POST", "/v2/repository/index", b"{not json")
    assert r.status == 400, (r.status, r.body)
    assert "JSON" in r.error()
