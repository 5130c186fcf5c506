"""The engine's side of the worker rings (issue 27): what the region gives the engine (the client
key, resetting a dead worker's area, large tensors) and the RingFeeder, the compiled path that
drains request rings into the schedulers and writes replies without Python per request."""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import RequestHeader, RingFeeder, ShmRegion
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.model.loaded import LoadedModel
from seqserve.engine.request import InferRequest


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


# ------------------------------------------------------------------ the feeder, on real models

ACCUMULATOR = Path(__file__).resolve().parents[2] / "src/seqserve/examples/models/accumulator"

STATELESS_CONFIG = """
name: "double"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
STATELESS_MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        x = batch.inputs["X"]
        return {"Y": x * 2, "N": np.full((x.shape[0], 1), x.shape[0], np.int32)}
"""
FAILING_MODEL = """
class Model:
    def execute(self, batch):
        raise RuntimeError("no luck")
"""


def load(
    tmp_path: Path, config: str, model_py: str, name: str, loop: asyncio.AbstractEventLoop | None = None
) -> LoadedModel:
    model_dir = tmp_path / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config)
    (model_dir / "1" / "model.py").write_text(model_py)
    cfg = text_format.Parse(config, mc.ModelConfig())
    return LoadedModel(cfg, version=1, model_dir=model_dir, loop=loop or asyncio.new_event_loop())


def accumulator(
    tmp_path: Path, strategy: str, name: str = "accumulator", mbs: int = 8, backlog: str = ""
) -> LoadedModel:
    config = (ACCUMULATOR / "config.pbtxt").read_text().replace('name: "accumulator"', f'name: "{name}"')
    config = config.replace("max_batch_size: 8", f"max_batch_size: {mbs}")
    config = config.replace("direct { }", strategy + backlog)
    return load(tmp_path, config, (ACCUMULATOR / "1" / "model.py").read_text(), name)


class Worker:
    """A worker's side of the rings, as a front-end process would drive them."""

    def __init__(self, region: ShmRegion, index: int) -> None:
        self.region = region
        self.index = index

    def tensor(self, array: np.ndarray, index: int = 0) -> tuple[int, int, int, list[int]]:
        block = self.region.alloc(self.index, True, max(array.nbytes, 1))
        assert block != 0
        np.frombuffer(self.region.buffer(block, array.nbytes), dtype=array.dtype)[:] = array.ravel()
        return (index, block, array.nbytes, list(array.shape))

    def send(
        self, target: int, header: RequestHeader, *arrays: np.ndarray, cancel: bool = False, slow: bool = False
    ) -> None:
        inputs = [self.tensor(a, i) for i, a in enumerate(arrays)]
        assert self.region.push_request(self.index, target, header, inputs, cancel=cancel, slow=slow)

    def step(
        self, target: int, handle: int, sequence: int, value: float, *, start: bool = False, end: bool = False
    ) -> None:
        header = RequestHeader(handle=handle, sequence_id=sequence, start=start, end=end)
        self.send(target, header, np.array([[value]], np.float32))

    def replies(self, count: int, timeout: float = 30.0) -> dict[int, tuple[int, str | None, list[np.ndarray]]]:
        """handle -> (code, error, outputs as arrays); every block read is freed."""
        got: dict[int, tuple[int, str | None, list[np.ndarray]]] = {}
        deadline = time.monotonic() + timeout
        while len(got) < count:
            reply = self.region.pop_reply(self.index)
            if reply is None:
                assert time.monotonic() < deadline, f"worker {self.index}: {len(got)} of {count} replies"
                self.region.wait_replies(self.index, 0.1)
                continue
            handle, final, code, error, outputs = reply
            assert final and handle not in got
            arrays = []
            for index, offset, nbytes, shape in outputs:
                dtype = np.float32 if index == 0 else np.int32
                arrays.append(np.frombuffer(bytes(self.region.buffer(offset, nbytes)), dtype=dtype).reshape(shape))
                assert self.region.free(self.index, False, offset)
            got[handle] = (code, error, arrays)
        return got


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def feeder_for(region: ShmRegion) -> RingFeeder:
    return RingFeeder(region, spin_us=20)


