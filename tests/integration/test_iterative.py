"""Iterative sequences (request rescheduling) through a real `seqserve serve` and tritonclient's
gRPC stream: Triton's own qa/python_models/iterative_sequence model unmodified, and the
expectations of Triton's qa/L0_iterative_sequence (two responses 1, 0 for input 2; a backlog of
sequences filled; the START error when the idle timeout is shorter than a step; Triton's error
for models that cannot reschedule), then what rescheduling promises besides: implicit state
carried from step to step, the request's inputs kept, steps of several sequences batched
together, and a client that leaves ending its sequence."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.clients import SyncStream
from tests.support.iterative import write_countdown, write_triton_iterative
from tests.support.models import write_model
from tests.support.process import ServerProcess, serving

START_ERROR = "must specify the START flag on the first request of the sequence"
RESCHEDULE_ERROR = "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"

# N (INT32 [1]): steps in all; the implicit state STEP counts the steps run. Each step sends
# LEFT = N - STEP and BATCH = the requests in its execute call, then reschedules until LEFT is 0.
STEPPER = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = int(params.get("delay_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        time.sleep(self.delay_s)
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            step = pb_utils.get_input_tensor_by_name(request, "STEP").as_numpy() + 1
            left = (n - step).astype(np.int32)
            outputs = [
                pb_utils.Tensor("LEFT", left),
                pb_utils.Tensor("BATCH", np.full_like(left, len(requests))),
                pb_utils.Tensor("STEP_OUT", step.astype(np.int32)),
            ]
            sender = request.get_response_sender()
            if int(left.reshape(-1)[0]) > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(pb_utils.InferenceResponse(outputs))
            else:
                sender.send(pb_utils.InferenceResponse(outputs), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def stepper_config(name: str, *, mbs: int, delay_ms: int, idle_us: int = 5_000_000, strategy: str = "") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}
]
model_transaction_policy {{ decoupled: true }}
sequence_batching {{
  iterative_sequence: true
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  state [ {{
    input_name: "STEP" output_name: "STEP_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }}
  }} ]
}}
parameters {{ key: "delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("iterative-repo")
    write_triton_iterative(repo)
    write_triton_iterative(repo, "iterative_again")
    write_countdown(repo, "countdown", "sequence_batching { iterative_sequence: true }")
    write_countdown(
        repo,
        "backlog",
        "sequence_batching { iterative_sequence: true max_sequence_idle_microseconds: 8000000 "
        "direct { max_queue_delay_microseconds: 10000000 } }",
        delay_ms=50,
    )
    write_countdown(
        repo,
        "short_idle",
        "sequence_batching { iterative_sequence: true max_sequence_idle_microseconds: 200000 }",
        delay_ms=500,
    )
    write_countdown(repo, "plain_direct", "sequence_batching { direct { } iterative_sequence: false }")
    write_countdown(repo, "plain_oldest", "sequence_batching { oldest { } iterative_sequence: false }")
    write_countdown(repo, "plain_dynamic", "dynamic_batching { }")
    write_model(repo, "stepper", stepper_config("stepper", mbs=4, delay_ms=30), STEPPER)
    oldest = "oldest { max_candidate_sequences: 4 }"
    write_model(repo, "stepper_oldest", stepper_config("stepper_oldest", mbs=4, delay_ms=30, strategy=oldest), STEPPER)
    write_model(repo, "slow_stepper", stepper_config("slow_stepper", mbs=0, delay_ms=20), STEPPER)
    with serving(repo, log_dir=repo) as s:
        yield s


def int_input(name: str, value: int, shape: list[int]) -> grpcclient.InferInput:
    x = grpcclient.InferInput(name, shape, "INT32")
    x.set_data_from_numpy(np.full(shape, value, np.int32))
    return x


def collect(stream: SyncStream, n: int) -> list[tuple[Any, Any]]:
    return [stream.get(timeout=30) for _ in range(n)]


# ---------------------------------------------------------------- Triton's python model


def test_triton_iterative_model_answers_1_then_0(srv: ServerProcess) -> None:
    stream = SyncStream(srv)
    try:
        stream.send(model_name="iterative_sequence", inputs=[int_input("IN", 2, [1])])
        got = collect(stream, 2)
    finally:
        stream.close()
    assert [e for _, e in got] == [None, None]
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [1, 0]
    assert got[1][0].get_response().parameters["triton_final_response"].bool_param


# ------------------------------------------------------------- L0_iterative_sequence


def grpc_stream(
    srv: ServerProcess, model: str, *, num_requests: int = 1, sequence_id: int = 0, sequence_start: bool = False
) -> list[int]:
    """Triton's test_grpc_stream: input 2 per request, 2 responses each; raises the first error."""
    stream = SyncStream(srv)
    try:
        for _ in range(num_requests):
            stream.send(
                model_name=model,
                inputs=[int_input("INPUT", 2, [1, 1])],
                sequence_id=sequence_id,
                sequence_start=sequence_start,
            )
        values = []
        for result, error in collect(stream, 2 * num_requests):
            if error is not None:
                raise error
            values.append(int(result.as_numpy("OUTPUT")[0][0]))
        return values
    finally:
        stream.close()


