"""--trace-config and the trace extension's settings documents: Triton's syntax, defaults and
errors; sampling by rate and count."""

from __future__ import annotations

import pytest

from seqserve.api.tracing.manager import TraceManager
from seqserve.api.tracing.settings import TraceConfig, TraceSetting, parse_update, setting_document
from seqserve.engine import InferenceError, InferRequest


def test_tritons_example_command_line() -> None:
    c = TraceConfig.parse(
        ["triton,file=/tmp/trace.json", "triton,log-frequency=50", "rate=100", "level=TIMESTAMPS", "count=100"]
    )
    assert c.mode == "triton"
    assert c.setting == TraceSetting(frozenset({"TIMESTAMPS"}), 100, 100, 50, "/tmp/trace.json")
    assert setting_document(c.setting, c.mode) == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "100",
        "trace_count": "100",
        "log_frequency": "50",
        "trace_file": "/tmp/trace.json",
        "trace_mode": "triton",
    }


def test_opentelemetry_settings() -> None:
    c = TraceConfig.parse(
        [
            "mode=opentelemetry",
            "opentelemetry,url=http://collector:4318/v1/traces",
            "opentelemetry,resource=service.namespace=prod",
            "opentelemetry,bsp_schedule_delay=200",
            "level=TIMESTAMPS",
        ]
    )
    assert c.mode == "opentelemetry" and c.setting.active
    assert c.otel.url == "http://collector:4318/v1/traces"
    assert c.otel.resource == (("service.namespace", "prod"),)
    assert c.otel.bsp_schedule_delay_ms == 200


def test_off_by_default() -> None:
    c = TraceConfig.parse([])
    assert not c.setting.active and c.setting.rate == 1000 and c.setting.count == -1
    assert setting_document(c.setting, c.mode)["trace_level"] == ["OFF"]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["rate"], "is not \\[<mode>,\\]<setting>=<value>"),
        (["zipkin,url=x"], "unknown mode 'zipkin'"),
        (["level=LOUD"], "'LOUD' is not OFF, TIMESTAMPS or TENSORS"),
        (["rate=0"], "out of range"),
        (["count=-2"], "out of range"),
        (["rate=often"], "is not an integer"),
        (["speed=1"], "unknown global setting 'speed'"),
        (["triton,color=1"], "unknown triton setting"),
        (["opentelemetry,port=1"], "unknown opentelemetry setting"),
        (["level=TIMESTAMPS"], "needs a file"),
        (["mode=opentelemetry", "level=TENSORS"], "TIMESTAMPS only"),
        (["opentelemetry,resource=novalue"], "is not <key>=<value>"),
    ],
)
def test_bad_trace_config(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TraceConfig.parse(items)


def test_update_documents() -> None:
    assert parse_update({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "5"}, mode="triton") == {
        "level": frozenset({"TIMESTAMPS", "TENSORS"}),
        "rate": 5,
    }
    assert parse_update({"trace_count": None, "log_frequency": ["3"]}, mode="triton") == {
        "count": None,
        "log_frequency": 3,
    }
    for doc, message in [
        ({"trace_file": "/etc/x"}, "cannot be changed"),
        ({"trace_rate": "0"}, "at least 1"),
        ({"trace_rate": True}, "must be a string"),
        ({"trace_level": [1]}, "list of strings"),
        ({"other": "1"}, "unknown trace setting 'other'"),
    ]:
        with pytest.raises(InferenceError, match=message):
            parse_update(doc, mode="triton")


class _Server:
    tracer = None

    def repository_index(self) -> list[dict[str, str]]:
        return [{"name": "m"}]


def test_rate_and_count_sample_every_nth_request_until_the_count_is_spent() -> None:
    server = _Server()
    config = TraceConfig.parse(["triton,file=/nonexistent/t.json", "level=TIMESTAMPS", "rate=2", "count=2"])
    manager = TraceManager(server, config)  # type: ignore[arg-type]
    assert server.tracer is manager
    request = InferRequest("m", {})
    sampled = [manager.sample(request, "m", "1") is not None for _ in range(6)]
    assert sampled == [False, True, False, True, False, False]
    assert server.tracer is None  # the count is spent: requests pay nothing again
    assert manager.settings()["trace_count"] == "0"
    # a model's own setting, the others fall back to the global one
    manager.update("m", {"trace_count": "-1", "trace_rate": "1"})
    assert server.tracer is manager
    assert manager.settings("m")["trace_rate"] == "1" and manager.settings()["trace_rate"] == "2"
    manager.update("m", {"trace_count": None, "trace_rate": None})
    assert manager.settings("m") == manager.settings()
    with pytest.raises(InferenceError, match="unknown model"):
        manager.settings("other")
