"""The engine's side of the worker rings (issue 27): what the region gives the engine (the client
key, resetting a dead worker's area, large tensors) and the RingFeeder, the compiled path that
drains request rings into the schedulers and writes replies without Python per request."""

from __future__ import annotations

import numpy as np

from seqserve.engine._core import RequestHeader, ShmRegion


def test_a_request_record_carries_its_client_key() -> None:
    region = ShmRegion(workers=1, request_slots=8, reply_slots=8, slab_classes=[(64, 4)])
    assert region.push_request(0, 3, RequestHeader(handle=1, sequence_id="s", session=True), client=0xDEADBEEF)
    assert region.push_request(0, 3, RequestHeader(handle=2, client=7))  # the header's, by default
    first, second = region.pop_request(0), region.pop_request(0)
    assert first is not None and second is not None
    assert first[2].client == 0xDEADBEEF and first[2].sequence_id == "s"
    assert second[2].client == 7


def test_reset_worker_lays_out_its_area_afresh_and_leaves_the_others() -> None:
    region = ShmRegion(workers=2, request_slots=8, reply_slots=8, slab_classes=[(64, 4)])
    blocks = region.free_blocks(0, True)
    for w in (0, 1):
        region.alloc(w, True, 64)
        region.alloc(w, False, 64)
        assert region.push_request(w, 1, RequestHeader(handle=5))
        assert region.push_reply(w, 5)
    region.reset_worker(0)
    assert region.pending(0, True) == 0 and region.pending(0, False) == 0
    assert region.free_blocks(0, True) == blocks and region.free_blocks(0, False) == blocks
    assert region.pending(1, True) == 1 and region.pending(1, False) == 1
    assert region.free_blocks(1, True) == blocks - 1
    # the reset area works as a new one
    assert region.push_request(0, 1, RequestHeader(handle=6))
    record = region.pop_request(0)
    assert record is not None and record[2].handle == 6


def test_a_32_mib_tensor_crosses_with_the_default_slab_classes() -> None:
    region = ShmRegion(workers=1)
    nbytes = 32 << 20
    block = region.alloc(0, True, nbytes)
    assert block != 0
    data = np.arange(nbytes // 4, dtype=np.uint32)
    np.frombuffer(region.buffer(block, nbytes), dtype=np.uint32)[:] = data
    assert region.push_request(0, 1, RequestHeader(handle=1), [(0, block, nbytes, [nbytes // 4])])
    attached = ShmRegion.attach(region.fd, region.engine_eventfd, region.worker_eventfds)
    record = attached.pop_request(0)
    assert record is not None
    (_, offset, size, shape) = record[3][0]
    assert (size, shape) == (nbytes, (nbytes // 4,))
    assert np.array_equal(np.frombuffer(attached.buffer(offset, size), dtype=np.uint32), data)
    assert attached.free(0, True, offset)
