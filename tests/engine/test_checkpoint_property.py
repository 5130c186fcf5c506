"""Property: sequences moved at random between two servers, also while other sequences' steps
are queued or running, give exactly the running sums of an oracle that never moves anything,
and every checkpoint holds the oracle's state and step count."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqserve.engine import SequenceCheckpoint, Server
from tests.support.checkpoint_model import MODEL, call, config
from tests.support.models import write_model

SEQS = (1, 2, 3, 4)

ops = st.one_of(
    st.tuples(
        st.just("burst"),
        st.lists(st.sampled_from(SEQS), min_size=1, max_size=4, unique=True),
        st.integers(-20, 20),
        st.sampled_from((0, *SEQS)),
    ),
    st.tuples(st.just("move"), st.sampled_from(SEQS)),
    st.tuples(st.just("end"), st.sampled_from(SEQS)),
    st.tuples(st.just("snap"), st.sampled_from(SEQS)),
)


@st.composite
def scenarios(draw):
    strategy = draw(st.sampled_from(("direct", "oldest")))
    mbs, instances = draw(st.sampled_from(((4, 1), (2, 2), (4, 2))))  # at least 4 slots per server
    return strategy, mbs, instances, draw(st.lists(ops, min_size=1, max_size=25))


class Oracle:
    def __init__(self) -> None:
        self.sums: dict[int, int] = {}
        self.steps: dict[int, int] = {}
        self.holder: dict[int, int] = {}  # live sequences: the server index holding them

    def step(self, sid: int, value: int, end: bool = False) -> tuple[int, bool]:
        start = sid not in self.holder
        if start:
            self.sums[sid], self.steps[sid] = 0, 0
        self.sums[sid] += value
        self.steps[sid] += 1
        return self.sums[sid], start


async def run(strategy: str, mbs: int, instances: int, program: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        extra = f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]"
        write_model(repo, "m", config(strategy=strategy, mbs=mbs, extra=extra), MODEL)
        servers = [Server(repo), Server(repo)]
        for s in servers:
            await s.start()
        try:
            await play(servers, program)
        finally:
            for s in servers:
                await s.shutdown(timeout_s=0)


def move(servers: list[Server], o: Oracle, sid: int) -> None:
    src = o.holder[sid]
    ckpt = servers[src].checkpoint_sequence("m", 1, sid, release=True)
    assert ckpt is not None and ckpt.steps == o.steps[sid], (ckpt, o.steps[sid])
    assert ckpt.states["ACC"].tolist() == [o.sums[sid], o.steps[sid]]
    servers[1 - src].restore_sequence(SequenceCheckpoint.from_bytes(ckpt.to_bytes()))
    o.holder[sid] = 1 - src


async def play(servers: list[Server], program: list[tuple]) -> None:
    o = Oracle()
    for op in program:
        kind, sid = op[0], op[1]
        if kind == "burst":
            sids, value, moving = op[1], op[2], op[3]
            tasks, want = [], []
            for k in sids:
                expect, start = o.step(k, value + k)
                o.holder.setdefault(k, len(o.holder) % 2)
                tasks.append(asyncio.ensure_future(call(servers[o.holder[k]], k, value + k, start=start)))
                want.append(expect)
            await asyncio.sleep(0)  # queued; the batch may be running now
            if moving in o.holder and moving not in sids:
                move(servers, o, moving)  # while the others' steps are queued or running
            assert await asyncio.wait_for(asyncio.gather(*tasks), 20) == want
        elif sid not in o.holder:
            continue
        elif kind == "move":
            move(servers, o, sid)
        elif kind == "end":
            expect, _ = o.step(sid, 1)
            assert await call(servers[o.holder[sid]], sid, 1, end=True) == expect
            del o.holder[sid]
        else:
            snap = servers[o.holder[sid]].checkpoint_sequence("m", 1, sid, release=False)
            assert snap is not None and snap.states["ACC"].tolist() == [o.sums[sid], o.steps[sid]]
    for s in servers:
        assert s.model("m").scheduler_state()["backlog_sequences"] == 0
    held = sorted((x[2], i) for i, s in enumerate(servers) for x in s.live_sequences())
    assert held == sorted((k, i) for k, i in o.holder.items())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_random_moves_match_an_oracle_that_never_moves(scenario):
    asyncio.run(run(*scenario))
