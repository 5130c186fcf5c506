"""The engine's compiled path for the workers' rings (issue 27) across processes: forked worker
processes attach to the region from inherited descriptors, push the steps of their sequences
(each sequence's steps alternate between the two workers) and check every running sum in the
replies the engine's RingFeeder wrote in C++. In-process tests: tests/unit/test_ring_feeder.py."""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc
from seqserve.engine._core import RequestHeader, RingFeeder, ShmRegion
from seqserve.engine.model.loaded import LoadedModel
from tests.support.paths import ROOT

FORK = multiprocessing.get_context("fork")
SEQUENCES = 16
STEPS = 20
TARGET = 3

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd and eventfd are Linux's")


def worker_process(fds: tuple[int, int, list[int]], worker: int, go: Connection, result: Connection) -> None:
    """Step `worker`'s share of every sequence, one step of all of them at a time: each sequence's
    steps alternate between the workers, so each worker waits for the other's turn (`go`)."""
    region = ShmRegion.attach(*fds)
    wrong = 0
    for step in range(STEPS):
        go.recv()
        mine = [seq for seq in range(1, SEQUENCES + 1) if (seq + step) % 2 == worker]
        for seq in mine:
            value = np.array([[seq + step]], np.float32)
            block = region.alloc(worker, True, 4)
            np.frombuffer(region.buffer(block, 4), dtype=np.float32)[:] = value.ravel()
            header = RequestHeader(handle=step * 1000 + seq, sequence_id=seq, start=step == 0, end=step == STEPS - 1)
            while not region.push_request(worker, TARGET, header, [(0, block, 4, [1, 1])]):
                time.sleep(0.001)
        answered = 0
        while answered < len(mine):
            replies = region.pop_replies(worker)
            if not replies:
                region.wait_replies(worker, 1.0)
                continue
            for handle, _flags, code, _error, outputs in replies:
                seq = handle % 1000
                expected = sum(seq + s for s in range(step + 1))
                _, offset, nbytes, _ = outputs[0]
                got = float(np.frombuffer(region.buffer(offset, nbytes), dtype=np.float32)[0])
                wrong += code != 0 or got != expected
                region.free(worker, False, offset)
                answered += 1
        result.send(step)
    result.send(wrong)


def test_forked_workers_get_every_running_sum_from_the_compiled_path(tmp_path: Path) -> None:
    region = ShmRegion(workers=2)
    fds = (region.fd, region.engine_eventfd, region.worker_eventfds)
    go = [FORK.Pipe(duplex=False) for _ in range(2)]  # (child reads, engine writes)
    results = [FORK.Pipe(duplex=False) for _ in range(2)]  # (engine reads, child writes)
    # Forked before the engine starts its threads (the feeder's, the executors').
    children = [
        FORK.Process(target=worker_process, args=(fds, w, go[w][0], results[w][1]), daemon=True) for w in range(2)
    ]
    for child in children:
        child.start()
    source = ROOT / "src/seqserve/examples/models/accumulator"
    config = (source / "config.pbtxt").read_text().replace("direct { }", "oldest { max_candidate_sequences: 32 }")
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.py").write_text((source / "1" / "model.py").read_text())
    cfg = text_format.Parse(config, mc.ModelConfig())
    model = LoadedModel(cfg, version=1, model_dir=tmp_path, loop=asyncio.new_event_loop())
    feeder = RingFeeder(region)
    try:
        assert model.serve_rings(feeder, TARGET)
        for step in range(STEPS):
            for _, send in go:
                send.send(step)
            for receive, _ in results:
                assert receive.poll(60) and receive.recv() == step
        wrong = [receive.recv() for receive, _ in results]
        assert wrong == [0, 0]
        for child in children:
            child.join(timeout=30)
            assert child.exitcode == 0
        assert feeder.counters()["fast"] == SEQUENCES * STEPS and feeder.inflight(0) == feeder.inflight(1) == 0
    finally:
        feeder.close()
        model.close(force=True)
        for child in children:
            if child.is_alive():
                child.kill()
