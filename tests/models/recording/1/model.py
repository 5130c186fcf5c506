"""A batch-level model that records what it saw, for scheduler tests: each execute call appends one
dict per batch to RECORD; IN_<x> is echoed as OUT_<x> (any other input as OUTPUT)."""

RECORD = []


class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
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
        out = {}
        for name, value in batch.inputs.items():
            out["OUT_" + name[3:] if name.startswith("IN_") else "OUTPUT"] = value.copy()
        return out
