"""Every shared test model in tests/models loads as it is on disk, so a broken one fails here,
named, rather than somewhere in a test that copies it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.models import IDENTITY_DTYPES, copy_model
from tests.support.paths import MODELS

SHARED = sorted(p.name for p in MODELS.iterdir() if (p / "config.pbtxt").is_file())


def test_every_folder_is_a_model() -> None:
    folders = sorted(p.name for p in MODELS.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == SHARED
    for name in SHARED:
        assert (MODELS / name / "1" / "model.py").is_file(), name
        assert f'name: "{name}"' in (MODELS / name / "config.pbtxt").read_text(), name


@pytest.mark.parametrize("name", SHARED)
async def test_shared_model_loads(name: str, repo: Path, serve) -> None:
    copy_model(repo, name)
    s = await serve()
    assert s.failed_models() == {}
    assert s.is_ready()
    assert s.model(name) is not None


def test_identity_serves_every_datatype() -> None:
    text = (MODELS / "identity" / "config.pbtxt").read_text()
    for dtype in IDENTITY_DTYPES:
        config_type = "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"
        assert f'name: "IN_{dtype}" data_type: {config_type}' in text, dtype
        assert f'name: "OUT_{dtype}" data_type: {config_type}' in text, dtype