@contextlib.contextmanager
def served(
    tmp_path: Path, config: str, model_py: str, name: str, target: int
) -> Iterator[tuple[LoadedModel, RingFeeder, Worker]]:
    """A model served on the compiled path of a one-worker region, closed afterwards."""
    region = ShmRegion(workers=1)
    feeder = feeder_for(region)
    model = load(tmp_path, config, model_py, name)
    try:
        assert model.serve_rings(feeder, target)
        yield model, feeder, Worker(region, 0)
    finally:
        feeder.close()
        model.close(force=True)


@pytest.mark.parametrize(
    "strategy", ["direct { }", "oldest { max_candidate_sequences: 32 preferred_batch_size: [ 4 ] }"]
)
def test_sequences_from_two_workers_sum_right_on_the_compiled_path(tmp_path: Path, strategy: str) -> None:
    region = ShmRegion(workers=2)
    feeder = feeder_for(region)
    model = accumulator(tmp_path, strategy)
    try:
        assert model.serve_rings(feeder, 1)
        workers = [Worker(region, 0), Worker(region, 1)]
        sums = dict.fromkeys(range(1, 13), 0.0)
        for step in range(6):
            for seq in sums:
                value = float(seq * 10 + step)
                # the steps of one sequence alternate between the workers
                workers[(seq + step) % 2].step(1, step * 100 + seq, seq, value, start=step == 0, end=step == 5)
                sums[seq] += value
            replies: dict[int, tuple[int, str | None, list[np.ndarray]]] = {}
            for w in (0, 1):
                expected = sum(1 for seq in sums if (seq + step) % 2 == w)
                replies.update(workers[w].replies(expected))
            for seq, total in sums.items():
                code, error, outputs = replies[step * 100 + seq]
                assert (code, error) == (0, None)
                assert outputs[0].shape == (1, 1) and outputs[0][0, 0] == total
        assert feeder.inflight(0) == 0 and feeder.inflight(1) == 0
        assert region.free_blocks(0, True) == ShmRegion(workers=1).free_blocks(0, True)
        stats = model.statistics()
        counters = feeder.counters()
        assert counters["fast"] == 72 and counters["replies"] == 72 and counters["slow"] == 0
        assert stats["success"]["count"] == 72 and stats["inference_count"] == 72
    finally:
        feeder.close()
        model.close(force=True)


def test_a_stateless_model_answers_each_request_its_own_rows(tmp_path: Path) -> None:
    region = ShmRegion(workers=2)
    feeder = feeder_for(region)
    model = load(tmp_path, STATELESS_CONFIG, STATELESS_MODEL, "double")
    try:
        assert model.serve_rings(feeder, 4)
        workers = [Worker(region, 0), Worker(region, 1)]
        sent = {}
        for handle in range(1, 41):
            rows = 1 + handle % 3
            x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + handle
            workers[handle % 2].send(4, RequestHeader(handle=handle, rows=rows), x)
            sent[handle] = x
        for w in (0, 1):
            for handle, (code, error, outputs) in workers[w].replies(20).items():
                assert (code, error) == (0, None)
                assert np.array_equal(outputs[0], sent[handle] * 2)
                assert outputs[1].shape == (sent[handle].shape[0], 1)
    finally:
        feeder.close()
        model.close(force=True)


def test_one_batch_of_in_process_and_ring_requests_gives_each_its_own_rows(tmp_path: Path) -> None:
    # Oldest-free dynamic batching held until 8 rows are there: the 5 requests share one batch
    # (every reply's N is 8), and the ring rows are found among the in-process ones in C++.
    config = STATELESS_CONFIG.replace(
        "dynamic_batching { }", "dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 5000000 }"
    )
    loop = asyncio.new_event_loop()
    model = load(tmp_path, config, STATELESS_MODEL, "double", loop)
    region = ShmRegion(workers=1)
    feeder = feeder_for(region)
    try:
        assert model.serve_rings(feeder, 4)
        worker = Worker(region, 0)
        x = {n: np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 10 * n for n in range(1, 6)}
        worker.send(4, RequestHeader(handle=1, rows=2), x[2])
        in_process = model.submit(InferRequest(model="double", inputs={"X": x[1]}))
        worker.send(4, RequestHeader(handle=3, rows=1), x[1] + 5)
        wait_for(lambda: feeder.counters()["fast"] == 2)
        in_process_too = model.submit(InferRequest(model="double", inputs={"X": x[3][:1]}))
        worker.send(4, RequestHeader(handle=5, rows=3), x[3])
        got = worker.replies(3)
        assert {h: (code, error) for h, (code, error, _) in got.items()} == dict.fromkeys((1, 3, 5), (0, None))
        assert np.array_equal(got[1][2][0], x[2] * 2) and np.array_equal(got[3][2][0], (x[1] + 5) * 2)
        assert np.array_equal(got[5][2][0], x[3] * 2)
        assert all(np.array_equal(outputs[1], np.full((len(outputs[0]), 1), 8)) for _, _, outputs in got.values())
        for fut, sent in ((in_process, x[1]), (in_process_too, x[3][:1])):
            result = loop.run_until_complete(asyncio.wait_for(fut, 30))
            assert np.array_equal(result.outputs["Y"], sent * 2) and result.outputs["N"][0, 0] == 8
        assert model.statistics()["execution_count"] == 1
    finally:
        feeder.close()
        model.close(force=True)
        loop.close()


