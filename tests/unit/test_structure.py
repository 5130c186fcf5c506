"""The shape of the tree that issue 23 set and a maintainer relies on: objects that own their
state (no mixins), no private name crossing a module boundary, modules a reader can hold, an
engine without import circles, sans-IO protocol cores, and a bench and tests that stay apart.
Each check reads the files (``ast``), so it guards the rule whatever the test run imports."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "seqserve"
ENGINE = SRC / "engine"
MAX_PY_LINES = 600
MAX_CPP_LINES = 700
# The protocol state machines: bytes in, events and bytes out. Their asyncio adapters live beside
# them; these modules must stay free of I/O so that they are tested without sockets.
SANS_IO_CORES = (
    "api/transport/http1.py",
    "api/transport/http1_rules.py",
    "api/transport/http1_filter.py",
    "api/transport/h2_connection.py",
    "api/transport/h2_events.py",
    "api/transport/h2_frames.py",
    "api/transport/h2_hpack.py",
    "api/transport/h2_outbound.py",
    "api/transport/h2_fields.py",
    "api/transport/h2_streams.py",
)
IO_MODULES = {"asyncio", "socket", "ssl", "selectors", "uvloop"}


def _hand_written(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.py")):
        if "_proto" in path.parts or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        yield path


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT / "src" if SRC in path.parents else ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against ``path``)."""
    if not node.level:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _is_module(name: str) -> bool:
    """Whether a dotted name is a module or package of the tree (not an attribute of one)."""
    base = ROOT / "src" if name.startswith("seqserve") else ROOT
    stem = base.joinpath(*name.split("."))
    return stem.with_suffix(".py").exists() or (stem / "__init__.py").exists() or name.endswith("._core")


def test_no_module_too_long_to_hold() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for folder in (SRC, ROOT / "bench")
        for p in _hand_written(folder)
        if (n := len(p.read_text().splitlines())) > MAX_PY_LINES
    }
    long |= {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "csrc").rglob("*"))
        if p.suffix in {".cc", ".h", ".cu", ".cuh"} and (n := len(p.read_text().splitlines())) > MAX_CPP_LINES
    }
    assert not long, f"over {MAX_PY_LINES} lines (Python) or {MAX_CPP_LINES} (C++): {long}"


def test_no_private_name_crosses_a_module_boundary() -> None:
    crossings = []
    for folder in (SRC, ROOT / "bench", ROOT / "tests"):
        for path in _hand_written(folder):
            for node in ast.walk(_tree(path)):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = _resolve(path, node)
                if not source.startswith(("seqserve", "bench", "tests")):
                    continue
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and not _is_module(f"{source}.{alias.name}"):
                        crossings.append(f"{path.relative_to(ROOT)}: {alias.name} from {source}")
    assert not crossings, "private names imported across modules:\n" + "\n".join(crossings)


def _own_classes() -> dict[str, ast.ClassDef]:
    classes: dict[str, ast.ClassDef] = {}
    for path in _hand_written(SRC):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
    return classes


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        if isinstance(target, ast.Attribute):
            names.append(target.attr)
        elif isinstance(target, ast.Name):
            names.append(target.id)
    return names


_STANDALONE_BASES = {"ABC", "Protocol", "Exception", "Enum", "IntEnum", "NamedTuple", "TypedDict", "Generic"}


def _is_real_base(name: str, classes: dict[str, ast.ClassDef], seen: frozenset[str] = frozenset()) -> bool:
    """A class meant to be subclassed: abstract, an exception, an enum, a protocol, or one that
    builds its own state in ``__init__`` (so that a subclass does not reach into state it never
    made). A part with no constructor that works on its host's attributes is a mixin."""
    node = classes.get(name)
    if node is None or name in seen:
        return True
    if set(_base_names(node)) & _STANDALONE_BASES:
        return True
    if any(_is_real_base(b, classes, seen | {name}) and b in classes for b in _base_names(node)):
        return True
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            if item.name == "__init__":
                return True
            if any(isinstance(d, ast.Name) and d.id == "abstractmethod" for d in item.decorator_list):
                return True
        if isinstance(item, ast.AnnAssign | ast.Assign) and node.decorator_list:
            return True  # a dataclass: its fields are its constructor
    return False


def test_engine_objects_own_their_state() -> None:
    classes = _own_classes()
    mixins = []
    for path in _hand_written(ENGINE):
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            own_bases = [b for b in _base_names(node) if b in classes]
            where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
            if len(own_bases) > 1:
                mixins.append(f"{where} inherits {own_bases}")
            mixins += [f"{where} inherits mixin {b}" for b in own_bases if not _is_real_base(b, classes)]
            for item in node.body:
                if isinstance(item, ast.If) and "TYPE_CHECKING" in ast.unparse(item.test):
                    mixins.append(f"{where} declares attributes under TYPE_CHECKING")
    assert not mixins, "\n".join(mixins)


def _engine_graph() -> dict[str, set[str]]:
    """Module -> engine modules it imports, TYPE_CHECKING imports included: a circle that only the
    type checker sees still ties the files together for a reader."""
    graph: dict[str, set[str]] = {}
    for path in _hand_written(ENGINE):
        name = _module_name(path)
        edges = graph.setdefault(name, set())
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("seqserve.engine"))
            elif isinstance(node, ast.ImportFrom):
                source = _resolve(path, node)
                if not source.startswith("seqserve.engine"):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    edges.add(sub if _is_module(sub) else source)
        edges.discard(name)
        edges.discard("seqserve.engine._core")
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_engine_has_no_import_circle() -> None:
    graph = _engine_graph()
    # The package façade re-exports the engine; nothing inside the engine may lean on it.
    leaning = sorted(m for m, edges in graph.items() if "seqserve.engine" in edges and m != "seqserve.engine")
    assert not leaning, f"engine modules importing names from the seqserve.engine façade: {leaning}"
    assert not _circles(graph), f"import circles in the engine: {_circles(graph)}"


def test_protocol_cores_are_sans_io() -> None:
    for rel in SANS_IO_CORES:
        path = SRC / rel
        assert path.exists(), f"{rel} is named as a sans-IO core but does not exist"
        imported = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
        assert not imported & IO_MODULES, f"{rel} imports {sorted(imported & IO_MODULES)}"


def test_bench_is_for_users() -> None:
    readme = (ROOT / "bench" / "README.md").read_text().splitlines()
    assert len(readme) <= 250, f"bench/README.md has {len(readme)} lines"
    top = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
    assert len(top) <= 12, f"{len(top)} modules at bench's top level: {top}"


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines"


_IMPORT_BENCH = re.compile(r"^\s*(?:from|import)\s+bench\b", re.MULTILINE)
_IMPORT_CONFTEST = re.compile(r"^\s*(?:from|import)\s+[\w.]*conftest\b", re.MULTILINE)


def test_tests_stay_apart_from_bench_and_conftests() -> None:
    tests = ROOT / "tests"
    bench_users = [
        str(p.relative_to(ROOT))
        for p in tests.rglob("*.py")
        if tests / "bench" not in p.parents and _IMPORT_BENCH.search(p.read_text())
    ]
    assert not bench_users, f"tests importing bench outside tests/bench: {bench_users}"
    conftest_users = [str(p.relative_to(ROOT)) for p in tests.rglob("*.py") if _IMPORT_CONFTEST.search(p.read_text())]
    assert not conftest_users, f"tests importing a conftest: {conftest_users}"
