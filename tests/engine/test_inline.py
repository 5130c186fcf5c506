"""Inline execution (docs/architecture.md, "Inline execution"): cheap in-process Python models run
their batches on the event loop's thread once promoted; slow ones stay on (or go back to) their
executor threads; every strategy keeps its results, order, cancellation and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, Server, _core
from seqserve.engine.request import InferRequest
from tests.support.checks import expect_error, wait_until_sync
from tests.support.models import ctl, model_module, write_model

# Records the thread of every batch; sleeps DELAY seconds in execute when set (tests change it).
THREAD_MODEL = """
import threading, time
import numpy as np
DELAY = 0.0
THREADS = []

class Model:
    def execute(self, batch):
        THREADS.append(threading.get_ident())
        if DELAY:
            time.sleep(DELAY)
        return {"OUTPUT": batch.inputs["INPUT"].copy()}
"""

# Running sum per sequence (implicit state), so a step that ran out of order or twice shows.
SUM_MODEL = """
import numpy as np

class Model:
    def execute(self, batch):
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        return {"OUTPUT": total, "SUM_OUT": total}
"""

SUM_STATE = """
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" } } ]
"""

IO = """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def inline_param(us: int) -> str:
    return f'parameters [ {{ key: "inline_max_batch_us" value: {{ string_value: "{us}" }} }} ]'


def sequence_config(name: str, kind: str, *, mbs: int = 8, instances: int = 2, us: int = 100_000) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
{IO}
sequence_batching {{
  max_sequence_idle_microseconds: 50000000
  {kind} {{ }}
  {SUM_STATE}
}}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
{inline_param(us)}
"""


def plain_config(name: str, *, mbs: int = 8, batching: str = "dynamic_batching { }", us: int = 100_000) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
{IO}
{batching}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
{inline_param(us)}
"""


def x(v: float) -> np.ndarray:
    return np.array([[v]], np.float32)


async def run_sequences(server: Server, model: str, n: int, steps: int) -> None:
    """`n` sequences of `steps` steps at once; every reply checked against the running sum."""

    async def one(i: int) -> None:
        total = 0.0
        for k in range(steps):
            r = await server.infer(
                model, {"INPUT": x(k + i)}, sequence_id=i + 1, sequence_start=k == 0, sequence_end=k == steps - 1
            )
            total += k + i
            assert float(r.outputs["OUTPUT"][0, 0]) == total, (i, k)

    await asyncio.gather(*(one(i) for i in range(n)))


async def while_inline(server: Server, model: str, work: Callable[[], Awaitable[None]], *, seq: bool = False) -> None:
    """Promotes the model, then runs `work` (which checks its own results) and checks that batches
    ran inline. A stall of this shared machine can demote a cheap model (a long GC pass), or keep
    the event loop from its callback for longer than the executors' fallback wait (the OS
    descheduling the loop's thread): then the round runs again, up to 3 times."""
    for _ in range(3):
        await promote(server, model, seq=seq)
        before = server.model(model).inline_stats
        await work()
        after = server.model(model).inline_stats
        if after.demotions == before.demotions and after.inline_batches > before.inline_batches:
            return
    raise AssertionError(f"{model} ran no batch inline in 3 rounds: {_show(after)}")


def batches_counted(server: Server, model: str) -> int:
    st = server.model(model).inline_stats
    return st.inline_batches + st.thread_batches


async def promote(server: Server, model: str, *, seq: bool = False) -> None:
    """Cheap batches until the core runs the model inline, and until every one of them is
    counted (a batch's cost is noted after its reply has gone: a count read at once may lag)."""
    counted = batches_counted(server, model)
    for sent in range(40):
        if server.model(model).inline_stats.active:
            for _ in range(500):
                if batches_counted(server, model) >= counted + sent:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"{model}: {sent} batches sent, not all counted")
        # a sequence model: one-step sequences, which hold no slot afterwards
        await server.infer(model, {"INPUT": x(1)}, sequence_id=999 if seq else 0, sequence_start=seq, sequence_end=seq)
    raise AssertionError(f"{model} was never promoted: {server.model(model).inline_stats.promotions}")


@pytest.mark.parametrize("kind", ["direct", "oldest"])
async def test_sequences_run_inline_with_their_state_and_order(repo: Path, serve: Any, kind: str) -> None:
    write_model(repo, "s", sequence_config("s", kind), SUM_MODEL)
    server = await serve()
    await while_inline(server, "s", lambda: run_sequences(server, "s", 16, 30), seq=True)
    stats = server.model("s").statistics()
    assert stats["fail"]["count"] == 0
    assert stats["success"]["count"] == stats["inference_count"] >= 16 * 30


