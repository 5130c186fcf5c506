"""Triton's sequence QA ensembles against a real `seqserve serve`, with tritonclient over HTTP,
gRPC and the gRPC stream.

The models are those `gen_qa_sequence_models.py --onnx --ensemble` writes (built by
tests/support/ensemble_models.py): `simple_`, `sequence_` and `fan_` ensembles around the
onnx sequence models, OUTPUT = READY * (INPUT + START). The cases are those of Triton's
`qa/L0_sequence_batcher/sequence_batcher_test.py` with ENSEMBLES=1, with its expectations:
the result of each step, the errors of a step reported "in ensemble '<ensemble>', ..." with
the step model's own message, the ensemble's statistics (each request one execution of batch
size 1), and sequences batched together on the step model when the scheduler is held
(TRITONSERVER_DELAY_SCHEDULER).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the QA ensembles are built with onnx")
pytest.importorskip("onnxruntime", reason="the QA ensembles' step models run on onnxruntime")

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.ensemble_models import sequence_ensembles, split_model
from tests.support.process import ServerProcess, serving

PROTOCOLS = ("http", "grpc")
PREFIXES = ("simple_", "sequence_", "fan_")


def _repo(root: Path) -> tuple[Path, list[str]]:
    repo = root / "models"
    repo.mkdir()
    names = sequence_ensembles(repo, "int32", 8) + sequence_ensembles(repo, "int32", 0)
    names += sequence_ensembles(repo, "object", 8)[:1]
    return repo, names


@pytest.fixture(scope="module")
def qa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[str]]]:
    repo, names = _repo(tmp_path_factory.mktemp("qa-ensembles"))
    with serving(repo, log_dir=repo.parent) as srv:
        yield srv, names


def _base(ensemble: str) -> str:
    return next(ensemble[len(p) :] for p in PREFIXES if ensemble.startswith(p))


def _tensor(ensemble: str, value: int) -> np.ndarray:
    shape = (1,) if "nobatch" in ensemble else (1, 1)
    if ensemble.endswith("object"):
        return np.full(shape, str(value).encode(), dtype=object)
    return np.full(shape, value, dtype=np.int32)


def _value(out: np.ndarray) -> int:
    item = out.reshape(-1)[0]
    return int(item.decode() if isinstance(item, bytes) else item)


def _infer(url: str, protocol: str, model: str, value: int, seq: Any, flags: str | None) -> int:
    """One request; OUTPUT as an int."""
    lib: Any = httpclient if protocol == "http" else grpcclient
    data = _tensor(model, value)
    inp = lib.InferInput("INPUT", list(data.shape), "BYTES" if data.dtype == object else "INT32")
    inp.set_data_from_numpy(data)
    client = lib.InferenceServerClient(url)
    try:
        result = client.infer(
            model,
            [inp],
            outputs=[lib.InferRequestedOutput("OUTPUT")],
            sequence_id=seq,
            sequence_start=bool(flags and "start" in flags),
            sequence_end=bool(flags and "end" in flags),
        )
    finally:
        client.close()
    return _value(result.as_numpy("OUTPUT"))


def _url(srv: ServerProcess, protocol: str) -> str:
    return srv.http_url if protocol == "http" else srv.grpc_url


def _stats(srv: ServerProcess, model: str) -> tuple[dict[int, int], int, int]:
    """(batch size -> executions, execution count, inference count) of a model's version 1."""
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        s = client.get_inference_statistics(model, "1").model_stats[0]
    finally:
        client.close()
    return {b.batch_size: b.compute_infer.count for b in s.batch_stats}, s.execution_count, s.inference_count


def _check_sequence(
    srv: ServerProcess, protocol: str, model: str, seq: Any, steps: list[tuple[str | None, int]]
) -> int:
    """Run the steps; each answer is READY * (INPUT + START) (the QA onnx models do not
    accumulate). Returns the last."""
    out = 0
    for flags, value in steps:
        out = _infer(_url(srv, protocol), protocol, model, value, seq, flags)
        assert out == value + (1 if flags and "start" in flags else 0), (model, flags, value, out)
    return out


# ------------------------------------------------------------------- the L0 cases


