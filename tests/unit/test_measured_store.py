"""Every state store operation is timed and its failures counted for /metrics
(``MeasuredStore``, which ``open_store`` wraps every store in)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from seqserve.engine import custom_metrics as cm
from seqserve.engine import open_store
from seqserve.engine.replicas.store import SequenceKey
from seqserve.engine.replicas.store.measured import DURATION, ERRORS, MeasuredStore


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of this test's own (the process's is shared by every test in it)."""
    monkeypatch.setattr(cm, "REGISTRY", cm.MetricRegistry())


def _series(name: str) -> dict[str, dict[str, object]]:
    (family,) = [f for f in cm.REGISTRY.snapshot() if f["name"] == name] or [{"series": []}]
    return {s["labels"]["op"]: s for s in family["series"]}


def test_operations_are_timed_and_failures_counted(tmp_path: Path) -> None:
    async def run() -> None:
        store = open_store(f"dir://{tmp_path}", "r1")
        assert isinstance(store, MeasuredStore)
        before = _series(DURATION[0]).get("get", {}).get("count", 0)
        await store.open()
        assert await store.get(SequenceKey("m", 1, 7)) is None
        await store.heartbeat()
        await store.close()
        timed = _series(DURATION[0])
        assert timed["get"]["count"] == before + 1  # type: ignore[operator]
        assert {"open", "heartbeat", "close"} <= set(timed)

        failing = MeasuredStore(store.inner)
        errors_before = _series(ERRORS[0]).get("is_alive", {}).get("value", 0)

        async def boom(replica_id: str) -> bool:
            raise ConnectionError("the store is down")

        failing.inner.is_alive = boom  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await failing.is_alive("r2")
        assert _series(ERRORS[0])["is_alive"]["value"] == errors_before + 1  # type: ignore[operator]

    asyncio.run(run())
