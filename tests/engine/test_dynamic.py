"""The dynamic batcher for stateless models, through the in-process API (reference section 9).

Batch sizes are made deterministic with TRITONSERVER_DELAY_SCHEDULER=N (the first batch is held
until N requests are queued), never with sleeps. Queue policies need requests to sit in the
queue while nothing runs: the model blocks on a gate for a marked request (IN_X == -1), the test
waits until that batch is inside the model, queues the rest, then opens the gate.
"""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np
import pytest

from seqserve.engine import Code
from tests.support.checks import expect_error, wait_until
from tests.support.models import in_x_config, write_model

# ----------------------------------------------------------------------------- helpers

GATED_MODEL = """
import queue
import threading
import numpy as np

RECORD = []
ENTERED = queue.Queue()
GATE = threading.Event()

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        x = batch.inputs["IN_X"]
        RECORD.append({"instance": self.instance, "size": batch.size, "x": x[:, 0].tolist(),
                       "shape": x.shape})
        ENTERED.put(self.instance)
        if (x == -1).any():
            GATE.wait(20)
        return {"OUT_X": x.copy()}
"""


def config(*, mbs: int = 4, dyn: str = "", extra: str = "", dims: str = "[ 1 ]") -> str:
    return in_x_config(f"{extra}\ndynamic_batching {{ {dyn} }}", mbs=mbs, dims=dims)


def mod(name: str = "m"):
    return sys.modules[f"seqserve_models.{name}.v1"]


def sizes() -> list[int]:
    return [b["size"] for b in mod().RECORD]


def xs() -> list[list[int]]:
    return [b["x"] for b in mod().RECORD]


def x_in(value: int | list[int], rows: int = 1) -> dict[str, np.ndarray]:
    row = value if isinstance(value, list) else [value]
    return {"IN_X": np.array([row] * rows, np.int32)}


async def send(s, value, *, rows: int = 1, **kwargs) -> asyncio.Task:
    """Submit without waiting for the result; returns once the request has been queued."""
    task = asyncio.ensure_future(s.infer("m", x_in(value, rows), **kwargs))
    await asyncio.sleep(0)  # the task runs up to its submit
    return task


async def results(tasks, timeout: float = 10.0) -> list[list[int]]:
    out = await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    return [r.outputs["OUT_X"][:, 0].tolist() for r in out]


async def entered(timeout: float = 5.0) -> int:
    """Wait until the model has started executing a batch; returns the instance."""
    return await asyncio.to_thread(mod().ENTERED.get, timeout=timeout)


async def blocked(s, **kwargs) -> asyncio.Task:
    """A request that sits in the model until the gate opens."""
    task = await send(s, -1, **kwargs)
    await entered()
    return task


def release() -> None:
    mod().GATE.set()


# -------------------------------------------------------------------- batch forming (§9)


