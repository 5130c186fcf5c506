"""A loaded model version (``LoadedModel``, in ``loaded``) and the parts it owns:

- ``execution``: how its instances execute (isolated or not, execute timeout, inline bound),
  read from the config's parameters;
- ``instances``: the backend and its instances, started (in this process or isolated);
- ``spec``: config -> the core's scheduler spec (once, at load);
- ``validation``: one request checked against the config and laid out for the core (a
  ``RequestHeader`` and the input buffers);
- ``delivery``: replies, responders, ordered release, futures and callbacks;
- ``inline``: the event loop's side of inline execution;
- ``watchdog``: the execute timeout of in-process instances;
- ``reports``: metadata, statistics, metrics counters;
- ``sequence_views``: the sequence API (list, show, end);
- ``checkpoints``: a sequence's state out of its slot, and back into a free one.
"""

from __future__ import annotations

from seqserve.engine.model.loaded import LoadedModel
from seqserve.engine.request import InferRequest, SequenceId
from seqserve.engine.responses import InferResult

__all__ = ["InferRequest", "InferResult", "LoadedModel", "SequenceId"]
