"""Model repository layout: ``<repo>/<model>/config.pbtxt`` and
``<repo>/<model>/<version>/...``. Finding models and picking versions only;
loading them is the model table's job (``models.py``)."""

from __future__ import annotations

from pathlib import Path

from seqserve._proto.model_config_pb2 import ModelConfig
from seqserve.engine.backends import find_backend
from seqserve.engine.config import CONFIG_FILENAME
from seqserve.engine.errors import InferenceError, ModelConfigError

#: a known model file in a version folder names the backend of a config that names none
BACKEND_BY_FILE = {"model.onnx": "onnxruntime"}

__all__ = ["available_versions", "discover_models", "select_versions"]


def discover_models(repo: Path) -> list[Path]:
    """Model directories in ``repo``, sorted by name.

    A model directory holds a config.pbtxt or at least one numeric version
    folder. Hidden entries (``.git``, ``.ipynb_checkpoints``) are skipped.
    """
    models = [
        entry
        for entry in Path(repo).iterdir()
        if entry.is_dir() and not entry.name.startswith(".") and _looks_like_model(entry)
    ]
    return sorted(models, key=lambda p: p.name)


def _looks_like_model(model_dir: Path) -> bool:
    return (model_dir / CONFIG_FILENAME).is_file() or bool(available_versions(model_dir))


def available_versions(model_dir: Path) -> list[int]:
    """Version numbers of the numeric sub-directories, ascending (names with
    a leading zero are not versions)."""
    versions = [
        int(entry.name) for entry in Path(model_dir).iterdir() if entry.is_dir() and _is_version_name(entry.name)
    ]
    return sorted(versions)


def _is_version_name(name: str) -> bool:
    # Positive decimal numbers without a leading zero, as Triton reads them
    # ("0", "007" are ignored). isascii() because isdigit() also accepts
    # characters such as superscripts.
    return name.isascii() and name.isdigit() and not name.startswith("0")


def select_versions(model_dir: Path, cfg: ModelConfig) -> list[int]:
    """The versions ``cfg.version_policy`` serves, ascending.

    No policy means latest 1 (what normalize_config sets).
    """
    model = cfg.name or Path(model_dir).name
    available = available_versions(model_dir)
    if not available:
        raise ModelConfigError(f"no version sub-directory found for model '{model}'")
    policy = cfg.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        return _specific_versions(list(policy.specific.versions), available, model)
    num = policy.latest.num_versions if choice == "latest" else 1
    if num < 1:
        raise ModelConfigError(f"version_policy latest.num_versions must be at least 1 for model '{model}'")
    return available[-num:]


def _specific_versions(wanted: list[int], available: list[int], model: str) -> list[int]:
    have = set(available)
    for version in wanted:
        if version not in have:
            raise ModelConfigError(f"version {version} not found for model '{model}'")
    if not wanted:
        raise ModelConfigError(f"version_policy specific lists no versions for model '{model}'")
    return sorted(set(wanted))


def autocomplete_config(cfg: ModelConfig, path: Path, default_max_batch_size: int) -> None:
    """Let the model's backend complete its config (Triton's auto-complete): a config that
    names no backend gets one from a known model file in a version folder."""
    if not cfg.backend and not cfg.platform:
        for version in reversed(available_versions(path)):
            found = [b for f, b in BACKEND_BY_FILE.items() if (path / str(version) / f).exists()]
            if found:
                cfg.backend = found[0]
                break
    try:
        backend = find_backend(cfg)
    except InferenceError:
        return  # no (usable) backend: LoadedModel reports it, after the config's own checks
    backend.autocomplete_config(cfg, path, default_max_batch_size=default_max_batch_size)
