"""The model the checkpoint tests move between servers ("m": IN_X -> OUT_X, the running sum of
IN_X, in one of three implicit states), its config, and the calls the tests make on it."""

from __future__ import annotations

import numpy as np

from seqserve.engine import InferRequest
from tests.support.models import ctl, in_x_config

INT_CONTROLS = ", ".join(ctl(n, n, "int32_false_true: [ 0, 1 ]") for n in ("START", "END", "READY"))
U64_CORRID = ctl("CORRID", "CORRID", "data_type: TYPE_UINT64")
STR_CORRID = ctl("CORRID", "CORRID", "data_type: TYPE_STRING")

ACC = """
  state [ {
    input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 2 ]
    initial_state { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: "zero" }
  } ]
"""
HIST = """
  state [ {
    input_name: "HIST" output_name: "HIST_OUT" data_type: TYPE_INT32 dims: [ -1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" }
  } ]
"""
WORDS = """
  state [ {
    input_name: "WORDS" output_name: "WORDS_OUT" data_type: TYPE_STRING dims: [ -1 ]
    initial_state { data_type: TYPE_STRING dims: [ 1 ] zero_data: true name: "z" }
  } ]
"""

# OUT_X = the running sum of IN_X, from whichever state the config has: ACC ([2]: the sum and
# the step count), HIST (every input so far, grown by one per step) or WORDS (the inputs as
# strings). SEEN records (corrid, start, ready) of every real row.
MODEL = """
import numpy as np
SEEN = []

class Model:
    def execute(self, batch):
        x = batch.inputs["IN_X"][:, 0]
        for row in np.flatnonzero(batch.ready):
            cid = batch.corrid[row]
            SEEN.append((getattr(cid, "item", lambda: cid)(), int(batch.start[row]), int(batch.ready[row])))
        if "ACC" in batch.states:
            acc = batch.states["ACC"]
            new = acc + np.stack([x, np.ones_like(x)], axis=1)
            return {"OUT_X": new[:, :1].copy(), "ACC_OUT": new}
        if "HIST" in batch.states:
            new = np.concatenate([batch.states["HIST"], x[:, None]], axis=1)
            return {"OUT_X": new.sum(axis=1, keepdims=True).astype(np.int32), "HIST_OUT": new}
        words = batch.states["WORDS"]
        new = np.concatenate([words, np.array([[str(int(v)).encode()] for v in x], dtype=object)], axis=1)
        total = [[sum(int(w) for w in row if w)] for row in new]
        return {"OUT_X": np.array(total, np.int32), "WORDS_OUT": new}
"""


def config(
    *,
    strategy: str = "direct",
    mbs: int = 4,
    state: str = ACC,
    corrid: str = U64_CORRID,
    seq: str = "",
    extra: str = "",
) -> str:
    """Model "m": IN_X -> OUT_X (INT32), a sequence batcher with int controls, ``corrid``,
    ``state`` and more ``seq`` fields; ``extra`` at the top level."""
    scheduling = f"""
sequence_batching {{
  {strategy} {{ }}
  control_input [ {INT_CONTROLS}, {corrid} ]
  {state}
  {seq}
}}"""
    return in_x_config(extra + scheduling, mbs=mbs)


async def call(s, seq_id, value=0, *, start=False, end=False, session=False) -> int:
    req = InferRequest(
        "m", {"IN_X": np.array([[value]], np.int32)}, sequence_id=seq_id, sequence_start=start, sequence_end=end
    )
    req.session = session
    r = await s.enqueue(req)
    return int(r.outputs["OUT_X"].reshape(-1)[0])


def counters(s, model: str = "m") -> tuple[int, int, int, int, int]:
    c = s.model(model).counters()
    return c.sequences_started, c.sequences_ended, c.sequences_expired, c.sequences_released, c.sequences_restored