def test_refusals_come_back_as_the_in_process_path_words_them(tmp_path: Path) -> None:
    region = ShmRegion(workers=1)
    feeder = feeder_for(region)
    model = accumulator(tmp_path, "direct { }", mbs=1, backlog="\n  max_backlog_sequences: 1")
    worker = Worker(region, 0)
    try:
        assert model.serve_rings(feeder, 2)
        request = InferRequest(model="accumulator", inputs={"INPUT": np.array([[1]], np.float32)}, sequence_id=999)
        with pytest.raises(InferenceError) as refused:
            model.submit(request)
        worker.step(2, 1, 999, 1.0)  # not started
        code, error, outputs = worker.replies(1)[1]
        assert (code, error, outputs) == (int(refused.value.code), refused.value.message, [])
        # two slots (two instances of one row each) and one backlog place: a fourth START is refused
        for seq in (1, 2, 3, 4):
            worker.step(2, 10 + seq, seq, 1.0, start=True)
        got = worker.replies(3)
        assert got[11][0] == 0 and got[12][0] == 0
        code, error, _ = got[14]
        request = InferRequest(
            model="accumulator", inputs={"INPUT": np.array([[1]], np.float32)}, sequence_id=4, sequence_start=True
        )
        with pytest.raises(InferenceError) as full:
            model.submit(request)
        assert (code, error) == (int(full.value.code), full.value.message) and code == int(Code.UNAVAILABLE)
        worker.step(2, 21, 1, 1.0, end=True)  # a slot frees: the backlogged sequence 3 runs
        got = worker.replies(2)
        assert got[21][0] == 0 and got[13][0] == 0
        # statistics count the two refusals of each path alike
        assert feeder.refused(2) == 2 and model.statistics()["fail"]["count"] == 4
    finally:
        feeder.close()
        model.close(force=True)


def test_a_bad_record_is_answered_and_never_trusted(tmp_path: Path) -> None:
    region = ShmRegion(workers=1)
    feeder = feeder_for(region)
    model = load(tmp_path, STATELESS_CONFIG, STATELESS_MODEL, "double")
    worker = Worker(region, 0)
    try:
        assert model.serve_rings(feeder, 4)
        worker.send(4, RequestHeader(handle=1, rows=1), np.zeros((1, 3), np.float32))  # dims [2]
        worker.send(4, RequestHeader(handle=2, rows=2), np.zeros((1, 2), np.float32))  # rows disagree
        worker.send(4, RequestHeader(handle=3, rows=1), np.zeros((1, 2), np.int32))  # right size, wrong... fine
        worker.send(4, RequestHeader(handle=4, rows=1))  # no input
        got = worker.replies(4)
        for handle in (1, 2, 4):
            code, error, _ = got[handle]
            assert code == int(Code.INVALID_ARG) and error is not None and "does not match its config" in error
        assert got[3][0] == 0  # the engine checks sizes; dtypes are the worker's to check
        assert region.free_blocks(0, True) == ShmRegion(workers=1).free_blocks(0, True)
    finally:
        feeder.close()
        model.close(force=True)


