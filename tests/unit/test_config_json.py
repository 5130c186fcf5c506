"""The model-config JSON has Triton's shape: Triton's own ``model_config_pb2`` (tritonclient's)
parses it strictly for every config that sets no seqserve field, and a seqserve field appears
only when the config sets it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as triton

from seqserve.engine.config import load_model_config
from seqserve.engine.config.parse import config_to_json
from tests.support.paths import BRIEF, DEMO_REPO, MODELS, ROOT

REPOSITORIES = (DEMO_REPO, MODELS, ROOT / "bench" / "models")
BUNDLED = sorted(p.parent for root in REPOSITORIES for p in root.glob("*/config.pbtxt"))

#: the brief configs set seqserve fields: (folder, model name, the seqserve fields' JSON paths;
#: their ``timeout_action: TIMEOUT_REJECT`` is the default value, which proto3 does not keep)
BRIEF_CONFIGS = [
    (
        "lstm_from_brief_a",
        "my_lstm_model",
        {
            "dynamic_batching",  # beside sequence_batching (one of them in Triton), with default_batch_size
            "sequence_batching.reusable_batch",
            "sequence_batching.state.name",
        },
    ),
    # stateful_model_policy adds sequence_batching beside the config's dynamic_batching
    ("rnn_from_brief_b", "rnn_model", {"model_transaction_policy.stateful_model_policy", "dynamic_batching"}),
]


def strict_parse(doc: dict[str, Any]) -> triton.ModelConfig:
    return json_format.Parse(json.dumps(doc), triton.ModelConfig())


@pytest.mark.parametrize("model_dir", BUNDLED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bundled_config_json_parses_strictly_as_triton(model_dir: Path) -> None:
    cfg = load_model_config(model_dir)
    parsed = strict_parse(config_to_json(cfg))
    assert parsed.name == cfg.name
    assert len(parsed.input) == len(cfg.input) and len(parsed.output) == len(cfg.output)


def _remove(doc: Any, path: list[str]) -> bool:
    """Remove the key at ``path`` from ``doc`` (through lists); whether any was there."""
    if isinstance(doc, list):
        return any([_remove(item, path) for item in doc])
    if not isinstance(doc, dict) or path[0] not in doc:
        return False
    if len(path) == 1:
        del doc[path[0]]
        return True
    return _remove(doc[path[0]], path[1:])


@pytest.mark.parametrize(("folder", "name", "extensions"), BRIEF_CONFIGS)
def test_config_json_holds_exactly_the_seqserve_fields_set(folder: str, name: str, extensions: set[str]) -> None:
    doc = config_to_json(load_model_config(BRIEF / folder, name=name))
    with pytest.raises(json_format.ParseError):
        strict_parse(doc)
    for path in extensions:
        assert _remove(doc, path.split(".")), path
    strict_parse(doc)


def test_unset_seqserve_fields_are_left_out() -> None:
    doc = config_to_json(load_model_config(DEMO_REPO / "lstm"))
    seq = doc["sequence_batching"]
    assert "timeout_action" not in seq and "max_backlog_sequences" not in seq
    assert all("name" not in state for state in seq["state"])
    assert "oldest" in seq or "direct" in seq
