"""Backend registry, keyed by the config's `backend` and `platform`.

Built-in backends and third-party ones (the `seqserve.backends` entry-point group: the entry
point's name is a backend or platform name, its value `module:Class`) are imported only when a
model needs them, so an optional backend whose library is missing costs nothing.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.base import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.errors import Code, InferenceError

__all__ = ["Backend", "BackendInstance", "InstanceContext", "ModelContext", "find_backend", "registered"]

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


def _load(ref: str) -> type[Backend]:
    cls = _loaded.get(ref)
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