def test_a_failing_model_answers_its_ring_rows_with_the_error(tmp_path: Path) -> None:
    config = STATELESS_CONFIG.replace('"double"', '"failing"')
    with served(tmp_path, config, FAILING_MODEL, "failing", 5) as (_, feeder, worker):
        worker.send(5, RequestHeader(handle=7), np.zeros((1, 2), np.float32))
        code, error, _ = worker.replies(1)[7]
        assert code == int(Code.INTERNAL) and error is not None and "no luck" in error
        assert feeder.inflight(0) == 0


def test_a_cancel_record_takes_a_waiting_request_out(tmp_path: Path) -> None:
    region = ShmRegion(workers=1)
    feeder = feeder_for(region)
    model = accumulator(tmp_path, "direct { }", mbs=1)  # two slots
    worker = Worker(region, 0)
    try:
        assert model.serve_rings(feeder, 3)
        for seq in (1, 2, 3):
            worker.step(3, 10 + seq, seq, 1.0, start=True)
        got = worker.replies(2)
        assert set(got) == {11, 12}
        wait_for(lambda: feeder.inflight(0) == 1)  # sequence 3 waits in the backlog
        worker.send(3, RequestHeader(handle=13), cancel=True)
        code, _, outputs = worker.replies(1)[13]
        assert code == int(Code.CANCELLED) and outputs == []
        assert feeder.inflight(0) == 0 and feeder.counters()["cancels"] == 1
    finally:
        feeder.close()
        model.close(force=True)


def test_records_the_compiled_path_does_not_take_wait_for_python(tmp_path: Path) -> None:
    region = ShmRegion(workers=2)
    feeder = feeder_for(region)
    model = load(tmp_path, STATELESS_CONFIG, STATELESS_MODEL, "double")
    try:
        assert model.serve_rings(feeder, 4)
        feeder.add_target(9, None, fast=False)
        workers = [Worker(region, 0), Worker(region, 1)]
        x = np.ones((1, 2), np.float32)
        workers[0].send(9, RequestHeader(handle=1, sequence_id="s", session=True, client=5), x)
        workers[1].send(77, RequestHeader(handle=2), x)  # a target nobody registered
        workers[1].send(4, RequestHeader(handle=3), x, slow=True)  # the worker asks for Python
        workers[0].send(9, RequestHeader(handle=1), cancel=True)
        ready, _, _ = select.select([feeder.slow_fd], [], [], 30)
        assert ready
        records: list[tuple[int, int, bool, RequestHeader, list[tuple[int, int, int, tuple[int, ...]]], int]] = []
        deadline = time.monotonic() + 30
        while len(records) < 4 and time.monotonic() < deadline:
            records += feeder.take_slow()
        by_handle = {(r[0], r[3].handle, r[2]): r for r in records}
        worker, target, cancel, header, inputs, client = by_handle[(0, 1, False)]
        assert (target, cancel, client, header.sequence_id, header.session) == (9, False, 5, "s", True)
        assert [(i, n, shape) for i, _, n, shape in inputs] == [(0, 8, (1, 2))]
        assert by_handle[(1, 2, False)][1] == 77 and by_handle[(1, 3, False)][1] == 4
        assert by_handle[(0, 1, True)][4] == []
        for worker, _, _, _, inputs, _ in records:  # Python frees what it took
            for _, offset, _, _ in inputs:
                assert region.free(worker, True, offset)
        assert feeder.take_slow() == []
    finally:
        feeder.close()
        model.close(force=True)


def test_a_full_reply_ring_and_no_free_reply_block_lose_nothing(tmp_path: Path) -> None:
    region = ShmRegion(workers=1, reply_slots=2, slab_classes=[(64, 12)])
    feeder = feeder_for(region)
    model = load(tmp_path, STATELESS_CONFIG, STATELESS_MODEL, "double")
    worker = Worker(region, 0)
    try:
        assert model.serve_rings(feeder, 4)
        for handle in range(1, 11):
            worker.send(4, RequestHeader(handle=handle), np.full((1, 2), handle, np.float32))
            wait_for(lambda: region.free_blocks(0, True) > 0)  # inputs come back as requests are answered
        wait_for(lambda: feeder.counters()["replies"] == 10)
        assert feeder.queued_replies(0) > 0 and feeder.counters()["deferred"] > 0
        got = worker.replies(10)
        assert sorted(got) == list(range(1, 11))
        for handle, (code, _, outputs) in got.items():
            assert code == 0 and np.array_equal(outputs[0], np.full((1, 2), 2 * handle, np.float32))
        assert feeder.queued_replies(0) == 0
    finally:
        feeder.close()
        model.close(force=True)


