"""A model version's statistics as typed values (``Server.statistics``): counts and cumulative
durations in nanoseconds, as the core keeps them. Each front-end's codec renders them in its
own wire shape (Triton's JSON over HTTP, its protobuf over gRPC)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Duration:
    """How many, and how long all of them took together (ns)."""

    count: int
    ns: int

    @classmethod
    def of(cls, report: Mapping[str, int]) -> Duration:
        return cls(report["count"], report["ns"])


@dataclass(frozen=True, slots=True)
class InferenceStatistics:
    """Requests by outcome, and the time each phase of their batches took."""

    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """The executions of one batch size, and the time each phase took."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """One model version's statistics since it loaded."""

    name: str
    version: str
    last_inference: int  # ms since the epoch of the latest request (0: none yet)
    inference_count: int  # requests run (a batch of n counts n)
    execution_count: int  # batches run
    inference_stats: InferenceStatistics
    batch_stats: tuple[BatchStatistics, ...]  # by batch size, ascending

    @classmethod
    def of(cls, name: str, version: str, report: Mapping[str, Any]) -> ModelStatistics:
        """From a model version's report (``LoadedModel.statistics``)."""
        return cls(
            name=name,
            version=version,
            last_inference=report["last_inference"],
            inference_count=report["inference_count"],
            execution_count=report["execution_count"],
            inference_stats=InferenceStatistics(
                success=Duration.of(report["success"]),
                fail=Duration.of(report["fail"]),
                queue=Duration.of(report["queue"]),
                compute_input=Duration.of(report["compute_input"]),
                compute_infer=Duration.of(report["compute_infer"]),
                compute_output=Duration.of(report["compute_output"]),
            ),
            batch_stats=tuple(
                BatchStatistics(
                    batch_size=b["batch_size"],
                    compute_input=Duration.of(b["compute_input"]),
                    compute_infer=Duration.of(b["compute_infer"]),
                    compute_output=Duration.of(b["compute_output"]),
                )
                for b in report["batch_stats"]
            ),
        )
