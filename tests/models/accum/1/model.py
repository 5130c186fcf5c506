"""OUT_X = S + IN_X for the model's one implicit state S: input "ACC" with output "ACC_OUT", or a
named state such as "S" (input and output of one name). The new S is the output state; padding
rows get a poison value, which a scheduler that kept a padding row's state would show. RECORD
keeps every batch, as the recording model does."""

import numpy as np

RECORD = []


class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        (name,) = batch.states
        acc = batch.states[name]
        x = batch.inputs["IN_X"]
        RECORD.append(
            {
                "instance": self.instance,
                "size": batch.size,
                "inputs": {k: v.copy() for k, v in batch.inputs.items()},
                "controls": {k: v.copy() for k, v in batch.controls.items()},
                "states": {k: v.copy() for k, v in batch.states.items()},
                "start": batch.start.copy(),
                "end": batch.end.copy(),
                "ready": batch.ready.copy(),
                "corrid": batch.corrid.copy(),
            }
        )
        new = (acc + x).astype(acc.dtype)
        ready = batch.ready.reshape((-1,) + (1,) * (new.ndim - 1))
        out_name = "ACC_OUT" if name == "ACC" else name
        return {"OUT_X": new, out_name: np.where(ready, new, -1000).astype(acc.dtype)}
