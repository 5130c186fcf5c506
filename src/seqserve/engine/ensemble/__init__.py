"""Ensembles (``platform: "ensemble"``): a pipeline of models served as one model. Requests
become step requests that go through each step model's own scheduler (docs/pipelines.md).

- ``plan``: the steps, the tensors they take and write, the checks of a request;
- ``run``: one request in flight, its tensors by iteration (decoupled steps), its answers;
- ``model``: ``EnsembleModel``, what the model table serves (submit, metadata, statistics).
"""

from __future__ import annotations

from seqserve.engine.ensemble.model import EnsembleModel, StepLookup

__all__ = ["EnsembleModel", "StepLookup"]
