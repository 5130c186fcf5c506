"""Server settings behind Triton's flags: --id (server metadata), --model-config-name
(configs/<name>.pbtxt), --backend-config=default-max-batch-size and
--disable-auto-complete-config (ONNX auto-complete)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import onnx_models as fx
from tests.support.models import copy_model

pytest.importorskip("onnx")


async def test_server_id_is_the_metadata_name(repo, serve):
    s = await serve(server_id="edge-7")
    assert s.metadata()["name"] == "edge-7"


async def test_model_config_name_picks_configs_file(repo, serve):
    copy_model(repo, "plus_one", "a")
    copy_model(repo, "plus_one", "b")
    (repo / "a" / "configs").mkdir()
    text = (repo / "a" / "config.pbtxt").read_text()
    (repo / "a" / "configs" / "h100.pbtxt").write_text(text.replace("max_batch_size: 0", "max_batch_size: 2"))
    s = await serve(model_config_name="h100")
    assert s.model_config_json("a")["max_batch_size"] == 2  # configs/h100.pbtxt
    assert s.model_config_json("b")["max_batch_size"] == 0  # no configs/h100.pbtxt: config.pbtxt


async def test_default_max_batch_size_and_auto_complete(repo, serve):
    fx.add_sub_model(repo, "add_sub")  # batchable graph, no config.pbtxt
    s = await serve(default_max_batch_size=16)
    assert s.model_config_json("add_sub")["max_batch_size"] == 16
    await s.shutdown(timeout_s=0)
    strict = await serve(auto_complete_config=False)
    assert "add_sub" in strict.failed_models()  # nothing completes its inputs and outputs


async def test_backend_directory(repo, serve, tmp_path):
    backends = tmp_path / "backends"
    (backends / "python").mkdir(parents=True)  # Triton's own backend folders hold no backend.py
    (backends / "python" / "libtriton_python.so").write_bytes(b"")
    (backends / "dirbackend").mkdir()
    (backends / "dirbackend" / "backend.py").write_text(
        "from seqserve.engine.backends.python_batch import PythonBackend\n\n\n"
        "class DirectoryBackend(PythonBackend):\n"
        '    """The python backend, under another name."""\n'
    )
    copy_model(repo, "plus_one", "m")
    config = repo / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python"', 'backend: "dirbackend"'))
    s = await serve(backend_directory=backends)
    assert s.model_config_json("m")["backend"] == "dirbackend"
    assert "m" not in s.failed_models()
    result = await s.infer("m", {"X": np.array([1], np.int32)})
    assert result.outputs["Y"].tolist() == [2]
