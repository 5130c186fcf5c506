"""Model discovery and version policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqserve.engine.config import load_model_config
from seqserve.engine.errors import ModelConfigError
from seqserve.engine.server.repository import available_versions, discover_models, select_versions


def make_model(repo: Path, name: str, versions: list[str], policy: str = "") -> Path:
    model_dir = repo / name
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(f'name: "{name}"\n{policy}\n')
    for version in versions:
        (model_dir / version).mkdir()
    return model_dir


def test_discover_models(tmp_path: Path) -> None:
    make_model(tmp_path, "with_config", [])
    (tmp_path / "versions_only" / "3").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "not_a_version" / "latest").mkdir(parents=True)
    make_model(tmp_path, ".hidden", ["1"])
    (tmp_path / "stray_file").write_text("x")
    (tmp_path / "a_model").mkdir()
    (tmp_path / "a_model" / "config.pbtxt").write_text("")
    assert [p.name for p in discover_models(tmp_path)] == ["a_model", "versions_only", "with_config"]


def test_available_versions(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", ["10", "2", "1", "0", "007", "abc", "1a"])
    (model_dir / "5").write_text("a file, not a version")
    assert available_versions(model_dir) == [1, 2, 10]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [10]),
        ("version_policy { latest { num_versions: 2 } }", [2, 10]),
        ("version_policy { latest { num_versions: 9 } }", [1, 2, 10]),
        ("version_policy { all { } }", [1, 2, 10]),
        ("version_policy { specific { versions: [10, 1] } }", [1, 10]),
        ("version_policy { specific { versions: [2, 2] } }", [2]),
    ],
)
def test_select_versions(tmp_path: Path, policy: str, expected: list[int]) -> None:
    model_dir = make_model(tmp_path, "m", ["1", "2", "10"], policy)
    cfg = load_model_config(model_dir)
    assert select_versions(model_dir, cfg) == expected


def test_specific_version_missing(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", ["1", "2"], "version_policy { specific { versions: [1, 5] } }")
    with pytest.raises(ModelConfigError) as info:
        select_versions(model_dir, load_model_config(model_dir))
    assert str(info.value) == "version 5 not found for model 'm'"


def test_specific_without_versions(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", ["1"], "version_policy { specific { } }")
    with pytest.raises(ModelConfigError, match="lists no versions for model 'm'"):
        select_versions(model_dir, load_model_config(model_dir))


def test_latest_zero(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", ["1"], "version_policy { latest { } }")
    with pytest.raises(ModelConfigError, match="num_versions must be at least 1 for model 'm'"):
        select_versions(model_dir, load_model_config(model_dir))


def test_no_versions(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", ["0", "x"])
    with pytest.raises(ModelConfigError) as info:
        select_versions(model_dir, load_model_config(model_dir))
    assert str(info.value) == "no version sub-directory found for model 'm'"