def test_a_32_mib_tensor_goes_through_the_compiled_path(tmp_path: Path) -> None:
    config = STATELESS_CONFIG.replace("dims: [ 2 ]", "dims: [ -1 ]")
    with served(tmp_path, config, STATELESS_MODEL, "double", 4) as (_, _, worker):
        x = np.arange(8 << 20, dtype=np.float32).reshape(1, -1)
        worker.send(4, RequestHeader(handle=1), x)
        code, error, outputs = worker.replies(1, timeout=60)[1]
        assert (code, error) == (0, None)
        assert outputs[0].nbytes == 32 << 20 and np.array_equal(outputs[0], x * 2)


def test_a_dead_workers_area_is_reset_once_nothing_of_it_is_in_flight(tmp_path: Path) -> None:
    region = ShmRegion(workers=2)
    feeder = feeder_for(region)
    model = load(tmp_path, STATELESS_CONFIG, STATELESS_MODEL, "double")
    dead, alive = Worker(region, 1), Worker(region, 0)
    try:
        assert model.serve_rings(feeder, 4)
        for handle in range(1, 6):
            dead.send(4, RequestHeader(handle=handle), np.zeros((1, 2), np.float32))
        feeder.forget_worker(1)
        wait_for(lambda: feeder.inflight(1) == 0)
        feeder.reset_worker(1)
        assert region.pending(1, False) == 0 and feeder.queued_replies(1) == 0
        assert region.free_blocks(1, False) == region.free_blocks(0, False)
        fresh = Worker(region, 1)  # the replacement uses the same handles again
        fresh.send(4, RequestHeader(handle=1), np.ones((1, 2), np.float32))
        alive.send(4, RequestHeader(handle=1), np.ones((1, 2), np.float32))
        assert fresh.replies(1)[1][0] == 0 and alive.replies(1)[1][0] == 0
    finally:
        feeder.close()
        model.close(force=True)


def test_an_output_no_block_can_hold_is_answered_with_an_error(tmp_path: Path) -> None:
    region = ShmRegion(workers=1, slab_classes=[(64, 8)])
    feeder = feeder_for(region)
    config = STATELESS_CONFIG.replace(
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }',
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 64 ] }',
    )
    model = load(
        tmp_path, config, STATELESS_MODEL.replace('"Y": x * 2', '"Y": np.zeros((x.shape[0], 64), np.float32)'), "big"
    )
    worker = Worker(region, 0)
    try:
        assert model.serve_rings(feeder, 4)
        worker.send(4, RequestHeader(handle=1), np.zeros((1, 2), np.float32))
        code, error, outputs = worker.replies(1)[1]
        assert code == int(Code.INTERNAL) and error is not None and "largest block" in error and outputs == []
        worker.send(4, RequestHeader(handle=2), np.zeros((1, 2), np.float32))  # the worker is not stuck
        assert worker.replies(1)[2][0] == int(Code.INTERNAL)
    finally:
        feeder.close()
        model.close(force=True)


# ------------------------------------------------------------ batches of ring rows only

INLINE_ALWAYS = '\nparameters: { key: "inline_max_batch_us" value: { string_value: "10000000" } }\n'
INLINE_NEVER = '\nparameters: { key: "inline_max_batch_us" value: { string_value: "0" } }\n'


@pytest.mark.parametrize("inline", [INLINE_ALWAYS, INLINE_NEVER], ids=["inline", "never"])
def test_a_cheap_models_ring_batches_run_on_the_drain_thread_once_promoted(tmp_path: Path, inline: str) -> None:
    # Inline mode (inline_policy.h) on the compiled path: the drain thread that submitted the
    # records runs the batches itself, as the event loop does for in-process requests.
    config = (ACCUMULATOR / "config.pbtxt").read_text() + inline
    model_py = (ACCUMULATOR / "1" / "model.py").read_text()
    with served(tmp_path, config, model_py, "accumulator", 1) as (model, _, worker):
        total = 0.0
        for step in range(40):  # one step at a time: a batch each
            total += step
            worker.step(1, step + 1, 9, float(step), start=step == 0, end=step == 39)
            code, error, outputs = worker.replies(1)[step + 1]
            assert (code, error) == (0, None) and outputs[0][0, 0] == total
        # a batch's cost is noted after its reply has gone: wait until all 40 are counted
        wait_for(lambda: model.inline_stats.inline_batches + model.inline_stats.thread_batches == 40)
        stats = model.inline_stats
        if inline == INLINE_ALWAYS:  # promoted after 8 cheap batches on the executor
            assert stats.promotions == 1 and stats.inline_batches >= 40 - 8 - 1
        else:
            assert stats.inline_batches == 0 and stats.thread_batches == 40


