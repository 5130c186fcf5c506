"""seqserve: an inference server for stateful models, compatible with Triton's sequence batcher."""

from __future__ import annotations

__version__ = "0.1.0"
