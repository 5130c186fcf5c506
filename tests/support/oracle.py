"""A small, slow, obviously-correct model of the Direct sequence scheduler (test oracle).

It follows reference/sequence-semantics.md sections 1-2, 5, 6 and 12 for an accumulator
model with one implicit state (``state_out = state_in + input``, initial state 0):

* Slots: every instance has ``max(1, max_batch_size)`` slots. A new sequence takes the free
  slot with the lowest ``(slot, instance)``; with none free it joins the back of the backlog.
* Per-slot FIFO queues. END drops the id's mapping when it is *enqueued* (a length-1 sequence
  in the backlog is never mapped). A second START on an active id goes to the same place.
  A request without START for an unmapped id is refused with the START error.
* Batches: slots ``0..max ready slot``; holes are padding rows (READY/START/END false, CORRID
  none). An END placed in a batch releases its slot at once: the oldest backlogged sequence
  moves in as a whole, otherwise the slot becomes free.
* State lives per slot, is reset on START and only real rows write it back.
* An instance runs one batch at a time. The oracle holds every batch until ``release(i)``
  (the test harness does the same to the engine), so it tracks which instances hold a batch:
  a request queued for an instance that holds none starts a batch at once, and ``release``
  forms the instance's next batch straight after completing the current one.

``run_wave`` is the convenience driver: enqueue a list of requests, then release instances
round-robin (instance 0, 1, ...) until nothing is held.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

SeqId = int | str


@dataclass(frozen=True)
class Req:
    id: SeqId
    start: bool = False
    end: bool = False
    value: int = 0


@dataclass(frozen=True)
class Row:
    """What the model sees at one batch position. Padding: req/corrid/value/state are None."""

    ready: bool
    start: bool
    end: bool
    corrid: SeqId | None
    value: int | None
    state: int | None
    req: int | None  # index of the request, in submission order


@dataclass
class Batch:
    instance: int
    rows: list[Row]

    @property
    def size(self) -> int:
        return len(self.rows)


PADDING = Row(False, False, False, None, None, None, None)


@dataclass
class _Backlogged:
    id: SeqId
    reqs: list[int] = field(default_factory=list)


def start_error(seq: SeqId, model: str) -> str:
    return (
        f"inference request for sequence {seq} to model '{model}' must specify the START flag "
        "on the first request of the sequence"
    )


class DirectOracle:
    def __init__(self, instances: int, max_batch_size: int, model: str = "m") -> None:
        self.model = model
        self.n = instances
        self.slots = max(1, max_batch_size)
        self.free = {(s, i) for i in range(instances) for s in range(self.slots)}
        self.queue = {(i, s): deque() for i in range(instances) for s in range(self.slots)}
        self.state = {(i, s): 0 for i in range(instances) for s in range(self.slots)}
        self.where: dict[tuple[type, SeqId], tuple[int, int] | _Backlogged] = {}
        self.backlog: deque[_Backlogged] = deque()
        self.held: list[Batch | None] = [None] * instances
        self.reqs: list[Req] = []
        self.errors: dict[int, str] = {}  # request index -> synchronous error message
        self.replies: dict[int, int] = {}  # request index -> output value (state_in + input)
        self.batches: list[Batch] = []  # every batch, in the order it was formed

    # ------------------------------------------------------------------------- enqueue

    def submit(self, req: Req) -> Batch | None:
        """Queue one request. Returns the batch it started on an idle instance, if any."""
        k = len(self.reqs)
        self.reqs.append(req)
        key = (type(req.id), req.id)  # 5 and "5" are different sequences
        place = self.where.get(key)
        if place is None and not req.start:
            self.errors[k] = start_error(req.id, self.model)
            return None
        if place is None:
            if self.free:
                s, i = min(self.free)
                self.free.remove((s, i))
                place = (i, s)
            else:
                place = _Backlogged(req.id)
                self.backlog.append(place)
            self.where[key] = place
        if isinstance(place, _Backlogged):
            place.reqs.append(k)
        else:
            self.queue[place].append(k)
        if req.end:
            del self.where[key]
        if isinstance(place, _Backlogged) or self.held[place[0]] is not None:
            return None
        return self._form(place[0])

    # ------------------------------------------------------------------------- batches

    def _release_slot(self, i: int, s: int) -> None:
        if not self.backlog:
            self.free.add((s, i))
            return
        bq = self.backlog.popleft()
        self.queue[(i, s)].extend(bq.reqs)
        key = (type(bq.id), bq.id)
        if self.where.get(key) is bq:
            self.where[key] = (i, s)

    def _form(self, i: int) -> Batch | None:
        ready = [s for s in range(self.slots) if self.queue[(i, s)]]
        if not ready:
            self.held[i] = None
            return None
        rows = []
        for s in range(max(ready) + 1):
            q = self.queue[(i, s)]
            if not q:
                rows.append(PADDING)
                continue
            k = q.popleft()
            r = self.reqs[k]
            if r.start:
                self.state[(i, s)] = 0
            rows.append(Row(True, r.start, r.end, r.id, r.value, self.state[(i, s)], k))
            if r.end:
                self._release_slot(i, s)
        batch = Batch(i, rows)
        self.held[i] = batch
        self.batches.append(batch)
        return batch

    def release(self, i: int) -> Batch | None:
        """Complete the batch instance i holds; returns the next batch it forms, if any."""
        batch = self.held[i]
        assert batch is not None, f"instance {i} holds no batch"
        for s, row in enumerate(batch.rows):
            if row.req is not None:
                self.state[(i, s)] = row.state + row.value
                self.replies[row.req] = row.state + row.value
        return self._form(i)

    def run_wave(self, reqs: list[Req]) -> list[Batch]:
        """Enqueue `reqs`, then release instances round-robin until none holds a batch."""
        first = len(self.batches)
        for r in reqs:
            self.submit(r)
        while any(self.held):
            for i in range(self.n):
                if self.held[i] is not None:
                    self.release(i)
        return self.batches[first:]
