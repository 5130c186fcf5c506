"""How a model's instances execute: in this process or isolated, with or without a timeout,
on executor threads or inline on the event loop. Read from the config's ``parameters``:

- ``isolation``: ``thread`` (in the server process, on the instance's executor thread) or
  ``process`` (each instance in its own child process); unset: the server's default for
  Python models (``Server(python_isolation=...)``, ``seqserve serve --python-isolation``).
- ``execute_timeout_ms``: a batch whose ``execute`` takes longer fails with UNAVAILABLE; a
  process-isolated instance is then killed and restarted. Unset or 0: no timeout.
- ``inline_max_batch_us``: inline execution (docs/architecture.md#inline-execution): an
  in-process Python model whose batches cost at most this many microseconds runs them on the
  event loop's thread; 0: never. Unset: the server's default (``Server(inline_max_batch_us=...)``,
  ``seqserve serve --inline-max-batch-us``).
"""

from __future__ import annotations

from dataclasses import dataclass

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.errors import Code, InferenceError

ISOLATION = "isolation"
EXECUTE_TIMEOUT_MS = "execute_timeout_ms"
INLINE_MAX_BATCH_US = "inline_max_batch_us"
MODES = ("thread", "process")
#: the server's default bound of inline execution, in microseconds (0: never inline)
DEFAULT_INLINE_MAX_BATCH_US = 200
#: the default bound under worker processes (``serve --workers`` 2 or more): the engine's event
#: loop then serves no client socket, and a batch on the ring drain thread holds up only the
#: submission of other ring records meanwhile; at 200 us, batches of 15-20 rows kept crossing the
#: bound and demoting the model to its executor threads, which cost more per step
#: (bench/docs/workers.md, "Round 3")
WORKERS_INLINE_MAX_BATCH_US = 500


@dataclass(frozen=True, slots=True)
class ExecutionSettings:
    process: bool  # each instance in a child process
    execute_timeout_s: float | None  # None: no timeout
    inline_max_batch_us: int = 0  # batches this cheap run on the event loop (0: never)
    #: KIND_GPU groups run on the CPU when there is no usable GPU (else the load fails)
    kind_gpu_on_cpu: bool = False


def check_mode(value: str, what: str) -> str:
    if value not in MODES:
        raise InferenceError(Code.INVALID_ARG, f"{what} must be 'thread' or 'process', not '{value}'")
    return value


def execution_settings(
    cfg: mc.ModelConfig,
    *,
    python_backend: bool,
    default: str = "thread",
    inline_max_batch_us: int = DEFAULT_INLINE_MAX_BATCH_US,
    kind_gpu_on_cpu: bool = False,
) -> ExecutionSettings:
    """The settings of one model; INVALID_ARG for values that make no sense.

    ``python_backend``: the model is served by the python backend, the one that can run
    isolated (the server's default applies to it only). ``inline_max_batch_us``: the server's
    default bound of inline execution."""
    params = cfg.parameters
    raw = params[ISOLATION].string_value.strip().lower() if ISOLATION in params else ""
    if raw:
        mode = check_mode(raw, f"model '{cfg.name}': parameter '{ISOLATION}'")
    else:
        mode = default if python_backend else "thread"
    if mode == "process" and not python_backend:
        raise InferenceError(
            Code.INVALID_ARG,
            f"model '{cfg.name}': parameter '{ISOLATION}' is 'process', which only the python backend supports",
        )
    timeout_s: float | None = None
    if EXECUTE_TIMEOUT_MS in params:
        text = params[EXECUTE_TIMEOUT_MS].string_value.strip()
        try:
            ms = int(text)
        except ValueError:
            ms = -1
        if ms < 0:
            raise InferenceError(
                Code.INVALID_ARG,
                f"model '{cfg.name}': parameter '{EXECUTE_TIMEOUT_MS}' must be a whole number of milliseconds "
                f"(0: no timeout), not '{text}'",
            )
        timeout_s = ms / 1000 if ms else None
    inline_us = _whole_number(cfg, INLINE_MAX_BATCH_US, "microseconds (0: never inline)", inline_max_batch_us)
    return ExecutionSettings(mode == "process", timeout_s, inline_us, kind_gpu_on_cpu)


def _whole_number(cfg: mc.ModelConfig, key: str, unit: str, default: int) -> int:
    if key not in cfg.parameters:
        return default
    text = cfg.parameters[key].string_value.strip()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InferenceError(
            Code.INVALID_ARG, f"model '{cfg.name}': parameter '{key}' must be a whole number of {unit}, not '{text}'"
        )
    return value
