"""Stateless element-wise sum and difference of two vectors."""

from __future__ import annotations

import numpy as np

from seqserve.engine import ExecuteBatch


class Model:
    def execute(self, batch: ExecuteBatch) -> dict[str, np.ndarray]:
        a, b = batch.inputs["INPUT0"], batch.inputs["INPUT1"]
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}
