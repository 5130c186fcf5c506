"""Loading an ensemble: the step models its config names (loaded before it), and the
ensemble version built over the step models loaded now, checked against their configs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine.config import parse_config_json, parse_model_config
from seqserve.engine.config.ensemble import is_ensemble, step_model_names, validate_ensemble_steps
from seqserve.engine.ensemble.model import EnsembleModel, StepLookup
from seqserve.engine.errors import Code, InferenceError


def ensemble_step_names(name: str, path: Path, config_json: str | None, config_name: str | None) -> list[str]:
    """The step models of the config at ``path`` (or given as JSON), if it is an ensemble;
    none for any other model, or a config that does not parse (its own load says why)."""
    try:
        if config_json is not None:
            cfg = parse_config_json(config_json, name=name)
        else:
            cfg = parse_model_config(path, name=name, config_name=config_name)
    except InferenceError:
        return []
    return step_model_names(cfg) if is_ensemble(cfg) else []


def circular_dependency(chain: list[str]) -> InferenceError:
    """Triton's error for ensembles that are each other's steps (``chain``: A, B, ..., A)."""
    return InferenceError(Code.INVALID_ARG, f"circular dependency between ensembles: {' -> '.join(chain)}")


def build_ensemble(
    cfg: mc.ModelConfig,
    *,
    version: int,
    path: Path,
    loop: asyncio.AbstractEventLoop,
    lookup: StepLookup,
    load_failure: Callable[[str], str],
) -> EnsembleModel:
    """An ensemble version over its step models as loaded now. ``load_failure(model)``: why
    a step model failed to load ("" when it did not fail)."""
    steps = {}
    for step in cfg.ensemble_scheduling.step:
        name = step.model_name
        try:
            steps[name] = lookup(name, "" if step.model_version < 0 else str(step.model_version))
        except InferenceError:
            reason = load_failure(name)
            why = f". Model '{name}' loading failed with error: {reason}" if reason else ""
            raise InferenceError(
                Code.INVALID_ARG, f"ensemble '{cfg.name}' depends on '{name}' which has no loaded version{why}"
            ) from None
    cfg.model_transaction_policy.decoupled = validate_ensemble_steps(cfg, lambda s: steps[s.model_name].config)
    return EnsembleModel(
        cfg,
        version=version,
        model_dir=path,
        loop=loop,
        lookup=lookup,
        decoupled_steps=frozenset(n for n, m in steps.items() if m.decoupled),
    )
