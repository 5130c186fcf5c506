"""What a batch the core formed looks like to the model (``ExecuteBatch``), and the traces of its
traced requests: the first phase of ``LoadedModel``'s batch runner, kept apart from the runner."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqserve.engine._core import Batch, Scheduler
from seqserve.engine.batch import ExecuteBatch, RaggedInput, StateViews
from seqserve.engine.model.delivery import Pending
from seqserve.engine.model.devices import InstanceDevices, device_states
from seqserve.engine.model.spec import CoreSpec
from seqserve.engine.tracing import RequestTrace


def build_batch(
    cb: Batch, recs: list[Pending | None], spec: CoreSpec, devices: InstanceDevices, *, ragged: bool, batched: bool
) -> ExecuteBatch:
    """The batch as the model sees it: the core's arrays and each request's rows, outputs, id."""
    checked = [r.checked if r is not None else None for r in recs]
    states: Mapping[str, Any] = StateViews(spec.state_names, cb) if spec.state_names else {}
    if devices.table(cb.instance) is not None:
        states = device_states(devices, cb, spec.state_names)
    return ExecuteBatch(
        size=cb.size,
        instance=cb.instance,
        inputs=cb.inputs(),
        states=states,
        controls=cb.controls(),
        start=cb.start,
        end=cb.end,
        ready=cb.ready,
        corrid=cb.corrid,
        request_rows=cb.request_rows,
        request_outputs=[c.outputs if c is not None else None for c in checked],
        request_ids=[c.request.id if c is not None else "" for c in checked],
        request_parameters=[c.request.parameters if c is not None else {} for c in checked],
        ragged={k: RaggedInput(v) for k, v in cb.ragged().items()} if ragged else {},
        batched=batched,
    )


def batch_traces(core: Scheduler, is_sequence: bool, cb: Batch, recs: list[Pending | None]) -> list[RequestTrace]:
    """The traces of a batch's traced requests, told that compute starts."""
    traces = []
    for r in recs:
        t = r.checked.request.trace if r is not None else None
        if r is not None and t is not None:
            slot = core.slot_of(r.checked.corrid) if is_sequence and t.wants_slot else -1
            t.ran(batch_size=cb.size, instance=cb.instance, slot=slot)
            traces.append(t)
    return traces


def stamp(traces: list[RequestTrace], name: str) -> None:
    for t in traces:
        t.stamp(name)
