"""Many submitting threads at once: no step lost, duplicated or reordered.

1. `_core.Scheduler.submit` called directly from 8 Python threads (trivial accumulator runner).
2. `Server.infer` driven from 8 threads through `asyncio.run_coroutine_threadsafe` onto one loop
   that runs in its own thread (the engine's normal shape: one loop, many producers).

Both use 8 threads x 25 sequences x 20 steps, sequences interleaved step-major inside each
thread, ids mixing ints and strings, 8 slots in total (2 instances x max_batch_size 4), so most
sequences wait in the backlog and move into slots while their later steps keep arriving.
Every reply must equal the running sum of the sequence's inputs (implicit state).
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import Server, _core
from tests.support.models import write_model

THREADS, SEQS, STEPS = 8, 25, 20
TIMEOUT_S = 60.0


def seq_id(j: int) -> int | str:
    return j + 1 if j % 2 else f"seq-{j}"


def value(j: int, step: int) -> int:
    """Encodes (sequence, step) so the model-side record identifies every row."""
    return j * 100 + step + 1


def decode(v: int) -> tuple[int, int]:
    return (v - 1) // 100, (v - 1) % 100


def running_sums(j: int) -> list[int]:
    out, acc = [], 0
    for step in range(STEPS):
        acc += value(j, step)
        out.append(acc)
    return out


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads often so submissions really interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def _run_threads(target: Any) -> None:
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def body(t: int) -> None:
        try:
            barrier.wait()
            target(t)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT_S)
    assert not any(th.is_alive() for th in threads), "a submitting thread hung"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------------- 1. the core


def test_core_submit_from_many_threads(busy_switching: None) -> None:
    lock = threading.Lock()
    done = threading.Event()
    total = THREADS * SEQS * STEPS
    delivered: list[tuple[int, int, bool, bool, Any]] = []  # handle, output, start, end, corrid
    batch_rows: list[list[int]] = []
    failures: list[Any] = []

    def runner(b: _core.Batch) -> bool:
        n = b.size
        x = b.inputs()["IN"].reshape(n)
        s = b.states()["S_IN"].reshape(n)
        out = s + x
        b.set_state(0, out.reshape(n, 1))
        handles, start, end, corrid = b.handles, b.start.tolist(), b.end.tolist(), b.corrid.tolist()
        with lock:
            batch_rows.append([h for h in handles if h])
            for i, h in enumerate(handles):
                if h:
                    delivered.append((h, int(out[i]), start[i], end[i], corrid[i]))
            if len(delivered) >= total:
                done.set()
        return True

    spec = _core.ModelSpec(
        name="core",
        strategy=_core.Strategy.DIRECT,
        max_batch_size=4,
        instance_count=2,
        slots_per_instance=4,
        idle_us=600_000_000,
        inputs=[_core.InputSpec(name="IN", dtype=np.dtype(np.int64), default_shape=[1])],
        states=[
            _core.StateSpec(
                input_name="S_IN",
                output_name="S_OUT",
                dtype=np.dtype(np.int64),
                dims=[1],
                initial=bytes(8),
                initial_dims=[1],
            )
        ],
    )
    sched = _core.Scheduler(
        spec,
        runner=runner,
        on_fail=lambda handles, code, msg: failures.append((handles, code, msg)),
        on_warning=lambda msg: failures.append(msg),
    )
    sched.start()
    keep: dict[int, np.ndarray] = {}  # the core holds raw pointers until the batch is gathered
    meta: dict[int, tuple[int, int]] = {}  # handle -> (sequence, step)
    keep_lock = threading.Lock()

    def submit_all(t: int) -> None:
        mine = range(t * SEQS, (t + 1) * SEQS)
        for step in range(STEPS):
            for j in mine:
                h = j * STEPS + step + 1
                arr = np.array([[value(j, step)]], np.int64)
                with keep_lock:
                    keep[h] = arr
                    meta[h] = (j, step)
                header = _core.RequestHeader(handle=h, sequence_id=seq_id(j), start=step == 0, end=step == STEPS - 1)
                err = sched.submit(header, (arr,))
                assert isinstance(err, int), (h, err)  # accepted: its cancel() token

    try:
        _run_threads(submit_all)
        assert done.wait(TIMEOUT_S), f"only {len(delivered)} of {total} requests ran"
        assert sched.pending_requests() == 0
        assert sched.free_slots() == 8 and sched.backlog_sequences() == 0 and sched.inflight_sequences() == 0
    finally:
        sched.close(True)

    assert not failures
    counts = Counter(h for h, *_ in delivered)
    assert set(counts) == set(meta), "lost or unknown handles"
    assert max(counts.values()) == 1, "a request ran twice"
    per_seq: dict[int, list[tuple[int, int, bool, bool, Any]]] = defaultdict(list)
    for h, out, start, end, corrid in delivered:
        j, step = meta[h]
        per_seq[j].append((step, out, start, end, corrid))
    for j in range(THREADS * SEQS):
        rows = per_seq[j]
        assert [r[0] for r in rows] == list(range(STEPS)), f"sequence {j} out of order"
        assert [r[1] for r in rows] == running_sums(j), f"sequence {j}: state crossed or lost"
        assert [(r[2], r[3]) for r in rows] == [(k == 0, k == STEPS - 1) for k in range(STEPS)]
        assert all(r[4] == seq_id(j) for r in rows), f"sequence {j}: wrong corrid"
    assert max(len(rows) for rows in batch_rows) > 1, "no batching happened"
    for rows in batch_rows:  # one row per sequence per batch
        assert len({meta[h][0] for h in rows}) == len(rows)


# ------------------------------------------------------------- 2. the engine (Server)

ACCUMULATOR = """
import threading
import numpy as np
ROWS = []  # (instance, [input of every real row]) per batch
_lock = threading.Lock()

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        x = batch.inputs["IN_X"]
        out = batch.states["S_IN"] + x
        with _lock:
            ROWS.append((self.instance, [int(v) for v, r in zip(x.reshape(-1), batch.ready) if r]))
        return {"OUT_X": out, "S_OUT": out}