def test_the_qa_ensembles_load(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        index = {m.name: m.state for m in client.get_model_repository_index().models}
        for name in names:
            assert index[name] == "READY", name
            config = client.get_model_config(name).config
            assert config.platform == "ensemble"  # sequence_util.check_setup skips the batcher check
            assert client.get_model_metadata(name).platform == "ensemble"
    finally:
        client.close()


def test_simple_sequence(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        before = _stats(srv, name)
        for idx, protocol in enumerate(PROTOCOLS):
            steps = [("start", 1), *((None, v) for v in range(2, 9)), ("end", 9)]
            assert _check_sequence(srv, protocol, name, 5 + idx, steps) == 9
        batches, executions, inferences = _stats(srv, name)
        assert batches.get(1, 0) - before[0].get(1, 0) == 18
        assert (executions - before[1], inferences - before[2]) == (18, 18)


def test_length1_sequence(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        for idx, protocol in enumerate(PROTOCOLS):
            assert _check_sequence(srv, protocol, name, 99 + idx, [("start,end", 42)]) == 43


def test_no_correlation_id(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        for protocol in PROTOCOLS:
            with pytest.raises(InferenceServerException) as e:
                _check_sequence(srv, protocol, name, 0, [("start", 1), ("end", 9)])
            assert e.value.message().startswith(
                f"in ensemble '{name}', inference request to model '{_base(name)}' must specify a non-zero or "
                "non-empty correlation ID"
            ), e.value.message()


def test_no_sequence_start(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        for protocol in PROTOCOLS:
            with pytest.raises(InferenceServerException) as e:
                _check_sequence(srv, protocol, name, 37469245, [(None, 1), (None, 2), ("end", 3)])
            assert e.value.message().startswith(
                f"in ensemble '{name}', inference request for sequence 37469245 to model '{_base(name)}' must "
                "specify the START flag on the first request of the sequence"
            ), e.value.message()


def test_no_sequence_start2(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        for protocol in PROTOCOLS:
            seq = 3 if protocol == "http" else 4
            with pytest.raises(InferenceServerException) as e:
                _check_sequence(srv, protocol, name, seq, [("start", 1), (None, 2), ("end", 3), (None, 55)])
            assert e.value.message().startswith(
                f"in ensemble '{name}', inference request for sequence {seq} to model '{_base(name)}' must "
                "specify the START flag on the first request of the sequence"
            ), e.value.message()


def test_no_sequence_end(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        for idx, protocol in enumerate(PROTOCOLS):
            steps = [("start", 1), (None, 2), ("start", 42), ("end", 9)]
            assert _check_sequence(srv, protocol, name, 4566 + idx, steps) == 9


def test_sequence_ids_as_strings(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in names:
        for protocol in PROTOCOLS:
            _check_sequence(srv, protocol, name, f"ens-{protocol}", [("start", 3), (None, 4), ("end", 5)])


def _stream_sequence(srv: ServerProcess, model: str, seq: int, steps: list[tuple[str | None, int]]) -> list[int]:
    """Every step of one sequence sent at once on one gRPC stream (sequence_util's
    check_sequence_async); the answers in order."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        for flags, value in steps:
            data = _tensor(model, value)
            inp = grpcclient.InferInput("INPUT", list(data.shape), "INT32")
            inp.set_data_from_numpy(data)
            client.async_stream_infer(
                model,
                [inp],
                outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                sequence_id=seq,
                sequence_start=bool(flags and "start" in flags),
                sequence_end=bool(flags and "end" in flags),
            )
        out = []
        for _ in steps:
            result, error = answers.get(timeout=60)
            if error is not None:
                raise error
            out.append(_value(result.as_numpy("OUTPUT")))
        return out
    finally:
        client.stop_stream()
        client.close()


def test_stream_sequence(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, names = qa
    for name in (n for n in names if n.endswith("int32")):
        assert _stream_sequence(srv, name, 777, [("start", 1), (None, 2), (None, 3), ("end", 4)]) == [2, 2, 3, 4]


@pytest.fixture(scope="module")
def delayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The QA ensembles with the schedulers held until 8 requests are queued (test.sh's
    TRITONSERVER_DELAY_SCHEDULER=8 for test_half_batch)."""
    repo, _ = _repo(tmp_path_factory.mktemp("qa-ensembles-delayed"))
    env = {"TRITONSERVER_DELAY_SCHEDULER": "8", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "0"}
    with serving(repo, log_dir=repo.parent, env=env) as srv:
        yield srv


@pytest.mark.parametrize("prefix", PREFIXES)
def test_half_batch(delayed: ServerProcess, prefix: str) -> None:
    """Two sequences of four on two streams at once: each gets its own answers, the ensemble
    counts 8 executions of batch size 1 ("Requests do not get batched for the ensemble model"),
    and the step model ran every one of them."""
    name = f"{prefix}onnx_sequence_int32"
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(seq: int, values: tuple[int, ...]) -> None:
        steps = [("start" if i == 0 else ("end" if i == len(values) - 1 else None), v) for i, v in enumerate(values)]
        try:
            results[seq] = _stream_sequence(delayed, name, seq, steps)
        except BaseException as e:  # reported below, on the test's thread
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=(987, (1, 2, 3, 4))),
        threading.Thread(target=run, args=(988, (0, 9, 5, 13))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert results == {987: [2, 2, 3, 4], 988: [1, 9, 5, 13]}
    assert _stats(delayed, name) == ({1: 8}, 8, 8)
    assert _stats(delayed, "onnx_sequence_int32")[2] >= 8


# ------------------------------------------------------- a decoupled step, errors over HTTP


SPLIT_ENSEMBLE = """
name: "split_then_sequence"
platform: "ensemble"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "split" model_version: -1
      input_map { key: "X" value: "INPUT" } output_map { key: "Y" value: "part" } },
    { model_name: "onnx_nobatch_sequence_int32" model_version: -1
      input_map { key: "INPUT" value: "part" } output_map { key: "OUTPUT" value: "OUTPUT" } }
  ]
}
"""


def test_a_decoupled_step_streams_over_grpc(tmp_path: Path, launch: Any) -> None:
    """A decoupled step's responses each run the sequence step after it, under the request's
    sequence id and flags; the ensemble answers once per response on the stream."""
    repo = tmp_path / "models"
    sequence_ensembles(repo, "int32", 0)
    (repo / "split" / "1").mkdir(parents=True)
    split_model(repo)
    (repo / "split_then_sequence" / "1").mkdir(parents=True)
    (repo / "split_then_sequence" / "config.pbtxt").write_text(SPLIT_ENSEMBLE)
    srv = launch(repo)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    assert client.get_model_config("split_then_sequence").config.model_transaction_policy.decoupled
    client.start_stream(lambda result, error: answers.put((result, error)))
    try:
        data = np.array([4, 5, 6], np.int32)
        inp = grpcclient.InferInput("INPUT", [3], "INT32")
        inp.set_data_from_numpy(data)
        client.async_stream_infer("split_then_sequence", [inp], sequence_id=31, sequence_start=True, sequence_end=True)
        got = []
        while len(got) < 3:
            result, error = answers.get(timeout=60)
            assert error is None, error
            got.append(_value(result.as_numpy("OUTPUT")))
    finally:
        client.stop_stream()
        client.close()
    # each part ran the sequence step with START (and END): READY * (INPUT + START)
    assert sorted(got) == [5, 6, 7]
    s = _stats(srv, "onnx_nobatch_sequence_int32")
    assert s[2] == 3  # three step requests, one per response of the decoupled step


def test_step_errors_keep_their_status_over_http(qa: tuple[ServerProcess, list[str]]) -> None:
    srv, _ = qa
    with pytest.raises(InferenceServerException) as e:
        _infer(srv.http_url, "http", "fan_onnx_sequence_int32", 1, 8181, None)
    assert e.value.status() == "400"
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        inp = httpclient.InferInput("WRONG", [1, 1], "INT32")
        inp.set_data_from_numpy(np.ones((1, 1), np.int32))
        with pytest.raises(InferenceServerException, match="unexpected inference input 'WRONG'"):
            client.infer("fan_onnx_sequence_int32", [inp], sequence_id=1, sequence_start=True)
    finally:
        client.close()


def test_an_idle_sequence_times_out_through_the_ensemble(tmp_path: Path, launch: Any) -> None:
    """The step model's idle timeout ends a sequence started through an ensemble (as in L0's
    test_backlog_sequence_timeout, with a 0.5 s timeout instead of 5 s): the next request
    without START is refused with the step's START error."""
    repo = tmp_path / "models"
    names = sequence_ensembles(repo, "int32", 8)
    config = repo / "onnx_sequence_int32" / "config.pbtxt"
    idle = ("max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: 500000")
    config.write_text(config.read_text().replace(*idle))
    srv = launch(repo)
    for seq, name in enumerate(names, start=1001):
        for protocol in PROTOCOLS:
            assert _check_sequence(srv, protocol, name, seq, [("start", 1)]) == 2
            time.sleep(1.5)
            with pytest.raises(InferenceServerException) as e:
                _check_sequence(srv, protocol, name, seq, [(None, 3)])
            assert e.value.message().startswith(
                f"in ensemble '{name}', inference request for sequence {seq} to model 'onnx_sequence_int32' must "
                "specify the START flag on the first request of the sequence"
            ), e.value.message()
