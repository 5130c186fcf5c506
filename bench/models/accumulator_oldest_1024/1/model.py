"""Running sum over a sequence. The server keeps the sum between steps (implicit state) and
resets it to zero on START, so the model is one line of arithmetic over the whole batch."""

from __future__ import annotations

import numpy as np

from seqserve.engine import ExecuteBatch


class Model:
    def execute(self, batch: ExecuteBatch) -> dict[str, np.ndarray]:
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total, "SUM_OUT": total}
