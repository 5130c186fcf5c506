"""Ragged batches (``allow_ragged_batch``), as Triton's L0_sequence_batcher
``test_ragged_batch_allowed`` runs them: a Direct sequence model with one instance, four
sequences whose inputs have 2, 2, 1 and 3 elements, held until every first step is queued
(TRITONSERVER_DELAY_SCHEDULER=12), so each of the three batches holds all four sequences. Each
request must reach the model intact and get a reply in its own shape.

The model does what Triton's ``sequence`` test backend does: per sequence slot an accumulator,
set on START to the sum of the input's elements and increased by that sum on every other
step; the reply has the request's input shape, every element the accumulator. Written both in
seqserve's batch-level API (which sees the ragged input end to end, with ``batch.ragged``) and
as a Triton Python model (which sees each request on its own)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support.clients import SyncStream
from tests.support.models import write_model
from tests.support.process import ServerProcess

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

# Batch-level API: row i is sequence slot i (Direct); the ragged INPUT is 1-D, every request's
# elements end to end, and batch.ragged["INPUT"] says where each request's part lies.
BATCH_MODEL = """
import numpy as np

class Model:
    def initialize(self, ctx):
        self.acc = np.zeros(8, dtype=np.int32)

    def execute(self, batch):
        start = batch.controls["START"][:, 0]
        ready = batch.controls["READY"][:, 0]
        outputs = []
        for slot, value in enumerate(batch.request_inputs("INPUT")):
            if ready[slot]:
                total = np.int32(value.sum())
                self.acc[slot] = total if start[slot] else self.acc[slot] + total
            outputs.append(np.full(value.shape, self.acc[slot], dtype=np.int32))
        return {"OUTPUT": outputs}  # one array per request: each has its request's shape
"""

# Triton's Python API: each request on its own, keyed by its correlation id.
TRITON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.acc = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0, 0]
            cid = request.correlation_id()
            total = int(value.sum())
            self.acc[cid] = total if start else self.acc[cid] + total
            out = np.full(value.shape, self.acc[cid], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""

# (correlation id, elements per request, the three step values), and Triton's expected final
# value: the sum of every element the sequence sent.
SEQUENCES = [
    (1001, 2, (1, 2, 3), 6 * 2),
    (1002, 2, (11, 12, 13), 36 * 2),
    (1003, 1, (111, 112, 113), 336),
    (1004, 3, (1111, 1112, 1113), 3336 * 3),
]


def _run_sequence(srv: ServerProcess, model: str, cid: int, n: int, values: tuple[int, ...]) -> list[np.ndarray]:
    """One sequence over a gRPC stream, as Triton's check_sequence_async sends it."""
    stream = SyncStream(srv)
    try:
        for k, value in enumerate(values):
            inp = grpcclient.InferInput("INPUT", [1, n], "INT32")
            inp.set_data_from_numpy(np.full((1, n), value, dtype=np.int32))
            stream.send(
                model,
                [inp],
                outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                sequence_id=cid,
                sequence_start=k == 0,
                sequence_end=k == len(values) - 1,
            )
        outs = []
        for _ in values:
            result, error = stream.get(timeout=20)
            if error is not None:
                raise error
            outs.append(result.as_numpy("OUTPUT"))
        return outs
    finally:
        stream.close()


@pytest.fixture
def ragged_server(
    tmp_path: Path, launch: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch
) -> ServerProcess:
    repo = tmp_path / "ragged_models"
    write_model(repo, "ragged_batch", CONFIG.format(name="ragged_batch"), BATCH_MODEL)
    write_model(repo, "ragged_triton", CONFIG.format(name="ragged_triton"), TRITON_MODEL)
    # Hold batch forming until 12 requests are queued, as Triton's test.sh sets it: the four
    # sequences' three steps then run as three batches of four.
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "12")
    monkeypatch.setenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", "0")
    return launch(repo)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("model", ["ragged_batch", "ragged_triton"])
def test_ragged_batch_allowed(ragged_server: ServerProcess, model: str) -> None:
    results: dict[int, list[np.ndarray]] = {}
    errors: list[BaseException] = []

    def run(cid: int, n: int, values: tuple[int, ...]) -> None:
        try:
            results[cid] = _run_sequence(ragged_server, model, cid, n, values)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(cid, n, values)) for cid, n, values, _ in SEQUENCES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for cid, n, values, expected in SEQUENCES:
        outs = results[cid]
        # every reply has its own request's shape, filled with the running sum
        assert [o.shape for o in outs] == [(1, n)] * 3, (cid, [o.shape for o in outs])
        running = np.cumsum([v * n for v in values]).tolist()
        assert [o.ravel().tolist() for o in outs] == [[s] * n for s in running], cid
        assert int(outs[-1][0][0]) == expected

    # As Triton's check_status(model, {4: 3}, 3, 12): three batches of four, 12 inferences.
    client = httpclient.InferenceServerClient(ragged_server.http_url)
    try:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    finally:
        client.close()
    assert stats["inference_count"] == 12
    assert stats["execution_count"] == 3
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {4: 3}
