"""The `pytorch` backend: TorchScript models (`platform: "pytorch_libtorch"` or `backend: "pytorch"`).

Needs the optional extra: ``pip install '.[torch]'`` from a seqserve checkout (seqserve is not on
PyPI). torch is imported when a model that uses this backend loads, so a server without torch
pays nothing for it.

Model file: ``<version>/model.pt`` (or ``default_model_filename``), a TorchScript module
(``torch.jit.script`` / ``torch.jit.trace``, then ``.save``), loaded once per model instance
with ``torch.jit.load`` on the CPU and put in eval mode (torch 2.10+ deprecates TorchScript and
names no other loader for it: see ``load_torchscript``). One ``forward`` call per batch.

What ``forward`` receives (the "feeds"): every config ``input``, every configured control
tensor (START/END/READY/CORRID, [B, 1]) and every implicit-state input (``state.input_name``,
[B, *dims]), all batched as the engine forms them, as CPU tensors that share memory with the
engine's buffers (a model must not write into its inputs). Feeds are matched to forward's
arguments:

* by name: a feed whose name is an argument name goes to that argument;
* else by position, Triton's convention ``<anything>__<i>``: ``INPUT__0`` is argument 0
  (after ``self``);
* a forward that takes one ``Dict[str, Tensor]`` argument gets every feed in one dict.

Arguments with a default may be left unfed; anything else that does not match is a load error.

What ``forward`` returns: a Tensor, a tuple/list of Tensors (nested tuples such as an LSTM's
``(out, (h, c))`` are flattened depth-first), or a ``Dict[str, Tensor]``. The "produced
names" are the config outputs followed by the state outputs (``state.output_name``), in
config order. A dict is read by name. A tuple is read by position: a name ending in ``__<i>``
(``OUTPUT__0``) takes element i; the other names take the remaining elements in order of the
produced names. So a GRU cell returning ``(y, h_next)`` with output ``Y`` and state output
``H_OUT`` needs no naming convention at all. A state output the model does not return leaves
the state as it was (Triton's rule); a requested output it does not return fails the batch.

Config parameters (Triton's names): ``INTRA_OP_THREAD_COUNT`` (``torch.set_num_threads``) and
``INTER_OP_THREAD_COUNT`` (``torch.set_num_interop_threads``; torch allows it once per
process) - both are process-wide in torch, so the last model loaded wins;
``INFERENCE_MODE`` (default true: ``torch.inference_mode``; false: ``torch.no_grad``);
``DISABLE_OPTIMIZED_EXECUTION`` (``torch.jit.optimized_execution(False)``).

The forward pass runs on the instance's executor thread; torch releases the GIL inside its
ops, so instances of one or several models run in parallel. Not supported yet: TYPE_STRING
and TYPE_BF16 tensors.

GPU instances (``KIND_GPU``, or ``KIND_AUTO`` where torch sees CUDA): the module is moved to
``cuda:N`` and runs on the instance's CUDA stream (``torch.cuda.ExternalStream``), the stream the
engine issues the state copies on. Inputs and control tensors go through pinned host buffers
and asynchronous copies; fixed-shape implicit states are device memory the engine owns (DLPack,
no copy) and the next states the model returns stay on the device; only the outputs a reply
carries come back to the host (docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.backends.base import Backend, BackendInstance, InstanceContext, ModelContext
from seqserve.engine.batch import ExecuteBatch
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.paths import inside

log = logging.getLogger("seqserve.model")

_POSITIONAL = re.compile(r".*__(\d+)")
_TRUE = {"true", "1", "yes", "on"}


def _import_torch(model: str) -> Any:
    try:
        import torch
    except ImportError as e:
        raise InferenceError(
            Code.INVALID_ARG,
            f"model '{model}': the pytorch backend needs torch: `pip install '.[torch]'` in the seqserve "
            f"checkout ({e})",
        ) from e
    # Engine buffers are read-only numpy views; torch warns (once) that it cannot protect them.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
    return torch


# torch 2.10+ deprecates the whole TorchScript API (script, trace, save, load; "Please switch to
# torch.export"). torch.export saves and loads another format (an ExportedProgram, .pt2), and no
# public, non-deprecated function loads a TorchScript archive, which is what this backend serves
# (as Triton's pytorch_libtorch platform does). So the one deprecation notice of `torch.jit.load`
# is silenced for our call only; its Python 3.14 warning ("not supported ... and may break") is not.
_JIT_LOAD_DEPRECATED = r"`torch\.jit\.load` is deprecated"


def load_torchscript(torch: Any, path: Path) -> Any:
    """``torch.jit.load`` on the CPU, without its deprecation notice (see above)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_LOAD_DEPRECATED, category=DeprecationWarning)
        return torch.jit.load(str(path), map_location="cpu")