async def test_inline_batches_run_on_the_event_loop_thread(repo: Path, serve: Any) -> None:
    write_model(repo, "t", plain_config("t"), THREAD_MODEL)
    server = await serve()
    threads = model_module("t").THREADS

    async def work() -> None:
        threads.clear()
        results = await asyncio.gather(*(server.infer("t", {"INPUT": x(i)}) for i in range(32)))
        assert [float(r.outputs["OUTPUT"][0, 0]) for r in results] == list(range(32))

    await while_inline(server, "t", work)
    assert set(threads) == {threading.get_ident()}
    # Requests submitted in one loop iteration batch together: 4 batches of max_batch_size 8.
    assert len(threads) == 4


async def test_a_slow_model_is_never_promoted(repo: Path, serve: Any) -> None:
    write_model(repo, "t", plain_config("t", us=1000), THREAD_MODEL)
    server = await serve()
    model_module("t").DELAY = 0.005  # 5 ms per batch, over the 1 ms bound
    for i in range(12):
        r = await server.infer("t", {"INPUT": x(i)})
        assert float(r.outputs["OUTPUT"][0, 0]) == i
    # counted once the executor has finished the batch, just after its reply was posted
    wait_until_sync(lambda: server.model("t").inline_stats.thread_batches == 12, "12 batches counted")
    st = server.model("t").inline_stats
    assert (st.active, st.promotions, st.inline_batches) == (False, 0, 0)
    assert threading.get_ident() not in model_module("t").THREADS


async def test_a_model_that_turns_slow_is_demoted_after_four_slow_batches(repo: Path, serve: Any) -> None:
    write_model(repo, "t", plain_config("t", us=20_000), THREAD_MODEL)
    server = await serve()
    await promote(server, "t")
    mod = model_module("t")
    mod.DELAY = 0.04  # 40 ms, over the 20 ms bound (not 8 times over)
    mod.THREADS.clear()
    before = server.model("t").inline_stats
    for i in range(7):
        r = await server.infer("t", {"INPUT": x(i)})
        assert float(r.outputs["OUTPUT"][0, 0]) == i
    st = server.model("t").inline_stats
    assert (st.active, st.demotions) == (False, before.demotions + 1)
    assert st.inline_batches == before.inline_batches + 4  # the loop paid for 4 slow batches
    assert st.slow_batches == before.slow_batches + 4
    assert mod.THREADS[:4] == [threading.get_ident()] * 4
    assert threading.get_ident() not in mod.THREADS[4:]


async def test_a_batch_far_over_the_bound_demotes_at_once(repo: Path, serve: Any) -> None:
    write_model(repo, "t", plain_config("t", us=10_000), THREAD_MODEL)
    server = await serve()
    await promote(server, "t")
    mod = model_module("t")
    mod.DELAY = 0.1  # 100 ms: over 8 times the 10 ms bound
    before = server.model("t").inline_stats
    for i in range(3):
        r = await server.infer("t", {"INPUT": x(i)})
        assert float(r.outputs["OUTPUT"][0, 0]) == i
    st = server.model("t").inline_stats
    assert (st.active, st.demotions) == (False, before.demotions + 1)
    assert st.inline_batches == before.inline_batches + 1


async def test_an_occasional_slow_batch_does_not_demote(repo: Path, serve: Any) -> None:
    """A cheap model whose batch runs over now and then (another thread took the GIL mid-batch,
    a GC pass) stays inline: 3 slow batches among 30 are under the 4-in-32 window."""
    write_model(repo, "t", plain_config("t", us=20_000), THREAD_MODEL)
    server = await serve()
    await promote(server, "t")
    mod = model_module("t")
    before = server.model("t").inline_stats
    for i in range(30):
        mod.DELAY = 0.03 if i % 10 == 5 else 0.0  # 30 ms, over the 20 ms bound, 3 times
        r = await server.infer("t", {"INPUT": x(i)})
        assert float(r.outputs["OUTPUT"][0, 0]) == i
    st = server.model("t").inline_stats
    if st.demotions != before.demotions:  # a stall of this shared machine added slow batches
        assert st.slow_batches - before.slow_batches >= 4, _show(st)
        return
    assert st.active
    assert st.slow_batches == before.slow_batches + 3
    # every batch ran, inline unless the executor took one the loop came late for (a stall)
    ran = st.inline_batches + st.thread_batches - before.inline_batches - before.thread_batches
    assert ran == 30, _show(st)
    assert st.inline_batches - before.inline_batches >= 27, _show(st)


