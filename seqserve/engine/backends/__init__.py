"""Backend registry, keyed by the config's `backend` and `platform`.

Built-in backends are registered through the `seqserve.backends` entry-point group like any
third-party one, so installing a package that declares an entry point there is all it takes
to add a backend.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.base import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.errors import Code, InferenceError

__all__ = ["Backend", "BackendInstance", "InstanceContext", "ModelContext", "find_backend", "registered"]

_BUILTIN = {"python": "seqserve.engine.backends.python_batch:PythonBackend"}
_cache: dict[str, type[Backend]] | None = None


def _load(ref: str) -> type[Backend]:
    module, _, attr = ref.partition(":")
    mod = __import__(module, fromlist=[attr])
    cls = getattr(mod, attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"{ref} is not a seqserve Backend subclass")
    return cls


def registered() -> dict[str, type[Backend]]:
    """Every backend and platform name we can serve, mapped to its backend class."""
    global _cache
    if _cache is None:
        found: dict[str, type[Backend]] = {}
        refs = dict(_BUILTIN)
        for ep in entry_points(group="seqserve.backends"):
            refs[ep.name] = ep.value
        for ref in refs.values():
            cls = _load(ref)
            for n in (*cls.names, *cls.platforms):
                found.setdefault(n, cls)
        _cache = found
    return _cache


def find_backend(cfg: mc.ModelConfig) -> type[Backend]:
    table = registered()
    key = cfg.backend or cfg.platform
    if not key:
        raise InferenceError(Code.INVALID_ARG, f"model '{cfg.name}' must specify 'backend' or 'platform'")
    cls = table.get(cfg.backend) or table.get(cfg.platform)
    if cls is None:
        kind = "backend" if cfg.backend else "platform"
        supported = ", ".join(sorted(table))
        raise InferenceError(Code.INVALID_ARG, f"no backend for {kind} '{key}'; supported: {supported}")
    return cls