def _flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, (tuple, list)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


class _Plan:
    """How feeds map to forward's arguments and results map to produced names (per model)."""

    def __init__(self, name: str, schema: Any, feeds: list[str], produced: list[str]) -> None:
        params = [a for a in schema.arguments[1:]]  # after self
        pnames = [a.name for a in params]
        self.dict_arg: str | None = None
        self.kwargs: dict[str, str] = {}  # feed -> forward argument
        if len(params) == 1 and str(params[0].type).replace(" ", "") == "Dict[str,Tensor]":
            self.dict_arg = pnames[0]
        else:
            taken: dict[str, str] = {}
            for feed in feeds:
                if feed in pnames:
                    arg = feed
                elif (m := _POSITIONAL.fullmatch(feed)) and int(m.group(1)) < len(pnames):
                    arg = pnames[int(m.group(1))]
                else:
                    raise InferenceError(
                        Code.INVALID_ARG,
                        f"pytorch model '{name}': input '{feed}' matches no argument of forward({', '.join(pnames)}) "
                        "and does not follow the <name>__<index> convention",
                    )
                if arg in taken:
                    raise InferenceError(
                        Code.INVALID_ARG,
                        f"pytorch model '{name}': inputs '{taken[arg]}' and '{feed}' both map to forward argument "
                        f"'{arg}'",
                    )
                taken[arg] = feed
                self.kwargs[feed] = arg
            missing = [a.name for a in params if a.name not in taken and not a.has_default_value()]
            if missing:
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"pytorch model '{name}': forward argument(s) {missing} get no input, control or state "
                    f"(feeds: {feeds})",
                )
        # produced name -> tuple position
        self.positions: dict[str, int] = {}
        fixed = {n: int(m.group(1)) for n in produced if (m := _POSITIONAL.fullmatch(n))}
        used = set()
        for n, i in fixed.items():
            if i in used:
                raise InferenceError(
                    Code.INVALID_ARG, f"pytorch model '{name}': two outputs take element {i} of forward's result"
                )
            used.add(i)
            self.positions[n] = i
        free = (i for i in range(len(produced) + len(fixed)) if i not in used)
        for n in produced:
            if n not in fixed:
                self.positions[n] = next(free)


