"""The `python` backend: batch-level Python models, and Triton-style ones.

`<version>/model.py` defines either a class `Model` (our batch-level API) or a class
`TritonPythonModel` (Triton's request-level API, run by `triton_adapter`); when it defines
both, `Model` is used. Before model.py is imported, seqserve's `triton_python_backend_utils`
(`triton_utils`) is installed in `sys.modules`, so Triton models import it unchanged.

The batch-level API:

    class Model:
        def initialize(self, ctx: InstanceContext) -> None: ...      # optional
        def execute(self, batch: ExecuteBatch) -> dict[str, np.ndarray]: ...
        def finalize(self) -> None: ...                                # optional

`execute` is called once per batch with batched inputs, control tensors and implicit state,
and returns every output and every output state batched. One object is created per model
instance; the engine never calls one object from two threads at once.

``execute`` may call other models of the server (BLS, docs/pipelines.md) through the
``InstanceContext`` that ``initialize`` got: ``ctx.infer(model, inputs, sequence_id=...,
sequence_start=..., sequence_end=..., timeout_s=...)`` waits for the callee's ``InferResult``
(raising ``InferenceError`` on its error), ``ctx.stream(...)`` iterates over a decoupled
callee's responses. A call into a sequence model holds that sequence's slot as a client's
request does. A model may not call itself from its own ``execute`` (refused: a deadlock).

A decoupled model (``model_transaction_policy { decoupled: true }``) answers each request
through ``batch.responder(i)`` instead (``send(outputs)`` any number of times, from any
thread, then ``send(final=True)``; outputs shaped as that request's reply), and returns
only its output states (or None).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from seqserve.engine.backends import triton_utils
from seqserve.engine.backends.base import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.backends.triton_adapter import TritonInstance
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.paths import inside


def _install_pb_utils() -> None:
    """Make `import triton_python_backend_utils` give seqserve's implementation."""
    if sys.modules.get("triton_python_backend_utils") is not triton_utils:
        sys.modules["triton_python_backend_utils"] = triton_utils


def _load_module(ctx: ModelContext) -> ModuleType:
    filename = ctx.config.default_model_filename or "model.py"
    path = inside(ctx.version_dir, filename, "default_model_filename", f"the version folder of model '{ctx.name}'")
    if not path.is_file():
        raise InferenceError(Code.INVALID_ARG, f"python model file not found: {path}")
    mod_name = f"seqserve_models.{ctx.name}.v{ctx.version}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InferenceError(Code.INVALID_ARG, f"cannot import python model {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    _install_pb_utils()
    # As Triton does: a model imports modules that sit next to model.py (its version folder)
    # or in its model folder. seqserve runs every model in one process, so two models' helper
    # modules of the same name are one module (the first imported).
    for folder in (str(ctx.version_dir), str(ctx.model_dir)):
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise InferenceError(Code.INVALID_ARG, f"failed to import {path}: {type(e).__name__}: {e}") from e
    return module


class _Instance(BackendInstance):
    __slots__ = ("_execute", "_obj")

    def __init__(self, obj: Any) -> None:
        self._obj = obj
        self._execute = obj.execute

    def execute(self, batch: ExecuteBatch) -> Mapping[str, np.ndarray]:
        return self._execute(batch)  # type: ignore[no-any-return]

    def finalize(self) -> None:
        fin = getattr(self._obj, "finalize", None)
        if fin is not None:
            fin()


class _DecoupledInstance(_Instance):
    __slots__ = ()
    uses_responders = True


class PythonBackend(Backend):
    names = ("python",)
    supports_implicit_state = True
    supports_decoupled = True
    supports_ragged_batch = True

    def gpu_unsupported_reason(self) -> str:
        return ""  # the model decides what runs on its GPU; its device states arrive as DLPack arrays

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__(ctx)
        self._module = _load_module(ctx)
        cls = getattr(self._module, "Model", None)
        self._triton = False
        if cls is None or not isinstance(cls, type):
            cls = getattr(self._module, "TritonPythonModel", None)
            if not isinstance(cls, type):
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"python model '{ctx.name}' must define a class named 'Model' (seqserve's batch-level API) "
                    "or 'TritonPythonModel' (Triton's)",
                )
            self._triton = True
        elif not callable(getattr(cls, "execute", None)):
            raise InferenceError(Code.INVALID_ARG, f"python model '{ctx.name}': Model has no execute method")
        self._cls = cls

    def create_instance(self, ictx: InstanceContext) -> BackendInstance:
        obj = self._cls()
        if self._triton:
            return TritonInstance(obj, ictx)
        init = getattr(obj, "initialize", None)
        if init is not None:
            init(ictx)
        if self.ctx.config.model_transaction_policy.decoupled:
            return _DecoupledInstance(obj)
        return _Instance(obj)

    def describe(self) -> dict[str, Any]:
        return {"backend": "python", "api": "triton" if self._triton else "batch"}
