"""Running sum kept by the model in a dict keyed by correlation id.

Shows the control tensors: START resets a sequence's sum, END forgets it, READY is 0 on
padding rows. A sequence that times out without END leaves its entry behind until its id
starts again, which is why implicit state (see `accumulator`) is the better tool.
"""

from __future__ import annotations

import numpy as np

from seqserve.engine import ExecuteBatch


class Model:
    def initialize(self, ctx: object) -> None:
        self.sums: dict[int, float] = {}

    def execute(self, batch: ExecuteBatch) -> dict[str, np.ndarray]:
        c = batch.controls
        start, end, ready, corrid = c["START"][:, 0], c["END"][:, 0], c["READY"][:, 0], c["CORRID"][:, 0]
        x = batch.inputs["INPUT"][:, 0]
        out = np.zeros((batch.size, 1), np.float32)
        for i in range(batch.size):
            if not ready[i]:
                continue
            key = int(corrid[i])
            total = (0.0 if start[i] else self.sums.get(key, 0.0)) + float(x[i])
            out[i, 0] = total
            if end[i]:
                self.sums.pop(key, None)
            else:
                self.sums[key] = total
        return {"OUTPUT": out}