class TorchScriptBackend(Backend):
    names = ("pytorch",)
    platforms = ("pytorch_libtorch",)
    supports_implicit_state = True

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__(ctx)
        cfg = ctx.config
        self.torch = _import_torch(ctx.name)
        where = f"the version folder of model '{ctx.name}'"
        self.path = inside(ctx.version_dir, cfg.default_model_filename or "model.pt", "default_model_filename", where)
        if not self.path.is_file():
            raise InferenceError(Code.INVALID_ARG, f"pytorch model file not found: {self.path}")
        self._check_dtypes(cfg)
        seq = cfg.sequence_batching
        self.feeds = [t.name for t in cfg.input]
        self.feeds += [c.name for c in seq.control_input if c.control]
        self.feeds += [s.input_name or s.name for s in seq.state]
        produced = [t.name for t in cfg.output]
        produced += [n for s in seq.state if (n := s.output_name or s.name) not in produced]
        self.produced = produced
        self.state_outputs = {s.output_name or s.name for s in seq.state}
        params = ctx.parameters
        self.intra_op_threads = 0
        self.inference_mode = params.get("INFERENCE_MODE", "true").strip().lower() in _TRUE
        self.optimized = params.get("DISABLE_OPTIMIZED_EXECUTION", "false").strip().lower() not in _TRUE
        self._set_threads(params)
        self.plan: _Plan | None = None

    def _check_dtypes(self, cfg: mc.ModelConfig) -> None:
        tensors = [(t.name, t.data_type) for t in cfg.input] + [(t.name, t.data_type) for t in cfg.output]
        tensors += [(s.input_name or s.name, s.data_type) for s in cfg.sequence_batching.state]
        for tname, dt in tensors:
            if dt in (mc.TYPE_STRING, mc.TYPE_BF16):
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"pytorch model '{cfg.name}': tensor '{tname}' is {mc.DataType.Name(dt)}, which the pytorch "
                    "backend does not support yet",
                )

    def _set_threads(self, params: Mapping[str, str]) -> None:
        torch = self.torch
        for key, setter in (
            ("INTRA_OP_THREAD_COUNT", torch.set_num_threads),
            ("INTER_OP_THREAD_COUNT", torch.set_num_interop_threads),
        ):
            raw = params.get(key, "").strip()
            if not raw:
                continue
            try:
                n = int(raw)
            except ValueError:
                raise InferenceError(
                    Code.INVALID_ARG,
                    f"pytorch model '{self.ctx.name}': parameter {key} must be an integer, not {raw!r}",
                ) from None
            if n <= 0:
                continue
            if key == "INTRA_OP_THREAD_COUNT":
                self.intra_op_threads = n  # also applied on each executor thread (see execute)
            try:
                setter(n)
            except RuntimeError as e:  # inter-op threads can be set once, before parallel work
                log.warning("model '%s': %s=%d not applied: %s", self.ctx.name, key, n, e)

    def gpu_unsupported_reason(self) -> str:
        if not self.torch.cuda.is_available():
            return f"torch {self.torch.__version__} sees no CUDA device (torch.cuda.is_available() is false)"
        return ""

    def create_instance(self, ictx: InstanceContext) -> BackendInstance:
        torch = self.torch
        try:
            module = load_torchscript(torch, self.path)
        except Exception as e:
            raise InferenceError(
                Code.INVALID_ARG, f"failed to load TorchScript model {self.path}: {type(e).__name__}: {e}"
            ) from e
        module.eval()
        forward = getattr(module, "forward", None)
        schema = getattr(forward, "schema", None)
        if schema is None:
            raise InferenceError(Code.INVALID_ARG, f"TorchScript model {self.path} has no scripted forward method")
        if self.plan is None:
            self.plan = _Plan(self.ctx.name, schema, self.feeds, self.produced)
        if ictx.device.startswith("cuda:"):
            module.to(torch.device(ictx.device))
            return TorchScriptGpuInstance(self, module, self.plan, ictx)
        return TorchScriptInstance(self, module, self.plan)

    def describe(self) -> dict[str, Any]:
        return {"backend": "pytorch", "torch": self.torch.__version__}


class TorchScriptInstance(BackendInstance):
    def __init__(self, backend: TorchScriptBackend, module: Any, plan: _Plan) -> None:
        self._torch = backend.torch
        self._module = module
        self._plan = plan
        self._model = backend.ctx.name
        self._produced = backend.produced
        self._state_outputs = backend.state_outputs
        self._inference_mode = backend.inference_mode
        self._optimized = backend.optimized
        # torch's intra-op thread count is per thread for its math libraries: set it on the
        # executor thread itself, which is the one that runs forward.
        self._intra_op_threads = backend.intra_op_threads
        self._threads_applied = False

    def _guard(self) -> contextlib.ExitStack:
        torch = self._torch
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode() if self._inference_mode else torch.no_grad())
        if not self._optimized:
            stack.enter_context(torch.jit.optimized_execution(False))
        return stack

    def execute(self, batch: ExecuteBatch) -> Mapping[str, np.ndarray]:
        torch = self._torch
        if not self._threads_applied:
            if self._intra_op_threads:
                torch.set_num_threads(self._intra_op_threads)
            self._threads_applied = True
        plan = self._plan
        arrays = {**batch.inputs, **batch.controls, **batch.states}
        with self._guard():
            feeds = {name: torch.from_numpy(arr) for name, arr in arrays.items()}
            if plan.dict_arg is not None:
                result = self._module(**{plan.dict_arg: feeds})
            else:
                result = self._module(**{plan.kwargs[n]: t for n, t in feeds.items() if n in plan.kwargs})
            return self._outputs(batch, result)

    def _outputs(self, batch: ExecuteBatch, result: Any) -> dict[str, np.ndarray]:
        wanted = {o for outs in batch.request_outputs if outs for o in outs} | self._state_outputs
        out: dict[str, np.ndarray] = {}
        if isinstance(result, dict):
            for name in wanted:
                t = result.get(name)
                if t is not None:
                    out[name] = self._numpy(name, t)
            return out
        items = list(_flatten(result))
        for name in wanted:
            i = self._plan.positions.get(name)
            if i is not None and i < len(items):
                out[name] = self._numpy(name, items[i])
        return out

    def _numpy(self, name: str, t: Any) -> np.ndarray:
        if not isinstance(t, self._torch.Tensor):
            raise InferenceError(
                Code.INTERNAL,
                f"model '{self._model}': forward returned {type(t).__name__} for '{name}', expected a Tensor",
            )
        return t.detach().cpu().contiguous().numpy()  # type: ignore[no-any-return]


