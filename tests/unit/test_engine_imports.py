"""The engine has no import circle, not even through imports made only for type checkers or
inside functions: each module can be read knowing only the ones below it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ENGINE = SRC / "seqserve" / "engine"


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the engine modules it imports. ``from package import name`` is an edge to the
    submodule when ``name`` is one (``_core`` included), else to the package itself."""
    modules = {_name(p): p for p in ENGINE.rglob("*.py")}
    modules |= {_name(p): p for p in ENGINE.rglob("*.pyi") if _name(p) not in modules}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text()) if path.suffix == ".py" else ast.Module(body=[], type_ignores=[])
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [owner(a.name) for a in node.names if a.name.startswith("seqserve.engine")]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).strip(".")
                if not base.startswith("seqserve.engine"):
                    continue
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else owner(base) for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t and t != module)
        graph[module] = edges
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_engine() -> None:
    graph = _graph()
    assert "seqserve.engine.server.models" in graph["seqserve.engine.server.server"]
    assert "seqserve.engine._core" in graph["seqserve.engine.tensors"]  # a submodule, not the package


def test_the_engine_has_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_a_circle_is_found() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