async def test_batches_fill_up_to_max_batch_size(repo, serve, monkeypatch):
    write_model(repo, "m", config(), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    m = s.model("m")
    assert m.strategy_name == "dynamic"
    assert list(m.config.dynamic_batching.preferred_batch_size) == [4]  # normalized default
    tasks = [await send(s, v) for v in range(1, 7)]
    assert await results(tasks) == [[v] for v in range(1, 7)]
    assert sizes() == [4, 2]
    assert xs() == [[1, 2, 3, 4], [5, 6]]  # FIFO
    st = s.statistics("m")[0]
    assert st.execution_count == 2 and st.inference_count == 6
    assert {b.batch_size: b.compute_infer.count for b in st.batch_stats} == {4: 1, 2: 1}


async def test_preferred_size_sent_before_the_delay(repo, serve, monkeypatch):
    write_model(
        repo, "m", config(dyn="preferred_batch_size: [ 2, 3 ] max_queue_delay_microseconds: 20000000"), GATED_MODEL
    )
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    tasks = [await send(s, v) for v in range(1, 7)]
    assert await results(tasks, timeout=5) == [[v] for v in range(1, 7)]  # long before 20 s
    assert sizes() == [3, 3]


async def test_largest_preferred_prefix_when_more_are_queued(repo, serve, monkeypatch):
    # 5 queued, preferred {2}, max 4: the prefix of 2 goes; then 2 more; the last one waits
    # for its delay (1 s: far longer than the first four take, even on a loaded machine).
    write_model(repo, "m", config(dyn="preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000000"), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "5")
    s = await serve()
    t0 = time.monotonic()
    tasks = [await send(s, v) for v in range(1, 6)]
    assert await results(tasks[:4], timeout=5) == [[1], [2], [3], [4]]
    assert not tasks[4].done()
    assert await results(tasks[4:], timeout=5) == [[5]]
    assert time.monotonic() - t0 >= 0.99
    assert sizes() == [2, 2, 1]


async def test_preferred_size_applies_with_zero_delay(repo, serve, monkeypatch):
    # Triton (GetDynamicBatch): delay_is_exceeded is false when the delay is 0, so a preferred
    # prefix found in the queue is sent first; the rest follows at once as the next batch.
    write_model(repo, "m", config(dyn="preferred_batch_size: [ 2 ]"), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [await send(s, v) for v in (1, 2, 3)]
    assert await results(tasks) == [[1], [2], [3]]
    assert sizes() == [2, 1]


async def test_lone_request_waits_for_the_delay(repo, serve):
    write_model(repo, "m", config(dyn="max_queue_delay_microseconds: 300000"), GATED_MODEL)
    s = await serve()
    t0 = time.monotonic()
    assert await results([await send(s, 7)], timeout=5) == [[7]]
    assert time.monotonic() - t0 >= 0.29


async def test_no_delay_sends_at_once(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    t0 = time.monotonic()
    for v in range(5):
        assert await results([await send(s, v)]) == [[v]]
    assert time.monotonic() - t0 < 2
    assert sizes() == [1] * 5


async def test_reaching_a_preferred_size_ends_the_wait(repo, serve):
    write_model(
        repo, "m", config(dyn="preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 20000000"), GATED_MODEL
    )
    s = await serve()
    first = await send(s, 1)
    await asyncio.sleep(0.1)
    assert not first.done()
    second = await send(s, 2)
    assert await results([first, second], timeout=5) == [[1], [2]]
    assert sizes() == [2]


async def test_requests_with_several_rows(repo, serve, monkeypatch):
    write_model(repo, "m", config(), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    s = await serve()
    tasks = [await send(s, 1, rows=2), await send(s, 2, rows=3), await send(s, 3)]
    # 2 + 3 > 4: the first goes alone; then 3 + 1 fill a batch.
    assert await results(tasks) == [[1, 1], [2, 2, 2], [3]]
    assert sizes() == [2, 4]
    assert xs() == [[1, 1], [2, 2, 2, 3]]
    st = s.statistics("m")[0]
    assert st.inference_count == 6 and st.execution_count == 2


async def test_shapes_must_match_within_a_batch(repo, serve, monkeypatch):
    write_model(repo, "m", config(dims="[ -1 ]"), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [await send(s, [1, 1]), await send(s, [2, 2, 2]), await send(s, [3, 3]), await send(s, [4, 4])]
    assert await results(tasks) == [[1], [2], [3], [4]]
    # Batch forming stops at the first mismatch.
    assert [b["shape"] for b in mod().RECORD] == [(1, 2), (1, 3), (2, 2)]


# ------------------------------------------------------------------------ priorities (§9)


async def test_priority_levels_order_the_queue(repo, serve, monkeypatch):
    dyn = "priority_levels: 2 default_priority_level: 2"
    write_model(repo, "m", config(mbs=2, dyn=dyn), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "6")
    s = await serve()
    tasks = [
        await send(s, 1),  # 0: the default level (2)
        await send(s, 2, priority=2),
        await send(s, 3, priority=1),
        await send(s, 4, priority=9),  # out of range: the default level
        await send(s, 5, priority=1),
        await send(s, 6, priority=2),
    ]
    assert await results(tasks) == [[v] for v in range(1, 7)]
    assert xs() == [[3, 5], [1, 2], [4, 6]]


async def test_default_priority_level_for_unprioritized_requests(repo, serve, monkeypatch):
    dyn = "priority_levels: 3 default_priority_level: 1"
    write_model(repo, "m", config(mbs=1, dyn=dyn), GATED_MODEL)
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    s = await serve()
    tasks = [await send(s, 1, priority=3), await send(s, 2, priority=2), await send(s, 3), await send(s, 4, priority=1)]
    assert await results(tasks) == [[1], [2], [3], [4]]
    assert xs() == [[3], [4], [2], [1]]


# ---------------------------------------------------------------- queue policies (§9)


async def test_max_queue_size_refuses_at_enqueue(repo, serve):
    write_model(repo, "m", config(dyn="default_queue_policy { max_queue_size: 2 }"), GATED_MODEL)
    s = await serve()
    running = await blocked(s)  # executing: not in the queue
    queued = [await send(s, 1), await send(s, 2)]
    await expect_error(
        s.infer("m", x_in(3), request_id="r-3"), Code.UNAVAILABLE, "[request id: r-3] Exceeds maximum queue size"
    )
    await expect_error(s.infer("m", x_in(4)), Code.UNAVAILABLE, "[request id: <id_unknown>] Exceeds maximum queue size")
    release()
    assert await results([running, *queued]) == [[-1], [1], [2]]
    assert await results([await send(s, 5)]) == [[5]]  # room again


async def test_max_queue_size_per_priority_level(repo, serve):
    dyn = """
      priority_levels: 2 default_priority_level: 2
      priority_queue_policy { key: 1 value: { max_queue_size: 1 } }
    """
    write_model(repo, "m", config(dyn=dyn), GATED_MODEL)
    s = await serve()
    running = await blocked(s)
    queued = [await send(s, 1, priority=1), await send(s, 2), await send(s, 3, priority=2)]
    await expect_error(
        s.infer("m", x_in(4), priority=1, request_id="x"),
        Code.UNAVAILABLE,
        "[request id: x] Exceeds maximum queue size",
    )
    release()
    assert await results([running, *queued]) == [[-1], [1], [2], [3]]


REJECTED = "Request timeout expired"
# Level 1 has a policy of its own without a timeout: the blocking request goes there
# (priority=1), so that only the requests under test (level 2, the default policy) can expire.
SAFE_LEVEL = "priority_levels: 2 default_priority_level: 2 priority_queue_policy { key: 1 value: { } }"


@pytest.mark.parametrize(
    ("policy", "timeout_us", "rejected"),
    [
        ("default_timeout_microseconds: 100000", 0, True),
        ("default_timeout_microseconds: 100000 allow_timeout_override: true", 0, True),
        # a request's own timeout counts only when allowed, non-zero and shorter than the default
        ("default_timeout_microseconds: 20000000 allow_timeout_override: true", 100000, True),
        ("default_timeout_microseconds: 20000000", 100000, False),
        ("default_timeout_microseconds: 100000 allow_timeout_override: true", 20000000, True),
        ("allow_timeout_override: true", 100000, False),  # default 0: no timeouts at all
        ("timeout_action: REJECT default_timeout_microseconds: 100000", 0, True),
    ],
    ids=[
        "default",
        "default_override_unused",
        "override_shorter",
        "override_not_allowed",
        "override_longer",
        "no_default",
        "explicit_reject",
    ],
)
async def test_queue_timeout_reject(repo, serve, policy, timeout_us, rejected):
    write_model(repo, "m", config(dyn=f"{SAFE_LEVEL} default_queue_policy {{ {policy} }}"), GATED_MODEL)
    s = await serve()
    running = await blocked(s, priority=1)
    waiting = await send(s, 1, timeout_us=timeout_us)
    await asyncio.sleep(0.3)
    release()
    assert await results([running]) == [[-1]]
    if rejected:
        await expect_error(asyncio.wait_for(waiting, 5), Code.UNAVAILABLE, REJECTED)
    else:
        assert await results([waiting]) == [[1]]


async def test_timeout_reject_leaves_fresh_requests(repo, serve):
    # 1 s timeouts: the fresh request is served long before its own expires
    dyn = f"{SAFE_LEVEL} default_queue_policy {{ default_timeout_microseconds: 1000000 }}"
    write_model(repo, "m", config(dyn=dyn), GATED_MODEL)
    s = await serve()
    running = await blocked(s, priority=1)
    old = [await send(s, 1), await send(s, 2)]
    await asyncio.sleep(1.1)  # past the old ones' timeout
    fresh = await send(s, 3)
    release()
    for t in old:
        await expect_error(asyncio.wait_for(t, 5), Code.UNAVAILABLE, REJECTED)
    assert await results([running, fresh]) == [[-1], [3]]
    assert xs() == [[-1], [3]]  # the rejected requests never reached the model


async def test_timeout_fires_while_the_batch_waits_for_its_delay(repo, serve):
    # The batcher wakes at the nearest request timeout, not only at the end of the queue delay.
    dyn = "max_queue_delay_microseconds: 20000000 default_queue_policy { default_timeout_microseconds: 200000 }"
    write_model(repo, "m", config(dyn=dyn), GATED_MODEL)
    s = await serve()
    t0 = time.monotonic()
    await expect_error(asyncio.wait_for(await send(s, 1), 5), Code.UNAVAILABLE, REJECTED)
    assert 0.19 <= time.monotonic() - t0 < 5
    assert xs() == []


async def test_timeout_reject_counts_as_failed_request(repo, serve):
    # Triton answers through RespondIfError(..., FailureReason::REJECTED), which records the
    # failure in the model's statistics (reference §11: asynchronous failures are failures).
    dyn = f"{SAFE_LEVEL} default_queue_policy {{ default_timeout_microseconds: 100000 }}"
    write_model(repo, "m", config(dyn=dyn), GATED_MODEL)
    s = await serve()
    running = await blocked(s, priority=1)
    waiting = await send(s, 1)
    await asyncio.sleep(0.3)
    release()
    await results([running])
    await expect_error(asyncio.wait_for(waiting, 5), Code.UNAVAILABLE, REJECTED)
    st = s.statistics("m")[0]
    assert st.inference_stats.success.count == 1
    assert st.inference_stats.fail.count == 1


@pytest.mark.parametrize(
    "dyn",
    [
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000000 }",
        # seqserve extension: TIMEOUT_COMPLETE makes the default queue policy DELAY
        "timeout_action: TIMEOUT_COMPLETE default_queue_policy { default_timeout_microseconds: 1000000 }",
    ],
    ids=["delay", "timeout_complete"],
)
async def test_queue_timeout_delay_moves_behind_fresh_requests(repo, serve, dyn):
    write_model(repo, "m", config(dyn=dyn), GATED_MODEL)
    s = await serve()
    from seqserve._proto import model_config_pb2 as mc

    assert s.model("m").config.dynamic_batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY
    running = await blocked(s)
    late = [await send(s, 1), await send(s, 2)]
    await asyncio.sleep(1.1)  # 1 and 2 expire while queued (the blocker may too: it runs anyway)
    fresh = [await send(s, 3), await send(s, 4)]
    release()
    assert await results([running, *late, *fresh]) == [[-1], [1], [2], [3], [4]]  # served, not rejected
    assert xs() == [[-1], [3, 4, 1, 2]]


async def test_delayed_requests_stay_within_their_level(repo, serve):
    dyn = """
      priority_levels: 2 default_priority_level: 2
      priority_queue_policy { key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 1000000 } }
    """
    write_model(repo, "m", config(mbs=1, dyn=dyn), GATED_MODEL)
    s = await serve()
    running = await blocked(s, priority=2)
    tasks = [await send(s, 1, priority=1), await send(s, 2, priority=2)]
    await asyncio.sleep(1.1)  # 1 expires while queued
    tasks.append(await send(s, 3, priority=1))
    release()
    assert await results([running, *tasks]) == [[-1], [1], [2], [3]]
    # level 1 (fresh 3, then expired 1) still goes before level 2
    assert xs() == [[-1], [3], [1], [2]]


# ------------------------------------------------------------ instances and ordering (§9)


@pytest.mark.parametrize("preserve", [True, False])
async def test_preserve_ordering_across_two_instances(repo, serve, preserve):
    extra = "instance_group [ { count: 2 kind: KIND_CPU } ]"
    dyn = f"preserve_ordering: {str(preserve).lower()}"
    write_model(repo, "m", config(mbs=1, dyn=dyn, extra=extra), GATED_MODEL)
    s = await serve()
    order: list[int] = []
    futures = []
    for v in (-1, 2, 3, 4):  # -1 waits for the gate on one instance; the rest run on the other
        fut = s.submit("m", x_in(v))
        fut.add_done_callback(lambda f: order.append(int(f.result().outputs["OUT_X"][0, 0])))
        futures.append(fut)
    try:
        await wait_until(lambda: sorted(x for (x,) in xs()) == [-1, 2, 3, 4], "every request has executed")
        if preserve:
            await asyncio.sleep(0.1)  # the later replies are held back, not merely late
            assert not any(f.done() for f in futures)
        else:
            await wait_until(lambda: all(f.done() for f in futures[1:]), "2, 3 and 4 are answered")
    finally:
        release()
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert {b["instance"] for b in mod().RECORD} == {0, 1}
    if preserve:
        assert order == [-1, 2, 3, 4]
    else:
        assert order[-1] == -1  # the gated one finished last


async def test_two_instances_run_batches_concurrently(repo, serve):
    extra = "instance_group [ { count: 2 kind: KIND_CPU } ]"
    write_model(repo, "m", config(dyn="preserve_ordering: false", extra=extra), GATED_MODEL)
    s = await serve()
    running = await blocked(s)
    assert await results([await send(s, 5)], timeout=5) == [[5]]  # the other instance serves it
    assert not running.done()
    release()
    assert await results([running]) == [[-1]]
    assert sorted(b["instance"] for b in mod().RECORD) == [0, 1]


async def test_stopping_refuses_new_requests(repo, serve):
    write_model(repo, "m", config(), GATED_MODEL)
    s = await serve()
    running = await blocked(s)
    stopping = asyncio.ensure_future(s.shutdown(timeout_s=5))
    await wait_until(lambda: not s.is_live(), "the shutdown has begun")
    await expect_error(
        s.infer("m", x_in(1), request_id="late"),
        Code.UNAVAILABLE,
        "[request id: late] Server is stopping, scheduler for model has stopped accepting new inference requests",
    )
    release()
    assert await results([running]) == [[-1]]
    await asyncio.wait_for(stopping, 5)
