"""The Server façade over its parts: one model lookup per stream step, and the keyword helpers'
request built by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import InferRequest, InferResult, Server

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "seqserve" / "examples" / "models"


@pytest.fixture
async def server() -> Any:
    s = Server(EXAMPLES)
    await s.start(["add_sub"])
    yield s
    await s.shutdown(timeout_s=0)


async def test_a_stream_step_looks_its_model_up_once(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.ones((1, 4), np.float32)
    model = server.model("add_sub")
    lookups: list[str] = []
    find = server.models.model
    monkeypatch.setattr(server.models, "model", lambda name, version="": lookups.append(name) or find(name, version))
    responses: list[tuple[Any, bool]] = []
    server.enqueue_streaming(
        InferRequest("add_sub", {"INPUT0": a, "INPUT1": a}), lambda r, final: responses.append((r, final)), model=model
    )
    server.enqueue_streaming(InferRequest("add_sub", {"INPUT0": a, "INPUT1": a}), lambda r, final: None)
    assert lookups == ["add_sub"]  # only the call that was not given the model


async def test_keyword_helpers_build_the_request_by_name(server: Server) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    r = await server.infer("add_sub", {"INPUT0": a, "INPUT1": a}, version=-1, request_id="r7", outputs=["OUTPUT1"])
    assert isinstance(r, InferResult) and r.id == "r7" and list(r.outputs) == ["OUTPUT1"]
    assert float(r.outputs["OUTPUT1"].sum()) == 0.0
    with pytest.raises(TypeError, match=r"Server.infer\(\) got an unexpected keyword argument 'timeout_ms'"):
        await server.infer("add_sub", {"INPUT0": a, "INPUT1": a}, timeout_ms=5)  # type: ignore[call-arg]
