"""The shared-memory transport across processes (issue 27): several producer processes (each
with several threads) push checked records into the engine's rings, one consumer drains them in
C++; nothing lost, duplicated or reordered per producer, checksums equal, slab blocks written by
one process and freed by another, and no wake-up lost while the consumer sleeps between bursts.

Producers attach to the region from inherited descriptors (fork) or from descriptors received
over a Unix socket (SCM_RIGHTS) by a separately started interpreter."""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys
import textwrap
from multiprocessing.context import ForkProcess
from multiprocessing.queues import Queue

import pytest

from seqserve.engine._core import ShmRegion
from tests.support.paths import ROOT

MASK64 = (1 << 64) - 1
FORK = multiprocessing.get_context("fork")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd and eventfd are Linux's")


def produce_in_child(
    fds: tuple[int, int, list[int]], worker: int, producer: int, count: int, settings: dict[str, int], sums: Queue[int]
) -> None:
    region = ShmRegion.attach(*fds)
    sums.put(region.stress_produce(worker, producer, count, **settings))


def start_producers(
    region: ShmRegion, processes: int, count: int, sums: Queue[int], **settings: int
) -> list[ForkProcess]:
    fds = (region.fd, region.engine_eventfd, region.worker_eventfds)
    threads = settings.get("threads", 1)
    children = [
        FORK.Process(
            target=produce_in_child,
            args=(fds, p % region.workers, p * threads, count, settings, sums),
            daemon=True,
        )
        for p in range(processes)
    ]
    for child in children:
        child.start()
    return children


def finish(children: list[ForkProcess], sums: Queue[int]) -> int:
    total = sum(sums.get(timeout=120) for _ in children)
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    return total & MASK64


def test_millions_of_records_from_producer_processes_arrive_once_and_in_order() -> None:
    region = ShmRegion(workers=2, request_slots=1024)
    sums: Queue[int] = FORK.Queue()
    processes, threads, count = 4, 2, 250_000
    children = start_producers(region, processes, count, sums, threads=threads)
    result = region.stress_consume(processes * threads, processes * threads * count, sleep=True, limit=300)
    checksum = finish(children, sums)
    assert result["records"] == processes * threads * count
    assert result["misordered"] == 0 and result["bad"] == 0
    assert int(result["checksum"]) == checksum
    assert region.counters()["malformed"] == 0


def test_slab_blocks_travel_between_processes_and_come_back() -> None:
    # Few blocks: the producers run out and wait for the consumer's frees again and again.
    region = ShmRegion(workers=2, request_slots=64, slab_classes=[(256, 16), (1024, 4)])
    sums: Queue[int] = FORK.Queue()
    children = start_producers(region, 4, 50_000, sums, tensor_bytes=200)
    result = region.stress_consume(4, 200_000, sleep=True, limit=300)
    checksum = finish(children, sums)
    assert result["records"] == 200_000 and result["misordered"] == 0 and result["bad"] == 0
    assert int(result["checksum"]) == checksum
    for worker in range(2):
        assert region.free_blocks(worker, True) == 20


def test_a_consumer_sleeping_between_bursts_misses_no_wake_up() -> None:
    region = ShmRegion(workers=2, request_slots=16)
    sums: Queue[int] = FORK.Queue()
    children = start_producers(region, 3, 20_000, sums, threads=2, burst=3, pause_us=30)
    result = region.stress_consume(6, 120_000, sleep=True, sleep_timeout=2.0, limit=300)
    checksum = finish(children, sums)
    assert result["records"] == 120_000 and result["misordered"] == 0 and result["bad"] == 0
    assert int(result["checksum"]) == checksum
    assert result["rang"] > 0  # it did sleep and was woken
    # A wait that ran out while a record was there would be a lost wake-up.
    assert result["timed_out_with_work"] == 0


PRODUCER_SCRIPT = textwrap.dedent("""
    import socket, sys
    from seqserve.engine._core import ShmRegion

    sock = socket.socket(fileno=int(sys.argv[1]))
    _, fds, _, _ = socket.recv_fds(sock, 16, 8)
    region = ShmRegion.attach(fds[0], fds[1], fds[2:])
    print(region.stress_produce(1, 0, 100_000, threads=2, tensor_bytes=64))
""")


def test_a_separate_interpreter_attaches_with_descriptors_sent_over_a_socket() -> None:
    region = ShmRegion(workers=2, request_slots=256)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        child = subprocess.Popen(
            [sys.executable, "-c", PRODUCER_SCRIPT, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        socket.send_fds(ours, [b"region"], [region.fd, region.engine_eventfd, *region.worker_eventfds])
        result = region.stress_consume(2, 200_000, sleep=True, limit=300)
        out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    assert result["records"] == 200_000 and result["misordered"] == 0 and result["bad"] == 0
    assert int(result["checksum"]) == int(out) & MASK64


def consume_replies_in_child(fds: tuple[int, int, list[int]], expected: int, outcome: Queue[str]) -> None:
    region = ShmRegion.attach(*fds)
    seen = 0
    while seen < expected:
        reply = region.pop_reply(1)
        if reply is None:
            if not region.wait_replies(1, 60.0):
                outcome.put(f"no reply after {seen}")
                return
            continue
        seen += 1
        if reply[0] != seen or reply[1] != (seen % 10 == 0):
            outcome.put(f"reply {reply} where {seen} was due")
            return
    outcome.put("ok")


def test_replies_reach_a_sleeping_worker_process_in_order() -> None:
    region = ShmRegion(workers=2, reply_slots=16)
    outcome: Queue[str] = FORK.Queue()
    fds = (region.fd, region.engine_eventfd, region.worker_eventfds)
    child = FORK.Process(target=consume_replies_in_child, args=(fds, 30_000, outcome), daemon=True)
    child.start()
    handle = 1
    while handle <= 30_000:
        if region.push_reply(1, handle, final=handle % 10 == 0):
            handle += 1
        else:  # full: the worker is behind, wait for it as a real engine would
            child.join(timeout=0.0001)
    assert outcome.get(timeout=120) == "ok"
    child.join(timeout=60)
    assert child.exitcode == 0
