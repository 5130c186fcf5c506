"""A worker's ring client when its request ring is full (api/workers/ring_client.py): requests
wait in order, the read gate closes (every registered connection pauses) until they are all on
the ring, and a cancel waits in the same line, so the engine's compiled path hears of it."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import numpy as np
from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc
from seqserve.api.transport.read_gate import ReadGate
from seqserve.api.workers import fast_requests
from seqserve.api.workers.channel import Channel
from seqserve.api.workers.fast_requests import FastRequest
from seqserve.api.workers.ring_client import RingClient
from seqserve.api.workers.snapshot import FrontEndCounts, ModelEntry
from seqserve.api.workers.supervisor import WorkerCounts
from seqserve.engine import InferRequest
from seqserve.engine.workers import SLAB_CLASSES, ShmRegion
from tests.support.paths import DEMO_REPO

TARGET = 7
SLOTS = 4


class Control:
    """The control channel's stand-in: what the client sent over it."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


class Connection:
    """A connection as the gate sees it: whether it may read."""

    def __init__(self) -> None:
        self.reading = True

    def gate_closed(self) -> None:
        self.reading = False

    def gate_opened(self) -> None:
        self.reading = True


def _fast_request(seq: int) -> FastRequest:
    cfg = text_format.Parse((DEMO_REPO / "accumulator" / "config.pbtxt").read_text(), mc.ModelConfig())
    model = fast_requests.fast_model("accumulator", 1, ModelEntry(TARGET, False, True, cfg, str(DEMO_REPO), True))
    assert model is not None
    request = InferRequest(
        model="accumulator", inputs={"INPUT": np.ones((1, 1), np.float32)}, sequence_id=seq, sequence_start=True
    )
    checked = fast_requests.check(model, request)
    assert checked is not None
    return FastRequest(model, checked)


def _pop_all(region: ShmRegion) -> list[tuple[int, bool, int]]:
    """The records on the ring as (target, cancel, handle); their blocks freed."""
    out = []
    while (record := region.pop_request(0)) is not None:
        target, cancel, header, inputs = record
        for _, offset, _, _ in inputs:
            region.free(0, True, offset)
        out.append((target, cancel, header.handle))
    return out


def _client(region: ShmRegion, control: Control) -> RingClient:
    return RingClient(region, 0, cast(Channel, control), read_gate=ReadGate())


def test_a_full_ring_closes_the_gate_until_what_was_read_is_sent() -> None:
    async def run() -> None:
        region = ShmRegion(workers=1, request_slots=SLOTS, slab_classes=SLAB_CLASSES)
        client = _client(region, Control())
        conn = Connection()
        client.read_gate.register(conn)
        handles = [client.submit_fast(_fast_request(seq), lambda r, f: None) for seq in range(1, SLOTS + 3)]
        assert not conn.reading and not client.read_gate.is_open
        assert client.read_gate.closings == 1
        late = Connection()  # a connection accepted meanwhile does not read either
        client.read_gate.register(late)
        assert not late.reading
        assert [h for _, _, h in _pop_all(region)] == handles[:SLOTS]
        await asyncio.sleep(0.05)  # the retry
        assert [h for _, _, h in _pop_all(region)] == handles[SLOTS:]
        assert conn.reading and late.reading and client.read_gate.is_open

    asyncio.run(run())


def test_a_cancel_that_finds_the_ring_full_waits_in_line() -> None:
    async def run() -> None:
        region = ShmRegion(workers=1, request_slots=SLOTS, slab_classes=SLAB_CLASSES)
        control = Control()
        client = _client(region, control)
        handles = [client.submit_fast(_fast_request(seq), lambda r, f: None) for seq in range(1, SLOTS + 3)]
        client.cancel(handles[0])  # sent: its cancel must reach the compiled path
        client.cancel(handles[-1])  # still waiting: never sent
        assert control.sent == []  # not the control channel (only the slow path hears it)
        assert [h for _, _, h in _pop_all(region)] == handles[:SLOTS]
        await asyncio.sleep(0.05)
        # in order: the request read before the cancel, then the cancel, by its fast target
        assert _pop_all(region) == [(TARGET, False, handles[SLOTS]), (TARGET, True, handles[0])]
        assert client.read_gate.is_open

    asyncio.run(run())


def test_the_workers_pauses_are_summed_for_metrics() -> None:
    counts = WorkerCounts()
    assert counts.metrics.ring_full is None  # one process: no such metric
    counts.record(0, FrontEndCounts({}, None, (2, 0.5)))
    counts.record(1, FrontEndCounts({}, None, (1, 0.25)))
    counts.record(0, FrontEndCounts({}, None, (3, 1.0)))  # a worker's later counts replace its earlier
    samples = {s.name: s.value for m in counts.metrics.collect() for s in m.samples}
    assert samples["seqserve_worker_reading_paused_total"] == 4
    assert samples["seqserve_worker_reading_paused_seconds_total"] == 1.25
