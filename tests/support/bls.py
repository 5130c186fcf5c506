"""The BLS test model (tests/models/bls_sum) served under other names and parameters."""

from __future__ import annotations

from pathlib import Path

from tests.support.models import copy_model

#: bls_sum's parameters as its config.pbtxt sets them
BLS_DEFAULTS = {"callee": "accumulator", "mode": "sync", "timeout_us": "0"}


def bls_model(repo: Path, name: str = "bls_sum", **params: str) -> Path:
    """tests/models/bls_sum served as `name`, with its parameters (callee, mode, timeout_us)
    replaced by `params`."""
    d = copy_model(repo, "bls_sum", name)
    cfg = d / "config.pbtxt"
    text = cfg.read_text()
    for key, value in params.items():
        old = f'{{ key: "{key}" value: {{ string_value: "{BLS_DEFAULTS[key]}" }} }}'
        assert old in text, key
        text = text.replace(old, f'{{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    cfg.write_text(text)
    return d