class TorchScriptGpuInstance(TorchScriptInstance):
    """A TorchScript instance on ``cuda:N``, running on the instance's CUDA stream."""

    def __init__(self, backend: TorchScriptBackend, module: Any, plan: _Plan, ictx: InstanceContext) -> None:
        super().__init__(backend, module, plan)
        torch = self._torch
        self._device = torch.device(ictx.device)
        self._stream = torch.cuda.ExternalStream(ictx.cuda_stream, device=self._device)
        self._pinned: dict[str, Any] = {}  # feed name -> its pinned host buffer
        self._uploaded = torch.cuda.Event()  # the last batch's copies out of the pinned buffers
        seq = backend.ctx.config.sequence_batching
        self._state_output_of = {(s.input_name or s.name): (s.output_name or s.name) for s in seq.state}

    def execute(self, batch: ExecuteBatch) -> Mapping[str, np.ndarray]:
        torch = self._torch
        plan = self._plan
        on_device = {self._state_output_of[n] for n, v in batch.states.items() if not isinstance(v, np.ndarray)}
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream), self._guard():
            self._uploaded.synchronize()  # the pinned buffers are free again
            feeds: dict[str, Any] = {}
            for name, arr in {**batch.inputs, **batch.controls, **batch.states}.items():
                feeds[name] = self._upload(name, arr) if isinstance(arr, np.ndarray) else torch.from_dlpack(arr)
            self._uploaded.record(self._stream)
            if plan.dict_arg is not None:
                result = self._module(**{plan.dict_arg: feeds})
            else:
                result = self._module(**{plan.kwargs[n]: t for n, t in feeds.items() if n in plan.kwargs})
            return self._device_outputs(batch, result, on_device)

    def _upload(self, name: str, arr: np.ndarray) -> Any:
        """``arr`` on the device: copied into this feed's pinned buffer, then asynchronously on
        the stream (a pinned source makes the copy truly asynchronous)."""
        torch = self._torch
        src = torch.from_numpy(arr)
        pinned = self._pinned.get(name)
        if pinned is None or pinned.shape != src.shape or pinned.dtype != src.dtype:
            pinned = self._pinned[name] = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        pinned.copy_(src)
        return pinned.to(self._device, non_blocking=True)

    def _device_outputs(self, batch: ExecuteBatch, result: Any, on_device: set[str]) -> dict[str, Any]:
        """Device-held next states stay on the device (contiguous); the rest come to the host."""
        wanted = {o for outs in batch.request_outputs if outs for o in outs} | self._state_outputs
        if isinstance(result, dict):
            picked = {name: result[name] for name in wanted if result.get(name) is not None}
        else:
            items = list(_flatten(result))
            positions = self._plan.positions
            picked = {n: items[i] for n in wanted if (i := positions.get(n)) is not None and i < len(items)}
        out: dict[str, Any] = {}
        for name, t in picked.items():
            if name in on_device and isinstance(t, self._torch.Tensor):
                out[name] = t.detach().contiguous()
            else:
                out[name] = self._numpy(name, t)
        return out
