"""Implicit-state buffers of isolated models: the state crosses shared memory, so it takes the
copy path; ``next_state`` gives a new array and ``use_same_buffer_for_input_output`` writes
(kept without being returned) come back as the output state."""

from __future__ import annotations

import sys

import pytest

from tests.support.models import write_model
from tests.support.state_model import MODEL, config, drive, step

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process isolation is tested on Linux")

ISOLATED = 'parameters [ { key: "isolation" value: { string_value: "process" } } ]'


@pytest.mark.parametrize(("mode", "same"), [("next", False), ("inplace_noreturn", True)])
async def test_isolated_running_sums(repo, serve, mode, same):
    write_model(repo, "m", config("direct", same=same) + ISOLATED, MODEL.format(mode=mode))
    s = await serve()
    await drive(s, 5, nseq=6)


async def test_isolated_same_buffer_failed_batch_keeps_nothing(repo, serve):
    # Unlike in-process models, an isolated model's in-place writes live in the child's copy:
    # a failed batch leaves the state as it was.
    write_model(repo, "m", config("direct", same=True) + ISOLATED, MODEL.format(mode="inplace"))
    s = await serve()
    await step(s, 1, 3, start=True)
    with pytest.raises(Exception, match="failed after writing"):
        await step(s, 1, -1000)
    assert await step(s, 1, 1, end=True) == [[4] * 5]
