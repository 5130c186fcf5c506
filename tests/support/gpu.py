"""Helpers of tests/gpu: models copied from bench/models with their config edited."""

from __future__ import annotations

import shutil
from pathlib import Path

BENCH_MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"


def copy_model(repo: Path, source: str, name: str, *, replace: dict[str, str]) -> Path:
    """bench/models/<source> as <name> in ``repo``, with config text replaced."""
    dst = repo / name
    shutil.copytree(BENCH_MODELS / source, dst)
    cfg = (dst / "config.pbtxt").read_text().replace(f'name: "{source}"', f'name: "{name}"')
    for old, new in replace.items():
        assert old in cfg, old
        cfg = cfg.replace(old, new)
    (dst / "config.pbtxt").write_text(cfg)
    return dst
