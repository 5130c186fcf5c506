"""The dependency rules of DESIGN.md that an import can break: the api reaches the engine only
through what ``seqserve.engine`` exports (and its datatype table), and the engine imports
nothing from the api."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "seqserve"
API_MAY_IMPORT = {
    "seqserve.engine",
    "seqserve.engine.tensors",
    "seqserve.engine.tracing",
    "seqserve.engine.custom_metrics",
    # the GPU's metrics and CUDA IPC regions, served by the front-ends (docs/gpu.md)
    "seqserve.engine.device.nvml",
    "seqserve.engine.device.ipc",
    # the engine's side of the worker processes (issue 27): the transport, records, the slow
    # path, and what a worker needs to validate and answer requests as the engine would
    "seqserve.engine.workers",
    "seqserve.engine.workers.records",
    "seqserve.engine.workers.slow_path",
}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "seqserve.engine")
    return found


def test_api_uses_only_what_the_engine_exports() -> None:
    bad = {}
    for path in sorted((SRC / "api").rglob("*.py")):
        engine = {m for m in _imports(path) if m.startswith("seqserve.engine.")}
        engine = {m for m in engine if m not in API_MAY_IMPORT and not _exported(m)}
        if engine:
            bad[str(path.relative_to(SRC))] = sorted(engine)
    assert not bad, f"api modules reaching into the engine: {bad}"


def _exported(name: str) -> bool:
    import seqserve.engine

    parent, _, attr = name.rpartition(".")
    return parent == "seqserve.engine" and attr in seqserve.engine.__all__


def test_engine_imports_nothing_from_the_api() -> None:
    bad = {
        str(path.relative_to(SRC)): sorted(m for m in _imports(path) if m.startswith("seqserve.api"))
        for path in sorted((SRC / "engine").rglob("*.py"))
    }
    assert not {k: v for k, v in bad.items() if v}
