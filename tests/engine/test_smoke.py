from __future__ import annotations

import numpy as np

from tests.support.models import copy_model, recorded


async def test_round_trip(repo, serve):
    copy_model(repo, "recording", "m")
    s = await serve()
    r = await s.infer("m", {"IN_X": np.array([[7]], np.int32)}, sequence_id=1, sequence_start=True)
    assert r.outputs["OUT_X"].tolist() == [[7]]
    rec = recorded(s, "m")
    assert rec[0]["controls"]["START"].tolist() == [[1]]
