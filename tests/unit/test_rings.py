"""The shared-memory transport between front-end workers and the engine (issue 27), in one
process: record layout and order, back-pressure, wrap-around, slab blocks, wake-ups, and the
checks an engine makes on what a worker wrote. Several processes: tests/integration/test_rings_processes.py."""

from __future__ import annotations

import os
import threading

import pytest

from seqserve.engine._core import RequestHeader, ShmRegion

MASK64 = (1 << 64) - 1


def small_region(**kwargs: object) -> ShmRegion:
    settings: dict[str, object] = {
        "workers": 2,
        "request_slots": 8,
        "reply_slots": 8,
        "slab_classes": [(64, 4), (128, 2)],
    }
    settings.update(kwargs)
    return ShmRegion(**settings)  # type: ignore[arg-type]


def test_a_request_record_carries_every_field_in_order() -> None:
    region = small_region(request_slots=64)
    headers = [
        RequestHeader(handle=1, sequence_id=42, start=True, timeout_us=7, rows=3, priority=-2),
        RequestHeader(handle=2, sequence_id="caller-ä-id", end=True, session=True),
        RequestHeader(handle=3),
    ]
    block = region.alloc(0, True, 24)
    inputs = [(1, block, 24, [2, 3]), (0, block, 8, ())]
    for h in headers:
        assert region.push_request(0, 5, h, inputs)
    assert region.push_request(0, 5, RequestHeader(handle=9), cancel=True)
    assert region.pending(0, True) == 4
    for h in headers:
        record = region.pop_request(0)
        assert record is not None
        target, cancel, got, got_inputs = record
        assert (target, cancel) == (5, False)
        assert repr(got) == repr(h)
        assert got_inputs == [(1, block, 24, (2, 3)), (0, block, 8, ())]
    cancel_record = region.pop_request(0)
    assert cancel_record is not None
    assert cancel_record[:2] == (5, True) and cancel_record[2].handle == 9 and cancel_record[3] == []
    assert region.pop_request(0) is None
    assert region.pop_request(1) is None  # each worker has its own ring


def test_a_cancel_record_says_so() -> None:
    region = small_region()
    assert region.push_request(1, 3, RequestHeader(handle=77), cancel=True)
    record = region.pop_request(1)
    assert record is not None
    assert record[:2] == (3, True) and record[2].handle == 77


def test_a_full_ring_refuses_and_loses_nothing() -> None:
    region = small_region(request_slots=4)
    assert all(region.push_request(0, 0, RequestHeader(handle=h)) for h in range(1, 5))
    assert not region.push_request(0, 0, RequestHeader(handle=5))  # back-pressure, not overwrite
    popped = region.pop_request(0)
    assert popped is not None and popped[2].handle == 1
    assert region.push_request(0, 0, RequestHeader(handle=5))
    handles = []
    while (record := region.pop_request(0)) is not None:
        handles.append(record[2].handle)
    assert handles == [2, 3, 4, 5]


def test_the_rings_wrap_around_many_laps() -> None:
    region = small_region(request_slots=8, reply_slots=8)
    sent = received = 0
    replies = []
    for lap in range(500):
        for _ in range(lap % 8 + 1):  # 1..8 at a time: every fill level, every start position
            sent += 1
            assert region.push_request(1, 0, RequestHeader(handle=sent, sequence_id=f"s{sent}"))
            assert region.push_reply(1, sent, final=sent % 2 == 0)
        while (record := region.pop_request(1)) is not None:
            received += 1
            assert record[2].handle == received and record[2].sequence_id == f"s{received}"
        while (reply := region.pop_reply(1)) is not None:
            replies.append(reply)
    assert received == sent
    assert [r[0] for r in replies] == list(range(1, sent + 1))
    assert [r[1] for r in replies] == [h % 2 == 0 for h in range(1, sent + 1)]


def test_a_record_too_large_for_a_cell_is_an_error_not_a_loss() -> None:
    region = small_region(request_record_bytes=128)
    with pytest.raises(ValueError, match="request record of"):
        region.push_request(0, 0, RequestHeader(handle=1, sequence_id="x" * 200))
    with pytest.raises(ValueError, match="at most 16 dims"):
        region.push_request(0, 0, RequestHeader(handle=1), [(0, 0, 0, [1] * 17)])
    assert region.pending(0, True) == 0