def test_a_ring_only_batch_with_an_output_of_the_wrong_type_answers_internal(tmp_path: Path) -> None:
    model_py = STATELESS_MODEL.replace('"Y": x * 2', '"Y": (x * 2).astype(np.float64)')
    with served(tmp_path, STATELESS_CONFIG, model_py, "double", 4) as (model, feeder, worker):
        worker.send(4, RequestHeader(handle=1), np.zeros((1, 2), np.float32))
        code, error, _ = worker.replies(1)[1]
        assert code == int(Code.INTERNAL)
        assert error is not None and "produced output 'Y' as float64, but its config says FP32" in error
        assert feeder.inflight(0) == 0 and model.statistics()["fail"]["count"] == 1


@pytest.mark.parametrize(
    "change",
    [
        ('"Y": x * 2', '"Y": np.repeat(x * 2, 2, axis=1)[:, ::2]'),  # a strided view
        ("return {", "import types; return types.MappingProxyType({"),  # a Mapping, not a dict
    ],
    ids=["strided", "mapping"],
)
def test_a_ring_only_batch_converts_what_the_core_call_cannot_take_as_it_is(
    tmp_path: Path, change: tuple[str, str]
) -> None:
    # complete_batch takes a dict of C-contiguous arrays of the configured dtype; anything else
    # (a strided view, a Mapping that is not a dict) goes the checked, converting way
    model_py = STATELESS_MODEL.replace(*change)
    if change[0] == "return {":
        model_py = model_py.replace("np.int32)}", "np.int32)})")
    with served(tmp_path, STATELESS_CONFIG, model_py, "double", 4) as (model, feeder, worker):
        worker.send(4, RequestHeader(handle=1), np.array([[1.5, -2.0]], np.float32))
        code, error, outputs = worker.replies(1)[1]
        assert (code, error) == (0, None) and outputs[0].tolist() == [[3.0, -4.0]]
        assert feeder.inflight(0) == 0 and model.statistics()["success"]["count"] == 1


def test_a_ring_only_batch_whose_execute_hangs_past_close_is_answered_unavailable(tmp_path: Path) -> None:
    release = tmp_path / "release"
    model_py = f"""
import pathlib, time

class Model:
    def execute(self, batch):
        while not pathlib.Path({str(release)!r}).exists():
            time.sleep(0.01)
        return {{"Y": batch.inputs["X"], "N": batch.inputs["X"][:, :1].astype("int32")}}
"""
    with served(tmp_path, STATELESS_CONFIG, model_py, "double", 4) as (model, feeder, worker):
        try:
            worker.send(4, RequestHeader(handle=1), np.zeros((1, 2), np.float32))
            wait_for(lambda: model.statistics()["execution_count"] == 0 and feeder.counters()["fast"] == 1)
            time.sleep(0.2)  # in execute by now (nothing else can answer it)
            name = model.instance_names[0]
            assert model.close(force=True, timeout_s=0.5) == [name]
            code, error, _ = worker.replies(1)[1]
            assert code == int(Code.UNAVAILABLE)
            assert error == f"model 'double' instance '{name}' did not return from execute within the exit timeout"
        finally:
            release.touch()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="thread names are read from Linux's /proc")
def test_the_cores_threads_carry_their_role_in_their_names(tmp_path: Path) -> None:
    def names() -> list[str]:
        return [(task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir()]

    region = ShmRegion(workers=1)
    feeder = feeder_for(region)
    model = accumulator(tmp_path, "direct { }")
    try:
        wait_for(lambda: {"seqserve-exec", "seqserve-reaper", "seqserve-drain"} <= set(names()))
    finally:
        feeder.close()
        model.close(force=True)
