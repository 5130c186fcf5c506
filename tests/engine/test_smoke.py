from __future__ import annotations

import numpy as np

from tests.support.models import recorded, write_model

CFG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "IN_X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT_X" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}
"""


async def test_round_trip(repo, serve):
    write_model(repo, "m", CFG)
    s = await serve()
    r = await s.infer("m", {"IN_X": np.array([[7]], np.int32)}, sequence_id=1, sequence_start=True)
    assert r.outputs["OUT_X"].tolist() == [[7]]
    rec = recorded(s, "m")
    assert rec[0]["controls"]["START"].tolist() == [[1]]