def test_replies_carry_outputs_errors_and_finality() -> None:
    region = small_region(reply_record_bytes=128)
    block = region.alloc(1, False, 100)
    assert block and region.push_reply(1, 11, [(0, block, 100, [25])])
    assert region.push_reply(1, 12, code=3, error="bad input", final=False)
    assert region.push_reply(1, 13, code=1, error="é" * 500)  # cut to what fits in a cell
    assert region.pop_reply(1) == (11, True, 0, None, [(0, block, 100, (25,))])
    assert region.pop_reply(1) == (12, False, 3, "bad input", [])
    reply = region.pop_reply(1)
    assert reply is not None and reply[:3] == (13, True, 1)
    assert reply[3] is not None and 0 < len(reply[3]) < 500 and set(reply[3]) <= {"é", "\ufffd"}
    assert region.pop_reply(1) is None and region.pop_reply(0) is None


def test_slab_blocks_are_reused_and_run_out() -> None:
    region = small_region()  # per direction: 4 blocks of 64 bytes, 2 of 128
    small = [region.alloc(0, True, 10) for _ in range(4)]
    assert len(set(small)) == 4 and all(small)
    spill = region.alloc(0, True, 64)  # the 64-byte class is empty: a larger block serves
    assert spill and spill not in small
    last = region.alloc(0, True, 128)
    assert last and last not in [*small, spill]
    assert region.alloc(0, True, 1) == 0  # exhausted: back-pressure
    assert region.alloc(0, True, 129) == 0  # larger than any class
    assert region.alloc(0, False, 64)  # the other direction has its own blocks
    assert region.alloc(1, True, 64)  # and so has every other worker
    assert region.free(0, True, small[2])
    assert not region.free(0, True, small[2])  # a second free is refused
    assert not region.free(0, True, small[0] + 8)  # not a block's start
    assert not region.free(0, False, small[0])  # not that pool's block
    assert region.alloc(0, True, 64) == small[2]  # the freed block comes back
    assert region.free_blocks(0, True) == 0


def test_tensor_bytes_are_read_in_place() -> None:
    region = small_region()
    block = region.alloc(0, True, 48)
    region.buffer(block, 48)[:] = bytes(range(48))
    assert region.push_request(0, 1, RequestHeader(handle=1), [(0, block, 48, [48])])
    record = region.pop_request(0)
    assert record is not None
    ((_, offset, nbytes, _),) = record[3]
    assert bytes(region.buffer(offset, nbytes)) == bytes(range(48))


def test_write_and_read_copy_buffers_in_and_out_of_a_block() -> None:
    import numpy as np

    region = small_region()
    block = region.alloc(0, True, 64)
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    region.write(block, values)
    copy = region.read(block, values.nbytes)
    assert isinstance(copy, bytearray)
    assert np.array_equal(np.frombuffer(copy, np.float32).reshape(3, 4), values)
    region.write(block, b"\x00" * values.nbytes)  # the copy is its own
    assert np.array_equal(np.frombuffer(copy, np.float32).reshape(3, 4), values)
    assert bytes(region.buffer(block, 4)) == b"\x00" * 4
    region.write(block, b"")  # nothing to copy: no check of the offset either
    with pytest.raises((BufferError, ValueError)):  # numpy says ValueError
        region.write(block, values[:, ::2])  # not C-contiguous
    with pytest.raises(ValueError, match="outside the region"):
        region.write(region.size, b"x")
    with pytest.raises(ValueError, match="outside the region"):
        region.read(region.size - 2, 4)
    with pytest.raises(TypeError):
        region.write(block, 7)  # not a buffer


def test_the_engine_skips_records_whose_tensors_are_not_the_workers_blocks() -> None:
    region = small_region()
    mine = region.alloc(1, True, 64)
    free_block = mine + 64  # the class's next block, not allocated
    others = region.alloc(0, True, 64)
    for bad in [(0, others, 8, [8]), (0, mine, 65, [65]), (0, free_block, 8, [8]), (0, 1 << 40, 8, [8])]:
        assert region.push_request(1, 0, RequestHeader(handle=1), [bad])
    assert region.push_request(1, 0, RequestHeader(handle=2), [(0, mine, 64, [64])])
    record = region.pop_request(1)  # the malformed ones are skipped
    assert record is not None and record[2].handle == 2
    assert region.counters()["malformed"] == 4


