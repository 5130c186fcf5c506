"""The statistics documents, pinned: what the HTTP route answers (Triton's JSON) and what gRPC's
ModelStatistics answers (its protobuf), byte for byte, rendered from the engine's statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf import json_format

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.engine import InferenceError, Server

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "seqserve" / "examples" / "models"
INFERENCE_STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def triton_document(server: Server, name: str = "", version: str = "") -> dict[str, Any]:
    """The statistics document as Triton shapes it, built here from each model version's own
    report: the reference both renderers must match."""
    if name and version:
        models = [server.model(name, version)]
    elif name:
        models = [server.model(name, v) for v in server.model_metadata(name)["versions"]]
    else:
        models = [server.model(e["name"], e["version"]) for e in server.repository_index() if e["version"]]
    stats = []
    for m in models:
        s = m.statistics()
        stats.append(
            {
                "name": m.name,
                "version": m.version_str,
                "last_inference": s["last_inference"],
                "inference_count": s["inference_count"],
                "execution_count": s["execution_count"],
                "inference_stats": {k: s[k] for k in INFERENCE_STATS}
                | {"cache_hit": {"count": 0, "ns": 0}, "cache_miss": {"count": 0, "ns": 0}},
                "batch_stats": s["batch_stats"],
                "response_stats": {},
                "memory_usage": [],
            }
        )
    return {"model_stats": stats}


def reference_proto(doc: dict[str, Any]) -> bytes:
    stats = [{k: v for k, v in s.items() if k not in ("response_stats", "memory_usage")} for s in doc["model_stats"]]
    msg = json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())
    return msg.SerializeToString(deterministic=True)


@pytest.fixture
async def server() -> Any:
    s = Server(EXAMPLES)
    await s.start()
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    for _ in range(3):
        await s.infer("add_sub", {"INPUT0": a, "INPUT1": a})
    for i, (start, end) in enumerate([(True, False), (False, False), (False, True)]):
        await s.infer(
            "accumulator",
            {"INPUT": np.full((1, 1), i, np.float32)},
            sequence_id=9,
            sequence_start=start,
            sequence_end=end,
        )
    with pytest.raises(InferenceError):
        await s.infer("add_sub", {"INPUT0": a})  # a refused request counts as a failure
    yield s
    await s.shutdown(timeout_s=0)


@pytest.mark.parametrize(("name", "version"), [("", ""), ("add_sub", ""), ("accumulator", "1")])
async def test_rendered_as_triton_does(server: Server, name: str, version: str) -> None:
    from seqserve.api.statistics import statistics_json, statistics_proto

    expected = triton_document(server, name, version)
    assert expected["model_stats"] and any(s["batch_stats"] for s in expected["model_stats"])
    stats = server.statistics(name, version)
    assert orjson.dumps(statistics_json(stats)) == orjson.dumps(expected)
    assert statistics_proto(stats).SerializeToString(deterministic=True) == reference_proto(expected)
