"""Session tombstones accounted per client (csrc/tombstones.h): a client's own cap evicts its
own oldest, the total cap evicts from the client holding the most, and a client whose evicted
ids fill its share of the filter gets its new sessions refused (UNAVAILABLE, with how long)
while other clients' sessions start and their tombstones stay exact. Also the address helpers
the front-ends use (engine/sessions.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from seqserve.engine import SessionPolicy, _core, peer_host
from seqserve.engine.sessions import client_key

I32 = np.dtype(np.int32)
ENDED = "was ended by its END request"
EVICTED = "may have ended here"
FLOODER, OTHER = 2, 3


class Core:
    """A started Direct scheduler whose session requests name their client."""

    def __init__(self, **spec: Any) -> None:
        self.sched = _core.Scheduler(
            _core.ModelSpec(
                name="m",
                strategy=_core.Strategy.DIRECT,
                max_batch_size=2,
                slots_per_instance=2,
                inputs=[_core.InputSpec(name="X", dtype=I32, default_shape=[1])],
                **spec,
            ),
            runner=self._run,
            on_fail=lambda h, code, msg: None,
            on_warning=lambda msg: None,
        )
        self.sched.start()
        self.ran = threading.Semaphore(0)
        self.keep: list[Any] = []
        self.handle = 0

    def _run(self, b: _core.Batch) -> bool:
        b.finish(True)
        self.ran.release()
        return True

    def submit(self, corrid: str, client: int, *, start: bool = False, end: bool = False) -> Any:
        self.handle += 1
        arr = np.array([[1]], np.int32)
        self.keep.append(arr)
        header = _core.RequestHeader(
            handle=self.handle, sequence_id=corrid, start=start, end=end, session=True, client=client
        )
        return self.sched.submit(header, (arr,))

    def one_request_session(self, corrid: str, client: int) -> None:
        """A session of one request (START implied, END): it leaves a tombstone."""
        assert isinstance(self.submit(corrid, client, end=True), int)
        assert self.ran.acquire(timeout=10)

    def refusal(self, corrid: str, client: int, **kw: Any) -> _core.Refusal:
        got = self.submit(corrid, client, **kw)
        assert isinstance(got, _core.Refusal), got
        return got


@pytest.fixture
def core() -> Iterator[Any]:
    made: list[Core] = []

    def make(**spec: Any) -> Core:
        made.append(Core(**spec))
        return made[-1]

    yield make
    for c in made:
        c.sched.close(True)


def end_sessions(c: Core, client: int, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(n)]
    for s in ids:
        c.one_request_session(s, client)
    return ids


def test_a_client_over_its_cap_evicts_only_its_own(core: Any) -> None:
    c = core(max_tombstones=100, max_tombstones_per_client=4)
    others = end_sessions(c, OTHER, "other", 3)
    flooded = end_sessions(c, FLOODER, "flood", 50)
    stats = c.sched.stats()
    assert stats.tombstones_evicted_client_cap == 46 and stats.tombstones_evicted_global_cap == 0
    for s in others:  # exact tombstones, untouched by the flood
        r = c.refusal(s, OTHER)
        assert r.code is _core.Code.NOT_FOUND and ENDED in r.message, r
    for s in flooded:  # evicted or not, never a fresh start
        r = c.refusal(s, FLOODER)
        assert r.code is _core.Code.NOT_FOUND, r
    assert sum(EVICTED in c.refusal(s, FLOODER).message for s in flooded) == 46


def test_the_total_cap_takes_from_the_client_holding_the_most(core: Any) -> None:
    c = core(max_tombstones=10, max_tombstones_per_client=8)
    others = end_sessions(c, OTHER, "other", 3)
    end_sessions(c, FLOODER, "flood", 30)
    stats = c.sched.stats()
    # the flooder holds 7 (10 in all), its 8th each time going by the total cap
    assert stats.tombstones_evicted_global_cap == 23 and stats.tombstones_evicted_client_cap == 0
    for s in others:
        assert ENDED in c.refusal(s, OTHER).message


def test_without_a_per_client_cap_the_total_still_spares_the_smaller_client(core: Any) -> None:
    c = core(max_tombstones=10)
    others = end_sessions(c, OTHER, "other", 4)
    end_sessions(c, FLOODER, "flood", 40)
    assert c.sched.stats().tombstones_evicted_global_cap == 34
    for s in others:
        assert ENDED in c.refusal(s, OTHER).message


def test_a_client_that_fills_its_filter_share_is_refused_alone(core: Any) -> None:
    # a share of 1 in 100,000 of the tombstones: 5 ids of the filter's 524,288
    c = core(max_tombstones=100_000, max_tombstones_per_client=1)
    flooded = end_sessions(c, FLOODER, "flood", 6)  # 5 evicted: its share
    r = c.refusal("flood-new", FLOODER)
    assert r.code is _core.Code.UNAVAILABLE and "--session-tombstone-max-per-client" in r.message, r
    assert r.retry_after_ms > 0
    assert c.refusal("flood-new-2", FLOODER, start=True).code is _core.Code.UNAVAILABLE  # explicit too
    assert c.sched.stats().session_starts_refused == 2
    for s in flooded:  # its old sessions: 410, never a fresh start and never the 503
        assert c.refusal(s, FLOODER).code is _core.Code.NOT_FOUND
    end_sessions(c, OTHER, "other", 3)  # the other client's new sessions start
    assert c.refusal("other-0", OTHER).code is _core.Code.NOT_FOUND
    # a plain sequence (no session) of the flooder is not refused
    assert isinstance(c.sched.submit(_core.RequestHeader(handle=999, sequence_id=77, start=True), (c.keep[0],)), int)


def test_among_equal_holders_the_oldest_record_goes(core: Any) -> None:
    c = core(max_tombstones=3)
    for client in (7, 5, 9, 1):  # one each; the fourth is over the total
        c.one_request_session(f"s-{client}", client)
    assert EVICTED in c.refusal("s-7", 7).message  # the oldest, whatever its client's key
    for client in (5, 9, 1):
        assert ENDED in c.refusal(f"s-{client}", client).message


def test_the_shared_key_is_one_client(core: Any) -> None:
    c = core(max_tombstones=100, max_tombstones_per_client=2)
    end_sessions(c, 0, "inproc", 5)
    assert c.sched.stats().tombstones_evicted_client_cap == 3


def test_policy_defaults_to_a_quarter_of_the_total() -> None:
    assert SessionPolicy().per_client_cap == 2_500
    assert SessionPolicy(tombstone_max=100).per_client_cap == 25
    assert SessionPolicy(tombstone_max=2).per_client_cap == 1
    assert SessionPolicy(tombstone_max=0).per_client_cap == 0
    assert SessionPolicy(tombstone_max=100, tombstone_max_per_client=0).per_client_cap == 0
    assert SessionPolicy(tombstone_max=100, tombstone_max_per_client=7).per_client_cap == 7
    with pytest.raises(ValueError, match="tombstone_max_per_client"):
        SessionPolicy(tombstone_max_per_client=-1)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.2:5000", "127.0.0.2"),
        ("ipv6:[::1]:5000", "::1"),
        ("ipv6:%5B::1%5D:5000", "::1"),  # grpcio's form
        ("127.0.0.3:80", "127.0.0.3"),
        ("127.0.0.3", "127.0.0.3"),
        ("unix:/tmp/s", "unix:/tmp/s"),
        ("", ""),
    ],
)
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_client_key() -> None:
    assert client_key("") == 0
    assert client_key("127.0.0.2") == client_key("127.0.0.2") != client_key("127.0.0.3")
    assert 0 <= client_key("::1") < 2**64
    # IPv6 by its /64; an IPv4-mapped address as the IPv4 one
    assert client_key("2001:db8:1:2::5") == client_key("2001:db8:1:2:ffff::9") != client_key("2001:db8:1:3::5")
    assert client_key("::ffff:127.0.0.2") == client_key("127.0.0.2")
    assert client_key("fe80::1%eth0") == client_key("fe80::2")
    assert client_key("not:an:address") == client_key("not:an:address")


def test_many_clients_do_not_grow_memory_without_bound(core: Any) -> None:
    # each client's one tombstone is evicted by the total cap of 2 when the next arrives; the
    # books of clients that hold none are forgotten past 2 * max + 1024 of them
    c = core(max_tombstones=2, max_tombstones_per_client=1)
    for client in range(1, 3000):
        c.one_request_session(f"s-{client}", client)
    stats = c.sched.stats()
    assert stats.tombstones_evicted == 2997
    assert all(c.refusal(f"s-{k}", k).code is _core.Code.NOT_FOUND for k in (1, 1500, 2999))
