"""Squares each sample: the feature step of the `energy` ensemble."""

from __future__ import annotations

import numpy as np

from seqserve.engine import ExecuteBatch


class Model:
    def execute(self, batch: ExecuteBatch) -> dict[str, np.ndarray]:
        x = batch.inputs["SAMPLE"]
        return {"SQUARED": x * x}
