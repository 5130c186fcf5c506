"""Where things are: the checkout, the tests, the bundled demo models, the shared test models."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
DEMO_REPO = ROOT / "src" / "seqserve" / "examples" / "models"
BRIEF = TESTS / "data" / "brief_configs"
MODELS = TESTS / "models"  # shared test models: <name>/config.pbtxt and <name>/1/model.py
