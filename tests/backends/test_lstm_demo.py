"""The demo LSTM (src/seqserve/examples/models/lstm) through the real server.

50 sequences of random length are streamed step by step over one gRPC stream
(tritonclient), their steps interleaved, so the server batches steps of different sequences
and carries each one's h/c as implicit state (8 slots; the rest wait in the backlog). Every
step's output must equal running the whole sequence at once offline, in numpy, with the
weights read back from the ONNX initializers.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime  # noqa: F401  (a runtime dependency: missing, it is an error, not a skip)
import pytest
import tritonclient.grpc as grpcclient
from onnx import numpy_helper

from tests.support.paths import DEMO_REPO
from tests.support.process import ServerProcess, serving

MODEL = "lstm"
MODEL_FILE = DEMO_REPO / MODEL / "1" / "model.onnx"
SEQUENCES = 50
INPUT_SIZE, HIDDEN = 8, 16


def lstm_weights(path: Path = MODEL_FILE) -> dict[str, np.ndarray]:
    graph = onnx.load(str(path)).graph
    return {t.name: numpy_helper.to_array(t) for t in graph.initializer}


def lstm_reference(xs: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """The whole sequence at once, in float64: outputs h_t for every step t, from h = c = 0.
    Gates in the order i, f, g, o (as tools/make_lstm.py lays them out)."""
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    W, R, B = (w[k].astype(np.float64) for k in ("W", "R", "B"))
    h = np.zeros(HIDDEN)
    c = np.zeros(HIDDEN)
    out = []
    for x in xs.astype(np.float64):
        z = x @ W + h @ R + B
        i, f, g, o = np.split(z, 4)
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        out.append(h)
    return np.array(out)


def _put(q: queue.Queue[tuple[Any, Any]], result: Any, error: Any) -> None:
    q.put((result, error))


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(DEMO_REPO, log_dir=tmp_path_factory.mktemp("lstm-logs")) as srv:
        yield srv


def test_weights_are_the_committed_ones() -> None:
    w = lstm_weights()
    assert {k: v.shape for k, v in w.items() if k in "WRB"} == {
        "W": (INPUT_SIZE, 4 * HIDDEN),
        "R": (HIDDEN, 4 * HIDDEN),
        "B": (4 * HIDDEN,),
    }


def test_lstm_streamed_sequences_match_offline(demo_server: ServerProcess) -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 25, size=SEQUENCES)
    inputs = {
        sid: rng.standard_normal((n, INPUT_SIZE)).astype(np.float32)
        for sid, n in zip(range(1, 51), lengths, strict=True)
    }
    w = lstm_weights()
    expected = {sid: lstm_reference(xs, w) for sid, xs in inputs.items()}

    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(demo_server.grpc_url)
    client.start_stream(callback=partial(_put, results))
    t0 = time.monotonic()
    try:
        total = 0
        # round-robin over the sequences: step 0 of each, then step 1 of each still running, ...
        for step in range(int(lengths.max())):
            for sid, xs in inputs.items():
                if step >= len(xs):
                    continue
                inp = grpcclient.InferInput("INPUT", [1, INPUT_SIZE], "FP32")
                inp.set_data_from_numpy(xs[step : step + 1])
                client.async_stream_infer(
                    MODEL,
                    [inp],
                    request_id=f"{sid}:{step}",
                    sequence_id=sid,
                    sequence_start=step == 0,
                    sequence_end=step == len(xs) - 1,
                )
                total += 1
        got: dict[tuple[int, int], np.ndarray] = {}
        for _ in range(total):
            result, error = results.get(timeout=30)
            assert error is None, error
            sid, step = map(int, result.get_response().id.split(":"))
            got[(sid, step)] = result.as_numpy("OUTPUT")
    finally:
        client.stop_stream()
        client.close()
    elapsed = time.monotonic() - t0

    assert len(got) == total == int(lengths.sum())
    for (sid, step), out in got.items():
        assert out.shape == (1, HIDDEN) and out.dtype == np.float32
        np.testing.assert_allclose(out[0], expected[sid][step], rtol=1e-4, atol=1e-5, err_msg=f"seq {sid} step {step}")

    stats = grpcclient.InferenceServerClient(demo_server.grpc_url).get_inference_statistics(MODEL, as_json=True)
    st = stats["model_stats"][0]
    executions, inferences = int(st["execution_count"]), int(st["inference_count"])
    assert inferences >= total
    assert executions < inferences  # steps of different sequences shared batches
    print(f"\n{total} steps of {SEQUENCES} sequences in {elapsed:.2f} s; {executions} batches")
