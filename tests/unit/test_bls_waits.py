"""The circle check of calls between models (engine/backends/bls_waits.py)."""

from __future__ import annotations

from seqserve.engine.backends.bls_waits import Wait, WaitGraph

A, B, C = ("a", 1), ("b", 1), ("c", 1)


def test_a_call_to_a_free_model_goes() -> None:
    g = WaitGraph()
    assert g.would_deadlock(Wait(A, 1, B), 1, 1) == []


def test_two_models_waiting_on_each_other() -> None:
    g = WaitGraph()
    key = g.add(Wait(A, 1, B), 1, 1)
    assert g.would_deadlock(Wait(B, 2, A), 1, 1) == ["a", "b"]
    g.done(key)  # A's call was answered: B may call A
    assert g.would_deadlock(Wait(B, 2, A), 1, 1) == []


def test_a_free_instance_breaks_the_circle() -> None:
    g = WaitGraph()
    g.add(Wait(A, 1, B), 2, 1)
    assert g.would_deadlock(Wait(B, 2, A), 1, 2) == []
    g.add(Wait(A, 3, B), 2, 1)  # now both instances of A wait on B
    assert g.would_deadlock(Wait(B, 2, A), 1, 2) == ["a", "b"]


def test_an_instance_waiting_on_several_calls_waits_for_all() -> None:
    g = WaitGraph()
    g.add(Wait(A, 1, B), 1, 1)
    g.add(Wait(A, 1, C), 1, 1)  # the same instance (an async execute's gather): C can answer, B cannot
    assert g.would_deadlock(Wait(B, 2, A), 1, 1) == ["a", "b"]


def test_a_longer_circle() -> None:
    g = WaitGraph()
    g.add(Wait(A, 1, B), 1, 1)
    g.add(Wait(B, 2, C), 1, 1)
    assert g.would_deadlock(Wait(C, 3, A), 1, 1) == ["a", "b", "c"]
    assert len(g) == 2