def test_a_sleeping_engine_is_woken_by_a_push() -> None:
    region = small_region()
    assert not region.wait_requests(0.01)  # nothing: times out
    pusher = threading.Timer(0.05, lambda: region.push_request(1, 0, RequestHeader(handle=1)))
    pusher.start()
    try:
        assert region.wait_requests(60.0)
    finally:
        pusher.join()
    assert region.wait_requests(0.0)  # a record is there: no sleep at all
    counters = region.counters()
    # Woken by the eventfd, or (on a busy machine) the push came first and no sleep was needed.
    assert counters["engine_sleeps"] >= 1 and counters["engine_wakes"] in (0, 1)


def test_a_sleeping_worker_is_woken_by_a_reply() -> None:
    region = small_region()
    assert not region.wait_replies(0, 0.01)
    replier = threading.Timer(0.05, lambda: region.push_reply(0, 9))
    replier.start()
    try:
        assert region.wait_replies(0, 60.0)
    finally:
        replier.join()
    assert region.pop_reply(0) == (9, True, 0, None, [])
    assert region.counters()["worker_wakes"] in (0, 1)


def test_threads_of_one_worker_push_concurrently() -> None:
    region = small_region(request_slots=64, slab_classes=[(64, 32)])
    sums: list[int] = []
    producer = threading.Thread(
        target=lambda: sums.append(region.stress_produce(1, 0, 20_000, threads=4, tensor_bytes=64))
    )
    producer.start()
    result = region.stress_consume(4, 80_000, sleep=True)
    producer.join()
    assert result["records"] == 80_000
    assert result["misordered"] == 0 and result["bad"] == 0
    assert int(result["checksum"]) == sums[0] & MASK64
    assert result["timed_out_with_work"] == 0
    assert region.free_blocks(1, True) == 32


def test_attach_maps_the_same_region() -> None:
    region = small_region()
    other = ShmRegion.attach(region.fd, region.engine_eventfd, region.worker_eventfds)
    assert other.size == region.size and other.workers == 2
    assert other.push_request(1, 0, RequestHeader(handle=5))
    record = region.pop_request(1)
    assert record is not None and record[2].handle == 5


def test_bad_regions_and_geometries_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        ShmRegion(workers=1, request_slots=6)
    with pytest.raises(ValueError, match="multiples of 64"):
        ShmRegion(workers=1, slab_classes=[(100, 4)])
    with pytest.raises(ValueError, match="grow in size"):
        ShmRegion(workers=1, slab_classes=[(128, 4), (64, 4)])
    with pytest.raises(ValueError, match="workers"):
        ShmRegion(workers=0)
    region = small_region()
    with pytest.raises(ValueError, match="2 workers needs as many"):
        ShmRegion.attach(region.fd, region.engine_eventfd, region.worker_eventfds[:1])
    fd = os.memfd_create("not-a-region")
    try:
        os.ftruncate(fd, 1 << 16)
        with pytest.raises(ValueError, match="bad magic"):
            ShmRegion.attach(fd, region.engine_eventfd, region.worker_eventfds)
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="not an open descriptor"):
        ShmRegion.attach(10_000, region.engine_eventfd, region.worker_eventfds)
    with pytest.raises(IndexError):
        region.pop_request(2)


def test_an_empty_string_id_stays_a_string_id() -> None:
    region = small_region()
    assert region.push_request(0, 0, RequestHeader(handle=1, sequence_id=""))
    record = region.pop_request(0)
    assert record is not None and record[2].sequence_id == ""


def test_an_event_loop_arms_the_reply_wakeup() -> None:
    region = small_region()
    efd = region.worker_eventfds[0]
    assert not region.arm_reply_wakeup(0)  # nothing yet: the eventfd will tell
    assert region.push_reply(0, 1)
    assert os.read(efd, 8) == (1).to_bytes(8, "little")  # readable: the engine rang
    assert region.pop_reply(0) is not None
    assert region.push_reply(0, 2)  # not armed since: no eventfd write
    with pytest.raises(BlockingIOError):
        os.read(efd, 8)
    assert region.arm_reply_wakeup(0)  # a reply is already there: drain it now
