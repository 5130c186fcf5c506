"""The compiled core's typed boundary, driven directly: spec classes, their checks, control
encoding from numpy dtypes, typed refusals, statistics and expiry records."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from seqserve.engine import _core
from tests.support.checks import wait_until_sync

I32 = np.dtype(np.int32)
I64 = np.dtype(np.int64)
F32 = np.dtype(np.float32)
OBJ = np.dtype(object)


def test_specs_are_keyword_built_and_read_back() -> None:
    inp = _core.InputSpec(name="X", dtype=F32, must_match=True, default_shape=[1, 2])
    ctl = _core.ControlSpec(name="S", kind=_core.ControlKind.START, dtype=I32, false_value=5, true_value=7)
    st = _core.StateSpec(input_name="A", output_name="B", dtype=I64, dims=[-1], initial=bytes(16), initial_dims=[2])
    qp = _core.QueuePolicy(delay_on_timeout=True, default_timeout_us=250, max_queue_size=3)
    spec = _core.ModelSpec(
        name="m",
        strategy=_core.Strategy.DYNAMIC,
        max_batch_size=4,
        idle_us=1234,
        batch_delay_us=99,
        inputs=[inp],
        controls=[ctl],
        states=[st],
        queue_policies=[qp],
    )
    assert (inp.name, inp.dtype, inp.must_match, inp.default_shape) == ("X", F32, True, [1, 2])
    assert (ctl.kind, ctl.dtype, ctl.false_value, ctl.true_value) == (_core.ControlKind.START, I32, 5.0, 7.0)
    assert (st.dtype, st.dims, st.initial, st.initial_dims) == (I64, [-1], bytes(16), [2])
    assert (qp.delay_on_timeout, qp.default_timeout_us, qp.allow_override, qp.max_queue_size) == (True, 250, False, 3)
    assert spec.strategy is _core.Strategy.DYNAMIC
    assert (spec.idle_us, spec.batch_delay_us, spec.max_queue_delay_us) == (1234, 99, 0)
    assert [i.name for i in spec.inputs] == ["X"] and spec.states[0].input_name == "A"
    assert repr(inp) == (
        "InputSpec(name='X', dtype=dtype('float32'), must_match=True, default_shape=[1, 2], ragged=False)"
    )
    assert _core.InputSpec(name="B", dtype=OBJ).dtype == OBJ
    with pytest.raises(AttributeError):
        inp.name = "Y"  # type: ignore[misc]


def test_enums_match_the_engine() -> None:
    from seqserve.engine.errors import Code

    assert {c.name: c.value for c in _core.Code} == {c.name: c.value for c in Code}
    assert [s.name for s in _core.Strategy] == ["STATELESS", "DIRECT", "OLDEST", "DYNAMIC"]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: _core.InputSpec(name="X", dtype=np.dtype("U4")), "numeric dtypes and object"),
        (lambda: _core.InputSpec(name="X", dtype=np.dtype(">f4")), "native byte order"),
        (lambda: _core.ControlSpec(name="C", kind=_core.ControlKind.CORRID, dtype=F32), "integer or object"),
        (lambda: _core.ControlSpec(name="C", kind=_core.ControlKind.END, dtype=OBJ), "numeric"),
        (
            lambda: _core.StateSpec(
                input_name="A", output_name="B", dtype=F32, dims=[2], initial=bytes(4), initial_dims=[2]
            ),
            "initial value has 4 bytes, its shape needs 8",
        ),
    ],
)
def test_specs_refuse_what_the_core_cannot_hold(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


class _Core:
    """A started scheduler whose runner records what each batch presents."""

    def __init__(self, spec: _core.ModelSpec, **hooks: Any) -> None:
        self.batches: list[dict[str, Any]] = []
        self.failed: list[tuple[list[int], _core.Code, str]] = []
        self.ran = threading.Semaphore(0)
        self.sched = _core.Scheduler(
            spec,
            runner=self._run,
            on_fail=lambda h, code, msg: self.failed.append((h, code, msg)),
            on_warning=lambda msg: None,
            **hooks,
        )
        self.sched.start()
        self.keep: list[Any] = []

    def _run(self, b: _core.Batch) -> bool:
        self.batches.append({k: v.copy() for k, v in b.controls().items()} | {"handles": b.handles})
        self.ran.release()
        return True

    def submit(self, handle: int, value: int, corrid: int | str, start: bool, end: bool) -> _core.Refusal | int:
        arr = np.array([[value]], np.int32)
        self.keep.append(arr)
        return self.sched.submit(_core.RequestHeader(handle=handle, sequence_id=corrid, start=start, end=end), (arr,))

    def wait(self, n: int) -> None:
        for _ in range(n):
            assert self.ran.acquire(timeout=10)


def _sequence_spec(**kw: Any) -> _core.ModelSpec:
    return _core.ModelSpec(
        name="m",
        strategy=_core.Strategy.DIRECT,
        max_batch_size=2,
        slots_per_instance=2,
        inputs=[_core.InputSpec(name="X", dtype=I32, default_shape=[1])],
        **kw,
    )


def test_controls_are_encoded_in_their_dtype() -> None:
    spec = _sequence_spec(
        controls=[
            _core.ControlSpec(name="S", kind=_core.ControlKind.START, dtype=I32, false_value=-3, true_value=9),
            _core.ControlSpec(name="R", kind=_core.ControlKind.READY, dtype=F32, false_value=0.5, true_value=1.5),
            _core.ControlSpec(name="E", kind=_core.ControlKind.END, dtype=np.dtype(bool)),
            _core.ControlSpec(name="C", kind=_core.ControlKind.CORRID, dtype=np.dtype(np.uint32)),
            _core.ControlSpec(name="C64", kind=_core.ControlKind.CORRID, dtype=I64),
        ]
    )
    core = _Core(spec)
    try:
        assert isinstance(core.submit(1, 10, 2**32 + 5, True, False), int)  # accepted: a cancel() token
        core.wait(1)
        b = core.batches[0]
        assert b["S"].tolist() == [[9]] and b["S"].dtype == I32
        assert b["R"].tolist() == [[1.5]] and b["R"].dtype == F32
        assert b["E"].tolist() == [[False]]
        assert b["C"].tolist() == [[5]] and b["C"].dtype == np.uint32  # the id's low 32 bits
        assert b["C64"].tolist() == [[2**32 + 5]]
    finally:
        core.sched.close(force=True)


def test_refusals_are_typed() -> None:
    core = _Core(_sequence_spec())
    try:
        refusal = core.submit(1, 1, 7, False, False)
        assert isinstance(refusal, _core.Refusal)
        assert refusal.code is _core.Code.INVALID_ARG
        assert "must specify the START flag" in refusal.message
        assert core.submit(2, 1, 0, True, False).code is _core.Code.INVALID_ARG  # type: ignore[union-attr]
        core.sched.stop_accepting()
        assert core.submit(3, 1, 8, True, False).code is _core.Code.UNAVAILABLE  # type: ignore[union-attr]
    finally:
        core.sched.close(force=True)


def test_stats_and_expiry_are_typed() -> None:
    expired: list[_core.ExpiredSequence] = []
    core = _Core(_sequence_spec(idle_us=50_000), on_expire=expired.append)
    try:
        assert isinstance(core.submit(1, 1, "seq-a", True, False), int)
        core.wait(1)
        deadline = threading.Event()
        for _ in range(100):
            if expired:
                break
            deadline.wait(0.05)
        assert [(x.sequence_id, x.steps, x.instance, x.slot) for x in expired] == [("seq-a", 1, 0, 0)]
        assert expired[0].idle_s >= 0.05
        s = core.sched.stats()
        assert (s.inference_count, s.execution_count, s.success.count, s.fail.count) == (1, 1, 1, 0)
        assert list(s.batches) == [1] and s.batches[1].compute_infer.count == 1
    finally:
        core.sched.close(force=True)


def test_close_leaves_a_hung_executor_behind() -> None:
    """close(timeout_s=...) does not wait for an executor stuck in the runner: it returns the
    instance's index, fails what is still queued, and the executor may come back later."""
    entered, release = threading.Event(), threading.Event()
    failed: list[tuple[list[int], _core.Code, str]] = []
    ran_on: list[int] = []

    def runner(b: _core.Batch) -> bool:
        ran_on.append(b.instance)
        entered.set()
        release.wait(30)  # as a model that never returns, until the test lets it go
        return True

    spec = _core.ModelSpec(
        name="m",
        strategy=_core.Strategy.STATELESS,
        instance_count=2,
        inputs=[_core.InputSpec(name="X", dtype=I32, default_shape=[1])],
    )
    sched = _core.Scheduler(
        spec, runner=runner, on_fail=lambda h, code, msg: failed.append((h, code, msg)), on_warning=lambda m: None
    )
    sched.start()
    keep = [np.array([1], np.int32) for _ in range(2)]
    try:
        assert isinstance(sched.submit(_core.RequestHeader(handle=1), (keep[0],)), int)  # accepted: its cancel() token
        assert entered.wait(10)
        t0 = time.monotonic()
        assert sched.close(force=True, timeout_s=0.3) == ran_on  # the other instance was idle: joined
        assert 0.25 < time.monotonic() - t0 < 5
        assert sched.close(force=True, timeout_s=0.3) == []  # closed: nothing more to do
        refusal = sched.submit(_core.RequestHeader(handle=2), (keep[1],))
        assert refusal is not None and refusal.code is _core.Code.UNAVAILABLE
    finally:
        release.set()
    # the detached executor comes back to a scheduler that still exists, finishes and exits
    wait_until_sync(lambda: sched.stats().execution_count == 1, "the left-behind batch is counted")
    assert failed == []


