"""The engine's model statistics in each protocol's shape: Triton's JSON document (HTTP) and its
``ModelStatisticsResponse`` (gRPC). seqserve has no response cache and does not track responses
or memory per model: those parts of Triton's document are zeros and empty."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from seqserve._proto import grpc_service_pb2 as pb
from seqserve.engine import ModelStatistics

_NO_DURATION = {"count": 0, "ns": 0}


class _Duration(Protocol):
    @property
    def count(self) -> int: ...
    @property
    def ns(self) -> int: ...


def statistics_json(stats: Sequence[ModelStatistics]) -> dict[str, Any]:
    """``{"model_stats": [...]}``, as Triton's HTTP statistics extension answers."""
    return {"model_stats": [_model_json(s) for s in stats]}


def _model_json(s: ModelStatistics) -> dict[str, Any]:
    i = s.inference_stats
    return {
        "name": s.name,
        "version": s.version,
        "last_inference": s.last_inference,
        "inference_count": s.inference_count,
        "execution_count": s.execution_count,
        "inference_stats": {
            "success": _duration(i.success),
            "fail": _duration(i.fail),
            "queue": _duration(i.queue),
            "compute_input": _duration(i.compute_input),
            "compute_infer": _duration(i.compute_infer),
            "compute_output": _duration(i.compute_output),
            "cache_hit": dict(_NO_DURATION),
            "cache_miss": dict(_NO_DURATION),
        },
        "batch_stats": [
            {
                "batch_size": b.batch_size,
                "compute_input": _duration(b.compute_input),
                "compute_infer": _duration(b.compute_infer),
                "compute_output": _duration(b.compute_output),
            }
            for b in s.batch_stats
        ],
        "response_stats": {},
        "memory_usage": [],
    }


def _duration(d: _Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics_proto(stats: Sequence[ModelStatistics]) -> pb.ModelStatisticsResponse:
    """gRPC's ``ModelStatisticsResponse``. Every duration is set, zeros included, as Triton's."""
    resp = pb.ModelStatisticsResponse()
    for s in stats:
        out = resp.model_stats.add(
            name=s.name,
            version=s.version,
            last_inference=s.last_inference,
            inference_count=s.inference_count,
            execution_count=s.execution_count,
        )
        i = s.inference_stats
        o = out.inference_stats
        o.SetInParent()
        for field, d in (
            (o.success, i.success),
            (o.fail, i.fail),
            (o.queue, i.queue),
            (o.compute_input, i.compute_input),
            (o.compute_infer, i.compute_infer),
            (o.compute_output, i.compute_output),
            (o.cache_hit, None),
            (o.cache_miss, None),
        ):
            field.SetInParent()
            if d is not None:
                field.count = d.count
                field.ns = d.ns
        for b in s.batch_stats:
            ob = out.batch_stats.add(batch_size=b.batch_size)
            for field, d in (
                (ob.compute_input, b.compute_input),
                (ob.compute_infer, b.compute_infer),
                (ob.compute_output, b.compute_output),
            ):
                field.SetInParent()
                field.count = d.count
                field.ns = d.ns
    return resp