"""

CONFIG = """
name: "acc"
backend: "python"
max_batch_size: 4
instance_group [ { count: 2 kind: KIND_CPU } ]
input [ { name: "IN_X" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUT_X" data_type: TYPE_INT64 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 600000000
  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT64 dims: [ 1 ]
            initial_state { data_type: TYPE_INT64 dims: [ 1 ] zero_data: true name: "zero" } } ]
}
"""


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "closed-loop"])
def test_server_infer_from_many_threads(repo: Path, busy_switching: None, pipelined: bool) -> None:
    """pipelined: each thread sends all 500 of its requests, step-major across its 25 sequences,
    without waiting (per-sequence order comes from run_coroutine_threadsafe's FIFO), so 200
    sequences compete for 8 slots. closed-loop: each thread runs its sequences one at a time and
    waits for every reply before the next step (8 sequences at once: no backlog, tight races
    between completion and the next submit). Waiting on several sequences per thread would
    deadlock by design: backlogged sequences only get a slot when a slot holder ENDs."""
    write_model(repo, "acc", CONFIG, ACCUMULATOR)
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    server = Server(repo)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(TIMEOUT_S)
    mod = sys.modules["seqserve_models.acc.v1"]
    replies: dict[int, list[int]] = {}
    rng = random.Random(0)
    order = {t: rng.sample(range(t * SEQS, (t + 1) * SEQS), SEQS) for t in range(THREADS)}

    def infer(j: int, step: int) -> Future[Any]:
        coro = server.infer(
            "acc",
            {"IN_X": np.array([[value(j, step)]], np.int64)},
            sequence_id=seq_id(j),
            sequence_start=step == 0,
            sequence_end=step == STEPS - 1,
        )
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def drive(t: int) -> None:
        if not pipelined:  # closed loop: one sequence at a time, each step waits for its reply
            for j in order[t]:
                replies[j] = [int(infer(j, s).result(TIMEOUT_S).outputs["OUT_X"][0, 0]) for s in range(STEPS)]
            return
        futs = {(j, s): infer(j, s) for s in range(STEPS) for j in order[t]}  # step-major
        for j in order[t]:
            replies[j] = [int(futs[(j, s)].result(TIMEOUT_S).outputs["OUT_X"][0, 0]) for s in range(STEPS)]

    try:
        _run_threads(drive)
        model = server.model("acc")
        assert model.pending_requests == 0 and model.inflight_sequences == 0
        assert server.statistics("acc")[0].inference_count == THREADS * SEQS * STEPS
    finally:
        asyncio.run_coroutine_threadsafe(server.shutdown(timeout_s=5), loop).result(TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(TIMEOUT_S)
        loop.close()

    for j in range(THREADS * SEQS):
        assert replies[j] == running_sums(j), f"sequence {seq_id(j)}: lost, repeated or reordered step"
    # what the model saw: every (sequence, step) exactly once, in step order, never twice per batch
    seen: dict[int, list[int]] = defaultdict(list)
    where: dict[int, set[int]] = defaultdict(set)
    for instance, values in mod.ROWS:
        seqs = [decode(v)[0] for v in values]
        assert len(set(seqs)) == len(seqs), "two rows of one sequence in a batch"
        for v in values:
            j, step = decode(v)
            seen[j].append(step)
            where[j].add(instance)
    assert {j: seen[j] for j in range(THREADS * SEQS)} == {j: list(range(STEPS)) for j in range(THREADS * SEQS)}
    assert sum(len(v) for _, v in mod.ROWS) == THREADS * SEQS * STEPS
    assert all(len(w) == 1 for w in where.values()), "a sequence moved between instances"