def test_request_header_names_its_fields() -> None:
    h = _core.RequestHeader(handle=7, sequence_id="seq-a", start=True, session=True, timeout_us=5, rows=2, priority=3)
    assert (h.handle, h.sequence_id, h.start, h.end, h.session) == (7, "seq-a", True, False, True)
    assert (h.timeout_us, h.rows, h.priority) == (5, 2, 3)
    kw: dict[str, Any] = {"handle": 1}
    d = _core.RequestHeader(**kw)
    assert (d.sequence_id, d.start, d.end, d.session, d.timeout_us, d.rows, d.priority) == (
        0,
        False,
        False,
        False,
        0,
        1,
        0,
    )
    assert repr(d).startswith("RequestHeader(handle=1, sequence_id=0, start=False")
    assert _core.RequestHeader.__new__(_core.RequestHeader, handle=2, sequence_id=5).sequence_id == 5  # tp_new
    with pytest.raises(TypeError, match="keyword arguments only"):
        _core.RequestHeader(1)  # type: ignore[misc]
    with pytest.raises(TypeError, match="'handle'"):
        _core.RequestHeader()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'prio'"):
        _core.RequestHeader(handle=1, prio=2)  # type: ignore[call-arg]
    with pytest.raises(OverflowError):
        _core.RequestHeader(handle=1, priority=2**31)
    with pytest.raises(TypeError, match="RequestHeader"):
        _core.Scheduler(
            _core.ModelSpec(name="m", strategy=_core.Strategy.STATELESS, inputs=[]),
            runner=lambda b: True,
            on_fail=lambda *a: None,
            on_warning=lambda m: None,
        ).submit(object(), ())  # type: ignore[arg-type]