def test_grpc_stream(srv: ServerProcess) -> None:
    assert grpc_stream(srv, "countdown") == [1, 0]


def test_backlog_fill(srv: ServerProcess) -> None:
    # one slot (max_batch_size 1, one instance): three sequences wait in the backlog
    values = grpc_stream(srv, "backlog", num_requests=4)
    assert sorted(values) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_reschedule_error(srv: ServerProcess) -> None:
    with pytest.raises(Exception, match=START_ERROR):
        grpc_stream(srv, "short_idle")


@pytest.mark.parametrize(("model", "sid"), [("plain_direct", 1), ("plain_oldest", 2)])
def test_unsupported_sequence_scheduler(srv: ServerProcess, model: str, sid: int) -> None:
    with pytest.raises(Exception, match=RESCHEDULE_ERROR):
        grpc_stream(srv, model, sequence_id=sid, sequence_start=True)


def test_unsupported_dynamic_scheduler(srv: ServerProcess) -> None:
    with pytest.raises(Exception, match=RESCHEDULE_ERROR):
        grpc_stream(srv, "plain_dynamic")


# ------------------------------------------------------------------ beyond the L0 test


@pytest.mark.parametrize("model", ["stepper", "stepper_oldest"])
def test_state_carried_inputs_kept_and_iterations_batched(srv: ServerProcess, model: str) -> None:
    n, sequences = 6, 4
    stream = SyncStream(srv)
    try:
        for i in range(sequences):
            stream.send(model_name=model, inputs=[int_input("N", n, [1, 1])], request_id=f"r{i}")
        got = collect(stream, n * sequences)
    finally:
        stream.close()
    assert all(e is None for _, e in got), [e for _, e in got if e is not None]
    by_request: dict[str, list[int]] = {}
    batches = []
    for result, _ in got:
        response = result.get_response()
        by_request.setdefault(response.id, []).append(int(result.as_numpy("LEFT")[0][0]))
        batches.append(int(result.as_numpy("BATCH")[0][0]))
    # one auto-assigned sequence per request: each counts down from its state, step by step
    assert len(got) == n * sequences and len(by_request) == sequences
    for values in by_request.values():
        assert values == list(range(n - 1, -1, -1))
    assert sorted(v for vs in by_request.values() for v in vs) == sorted(list(range(n)) * sequences)
    # the sequences' steps ran together (in-flight batching)
    assert max(batches) > 1


def test_client_that_leaves_ends_its_sequence(srv: ServerProcess) -> None:
    # one slot: a sequence that never ends would hold it; the client's leaving frees it
    stream = SyncStream(srv)
    stream.send(model_name="slow_stepper", inputs=[int_input("N", 1_000_000, [1])])
    first, error = stream.get(timeout=30)
    assert error is None and int(first.as_numpy("LEFT")[0]) == 999_999
    stream.client.stop_stream(cancel_requests=True)
    stream.client.close()
    time.sleep(0.2)
    stream = SyncStream(srv)
    try:
        stream.send(model_name="slow_stepper", inputs=[int_input("N", 2, [1])])
        got = collect(stream, 2)
    finally:
        stream.close()
    assert [int(r.as_numpy("LEFT")[0]) for r, _ in got] == [1, 0]


def test_explicit_sequence_id_ends_with_its_request(srv: ServerProcess) -> None:
    # a client-named sequence: START only; once the request is released for good the sequence is
    # over (a later non-START request for it needs START)
    stream = SyncStream(srv)
    try:
        stream.send(
            model_name="iterative_again", inputs=[int_input("IN", 2, [1])], sequence_id=4242, sequence_start=True
        )
        got = collect(stream, 2)
        assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [1, 0]
        time.sleep(0.1)
        stream.send(model_name="iterative_again", inputs=[int_input("IN", 2, [1])], sequence_id=4242)
        _, error = stream.get(timeout=30)
    finally:
        stream.close()
    assert error is not None and START_ERROR in str(error)


def test_a_rescheduled_step_goes_ahead_of_the_sequences_later_requests(srv: ServerProcess) -> None:
    # the client queues another request of the sequence while its iterative request runs: the
    # rescheduled steps come first (the sequence's next step), and the sequence ends with the
    # iterative request, so the later request is answered CANCELLED
    sid = 77_001
    stream = SyncStream(srv)
    try:
        stream.send(model_name="stepper", inputs=[int_input("N", 3, [1, 1])], sequence_id=sid, sequence_start=True)
        stream.send(model_name="stepper", inputs=[int_input("N", 3, [1, 1])], sequence_id=sid)
        got = collect(stream, 4)
    finally:
        stream.close()
    assert [int(r.as_numpy("LEFT")[0][0]) for r, e in got[:3]] == [2, 1, 0]
    assert got[3][1] is not None and "was ended" in str(got[3][1]), got[3]
