"""A loaded model version, in parts a reader can hold in their head:

- ``spec``: config -> the core's scheduler spec (once, at load);
- ``validation``: one request checked against the config, laid out for the core;
- ``delivery``: replies, responders, ordered release, futures and callbacks;
- ``loaded``: ``LoadedModel``, which ties them to the backend instances and the core.
"""

from __future__ import annotations

from seqserve.engine.model.loaded import LoadedModel
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult

__all__ = ["InferRequest", "InferResult", "LoadedModel", "SequenceId"]
