"""Backend registry, keyed by the config's `backend` and `platform`.

Built-in backends and third-party ones (the `seqserve.backends` entry-point group: the entry
point's name is a backend or platform name, its value `module:Class`) are imported only when a
model needs them, so an optional backend whose library is missing costs nothing.

A backend directory (Triton's --backend-directory, only when the operator names one) adds the
backends of its folders: ``<dir>/<name>/backend.py`` defines a Backend subclass, served for
``backend: "<name>"``. Folders without a backend.py (Triton's own backends) are skipped. Names
already known (built-in, entry points) keep their backend.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.base import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.errors import Code, InferenceError

__all__ = [
    "Backend",
    "BackendInstance",
    "InstanceContext",
    "ModelContext",
    "add_backend_directory",
    "find_backend",
    "registered",
]

#: the prefix of a registry entry whose backend is a file of a backend directory
_FILE_REF = "file:"
#: the file a backend directory's folder holds
BACKEND_FILE = "backend.py"

# backend / platform name -> "module:Class"
_BUILTIN = {
    "python": "seqserve.engine.backends.python_batch:PythonBackend",
    "onnxruntime": "seqserve.engine.backends.onnxrt:OnnxRuntimeBackend",
    "onnxruntime_onnx": "seqserve.engine.backends.onnxrt:OnnxRuntimeBackend",
    "pytorch": "seqserve.engine.backends.torchscript:TorchScriptBackend",
    "pytorch_libtorch": "seqserve.engine.backends.torchscript:TorchScriptBackend",
}
_refs: dict[str, str] | None = None
_loaded: dict[str, type[Backend]] = {}


def registered() -> dict[str, str]:
    """Every backend and platform name we can serve, mapped to its `module:Class`."""
    global _refs
    if _refs is None:
        refs = dict(_BUILTIN)
        for ep in entry_points(group="seqserve.backends"):
            refs.setdefault(ep.name, ep.value)
        _refs = refs
    return _refs


def add_backend_directory(directory: Path) -> list[str]:
    """Register the backends of ``directory`` (see the module's docstring); returns the names
    it added."""
    table = registered()
    added = []
    for folder in sorted(p for p in Path(directory).iterdir() if p.is_dir()):
        path = folder / BACKEND_FILE
        if path.is_file() and folder.name not in table:
            table[folder.name] = f"{_FILE_REF}{path.resolve()}"
            added.append(folder.name)
    return added


def _load_file(path: str) -> type[Backend]:
    """The Backend subclass that the backend directory's ``path`` defines."""
    name = f"seqserve_backends.{Path(path).parent.name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InferenceError(Code.INVALID_ARG, f"cannot import backend {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise InferenceError(Code.INVALID_ARG, f"failed to import backend {path}: {type(e).__name__}: {e}") from e
    found = [
        c
        for c in vars(module).values()
        if isinstance(c, type) and issubclass(c, Backend) and c is not Backend and c.__module__ == name
    ]
    if len(found) != 1:
        raise InferenceError(Code.INVALID_ARG, f"{path} must define one seqserve Backend subclass, found {len(found)}")
    return found[0]


def _load(ref: str) -> type[Backend]:
    cls = _loaded.get(ref)
    if cls is None and ref.startswith(_FILE_REF):
        cls = _loaded[ref] = _load_file(ref[len(_FILE_REF) :])
    if cls is None:
        module, _, attr = ref.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except ImportError as e:
            raise InferenceError(Code.INVALID_ARG, f"backend {ref} is not available: {e}") from e
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise InferenceError(Code.INTERNAL, f"{ref} is not a seqserve Backend subclass")
        _loaded[ref] = cls
    return cls


def find_backend(cfg: mc.ModelConfig) -> type[Backend]:
    table = registered()
    key = cfg.backend or cfg.platform
    if not key:
        raise InferenceError(Code.INVALID_ARG, f"model '{cfg.name}' must specify 'backend' or 'platform'")
    ref = table.get(cfg.backend) or table.get(cfg.platform)
    if ref is None:
        kind = "backend" if cfg.backend else "platform"
        supported = ", ".join(sorted(table))
        raise InferenceError(Code.INVALID_ARG, f"no backend for {kind} '{key}'; supported: {supported}")
    return _load(ref)