async def test_dynamic_batching_keeps_results_and_priority_levels(repo: Path, serve: Any) -> None:
    write_model(repo, "d", plain_config("d"), THREAD_MODEL)
    server = await serve()

    async def work() -> None:
        for _ in range(3):
            results = await asyncio.gather(*(server.infer("d", {"INPUT": x(i)}) for i in range(50)))
            assert [float(r.outputs["OUTPUT"][0, 0]) for r in results] == list(range(50))

    await while_inline(server, "d", work)


async def test_a_batch_delay_is_left_to_the_executor(repo: Path, serve: Any) -> None:
    batching = "dynamic_batching { max_queue_delay_microseconds: 20000 preferred_batch_size: [ 4 ] }"
    write_model(repo, "d", plain_config("d", batching=batching), THREAD_MODEL)
    server = await serve()
    await promote(server, "d")
    threads = model_module("d").THREADS
    threads.clear()
    t0 = time.perf_counter()
    r = await server.infer("d", {"INPUT": x(3)})  # alone: waits out the delay
    assert float(r.outputs["OUTPUT"][0, 0]) == 3
    assert time.perf_counter() - t0 >= 0.015
    assert threads and threading.get_ident() not in threads
    results = await asyncio.gather(*(server.infer("d", {"INPUT": x(i)}) for i in range(4)))  # a preferred size
    assert [float(r.outputs["OUTPUT"][0, 0]) for r in results] == [0, 1, 2, 3]


async def test_stateless_model_keeps_fifo_order(repo: Path, serve: Any) -> None:
    write_model(repo, "n", plain_config("n", mbs=0, batching="").replace("dims: [ 1 ]", "dims: [ 1, 1 ]"), THREAD_MODEL)
    server = await serve()
    threads = model_module("n").THREADS

    got: list[float] = []

    async def work() -> None:
        got.clear()
        threads.clear()

        async def one(i: int) -> None:
            r = await server.infer("n", {"INPUT": x(i)})
            got.append(float(r.outputs["OUTPUT"][0, 0]))

        await asyncio.gather(*(one(i) for i in range(40)))

    # A stall of this shared machine can hand a batch to an executor thread (see while_inline);
    # the model has two instances, so that batch may then finish out of order: such a round
    # runs again.
    for _ in range(3):
        await while_inline(server, "n", work)
        if threads.count(threading.get_ident()) == 40:  # all 40 on the loop (passes resumed after their budget)
            break
    else:
        raise AssertionError(f"no round ran all 40 on the loop: {len(threads)} batches, on {set(threads)}")
    assert got == [float(i) for i in range(40)]  # one request per batch, in submit order


async def test_preserve_ordering_holds_inline(repo: Path, serve: Any) -> None:
    batching = "dynamic_batching { preserve_ordering: true }"
    write_model(repo, "d", plain_config("d", batching=batching), THREAD_MODEL)
    server = await serve()

    async def work() -> None:
        order: list[int] = []

        def on_response(i: int) -> Any:
            return lambda result, final: order.append(i)

        for i in range(30):
            server.model("d").submit_streaming(_request(i), on_response(i))
        for _ in range(500):
            if len(order) == 30:
                break
            await asyncio.sleep(0.01)
        assert order == list(range(30))

    await while_inline(server, "d", work)


def _show(st: _core.InlineStats) -> str:
    return ", ".join(f"{k}={getattr(st, k)}" for k in dir(st) if not k.startswith("_"))


def _request(i: int, model: str = "d") -> InferRequest:
    return InferRequest(model=model, inputs={"INPUT": x(i)})


async def test_a_request_cancelled_before_the_loop_runs_it_is_answered_cancelled(repo: Path, serve: Any) -> None:
    write_model(repo, "d", plain_config("d"), THREAD_MODEL)
    server = await serve()
    await promote(server, "d")
    model = server.model("d")
    keep = model.submit(_request(1))
    gone = model.submit(_request(2))
    gone.cancel()  # before this iteration ends: the inline pass drops it
    assert float((await keep).outputs["OUTPUT"][0, 0]) == 1
    assert gone.cancelled()
    await asyncio.sleep(0.05)
    assert model.counters().failure["CANCELED"] == 1
    assert model.open_requests == 0


