"""The model configuration of every bundled and test model, served by a real server, is what
Triton's own protobuf classes (tritonclient's ``model_config_pb2``) accept strictly: the JSON of
``GET /v2/models/<m>/config`` parses without ``ignore_unknown_fields``, and the gRPC ModelConfig
reply holds no field Triton's proto lacks. (Configs that set seqserve's own fields, such as the
brief configs, are covered field by field in tests/unit/test_config_json.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from tritonclient.grpc import model_config_pb2 as triton

from tests.support.clients import http_request
from tests.support.models import copy_model
from tests.support.paths import DEMO_REPO, MODELS, ROOT
from tests.support.process import ServerProcess, serving

SOURCES = (DEMO_REPO, MODELS, ROOT / "bench" / "models")
MODEL_DIRS = sorted((p.parent for root in SOURCES for p in root.glob("*/config.pbtxt")), key=lambda p: p.name)


@pytest.fixture(scope="module")
def every_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("every-model")
    for model_dir in MODEL_DIRS:
        copy_model(repo, model_dir.name, source=model_dir.parent)
    with serving(repo, log_dir=repo) as srv:
        yield srv


def _unknown_fields(msg: Message, where: str = "") -> list[str]:
    """Every field, at any depth, that Triton's proto does not know."""
    found = [f"{where}#{f.field_number}" for f in UnknownFieldSet(msg)]
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = value.values() if field.message_type.fields_by_name["value"].message_type else []
        else:
            items = value if field.is_repeated else [value]
        for item in items:
            found += _unknown_fields(item, f"{where}.{field.name}")
    return found


def test_every_model_loaded(every_model: ServerProcess) -> None:
    index = grpcclient.InferenceServerClient(every_model.grpc_url).get_model_repository_index()
    ready = {m.name for m in index.models if m.state == "READY"}
    assert ready == {p.name for p in MODEL_DIRS}


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=lambda p: p.name)
def test_http_config_json_parses_strictly(every_model: ServerProcess, model_dir: Path) -> None:
    r = http_request(every_model, "GET", f"/v2/models/{model_dir.name}/config")
    assert r.status == 200, r.body
    parsed = json_format.Parse(r.body.decode(), triton.ModelConfig())  # no ignore_unknown_fields
    assert parsed.name == model_dir.name


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=lambda p: p.name)
def test_grpc_config_has_no_field_triton_lacks(every_model: ServerProcess, model_dir: Path) -> None:
    client = grpcclient.InferenceServerClient(every_model.grpc_url)
    reply = client.get_model_config(model_dir.name)
    assert _unknown_fields(reply.config) == []
    as_json = client.get_model_config(model_dir.name, as_json=True)
    json_format.Parse(json.dumps(as_json["config"]), triton.ModelConfig())