async def test_cancelling_a_sequence_request_ends_its_sequence(repo: Path, serve: Any) -> None:
    controls = ", ".join(ctl(n, n, "int32_false_true: [ 0, 1 ]") for n in ("START", "READY"))
    cfg = sequence_config("s", "direct", mbs=2, instances=1).replace(
        "direct { }", f"control_input [ {controls} ]\n  direct {{ }}"
    )
    write_model(repo, "s", cfg, SUM_MODEL)
    server = await serve()
    await promote(server, "s", seq=True)
    model = server.model("s")
    first = model.submit(_seq_request(5, 1, start=True))
    second = model.submit(_seq_request(5, 2))
    second.cancel()
    assert float((await first).outputs["OUTPUT"][0, 0]) == 1
    await asyncio.sleep(0.05)
    await expect_error(server.infer("s", {"INPUT": x(1)}, sequence_id=5), Code.INVALID_ARG)


def _seq_request(corrid: int, v: float, *, start: bool = False) -> InferRequest:
    return InferRequest(model="s", inputs={"INPUT": x(v)}, sequence_id=corrid, sequence_start=start)


async def test_shutdown_answers_every_request(repo: Path) -> None:
    write_model(repo, "d", plain_config("d"), THREAD_MODEL)
    server = Server(repo)
    await server.start()
    await promote(server, "d")
    futures = [server.model("d").submit(_request(i)) for i in range(20)]
    await server.shutdown(timeout_s=5)
    for i, f in enumerate(futures):
        try:
            assert float(f.result().outputs["OUTPUT"][0, 0]) == i
        except InferenceError as e:
            assert e.code == Code.UNAVAILABLE


async def test_inline_can_be_turned_off(repo: Path, serve: Any) -> None:
    write_model(repo, "off", plain_config("off", us=0), THREAD_MODEL)
    write_model(repo, "dflt", plain_config("dflt").replace(inline_param(100_000), ""), THREAD_MODEL)
    server = await serve(inline_max_batch_us=0)
    for model in ("off", "dflt"):
        for i in range(12):
            await server.infer(model, {"INPUT": x(i)})
        st = server.model(model).inline_stats
        assert (st.max_batch_us, st.active, st.inline_batches) == (0, False, 0)


async def test_a_bad_bound_fails_the_load(repo: Path, serve: Any) -> None:
    write_model(repo, "bad", plain_config("bad").replace('"100000"', '"fast"'), THREAD_MODEL)
    server = await serve()
    (entry,) = server.repository_index()
    assert entry["state"] == "UNAVAILABLE"
    assert "parameter 'inline_max_batch_us' must be a whole number of microseconds" in entry["reason"]


def test_the_executor_takes_work_the_loop_never_came_for() -> None:
    """Correctness never depends on run_ready_inline being called: in inline mode an executor
    takes queued work once the loop has left it for a while."""
    spec = _core.ModelSpec(
        name="m",
        strategy=_core.Strategy.DYNAMIC,
        max_batch_size=4,
        inputs=[_core.InputSpec(name="X", dtype=np.dtype(np.float32), default_shape=[1])],
    )
    done = threading.Semaphore(0)
    sched = _core.Scheduler(
        spec, runner=lambda b: done.release() or True, on_fail=lambda *a: None, on_warning=lambda m: None
    )
    sched.configure_inline(1_000_000, 2)
    sched.start()
    keep = [np.ones((1, 1), np.float32) for _ in range(4)]
    try:
        for h in (1, 2):  # two cheap batches on the executor: promoted
            sched.submit(_core.RequestHeader(handle=h), (keep[h],))
            assert done.acquire(timeout=10)
        wait_until_sync(lambda: sched.inline_stats().active, "promotion")
        t0 = time.perf_counter()
        sched.submit(_core.RequestHeader(handle=3), (keep[3],))  # nobody calls run_ready_inline
        assert done.acquire(timeout=10)
        assert time.perf_counter() - t0 >= 0.005  # it waited for the loop first
        # the executor counts a batch after its runner returns, so after `done` is released
        wait_until_sync(lambda: sched.inline_stats().thread_batches == 3, "the third batch counted")
        assert sched.inline_stats().inline_batches == 0
    finally:
        sched.close(force=True)
