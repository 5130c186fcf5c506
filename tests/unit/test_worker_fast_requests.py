"""A worker's side of the engine's compiled path (api/workers/fast_requests.py): which requests
go that way, the validation (the engine's own words: a refused request goes the slow way), and
the replies turned into results and errors as one process gives them."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc
from seqserve.api.workers import fast_requests
from seqserve.api.workers.fast_requests import FastRequest
from seqserve.api.workers.snapshot import ModelEntry
from seqserve.engine import SERVER_STOPPING, Code, InferRequest, InferResult
from seqserve.engine._core import REPLY_BACKLOG_FULL, REPLY_ERROR, REPLY_FINAL, REPLY_RELEASED, REPLY_RETRY_SHIFT
from seqserve.engine.replicas.checkpoint import SequenceReleasedError
from tests.support.paths import DEMO_REPO

ACCUMULATOR = DEMO_REPO / "accumulator"
ADD_SUB = DEMO_REPO / "add_sub"
ADD_SUB_SHAPE = (1, 4)  # one row of a batch


def _entry(*, fast: bool = True, sequence: bool = True) -> ModelEntry:
    cfg = text_format.Parse((ACCUMULATOR / "config.pbtxt").read_text(), mc.ModelConfig())
    return ModelEntry(7, False, sequence, cfg, str(ACCUMULATOR), fast)


def _request(**kw: object) -> InferRequest:
    fields: dict[str, object] = {
        "model": "accumulator",
        "inputs": {"INPUT": np.ones((1, 1), np.float32)},
        "sequence_id": 5,
        "sequence_start": True,
    }
    return InferRequest(**(fields | kw))  # type: ignore[arg-type]


def _add_sub_entry(*, decoupled: bool = False) -> ModelEntry:
    cfg = text_format.Parse((ADD_SUB / "config.pbtxt").read_text(), mc.ModelConfig())
    return ModelEntry(8, decoupled, False, cfg, str(ADD_SUB), True)


def _add_sub_request(**kw: object) -> InferRequest:
    x = np.ones(ADD_SUB_SHAPE, np.float32)
    return InferRequest(**({"model": "add_sub", "inputs": {"INPUT0": x, "INPUT1": x}} | kw))  # type: ignore[arg-type]


def test_only_fast_targets_of_models_that_are_not_decoupled_have_a_fast_form() -> None:
    assert fast_requests.fast_model("accumulator", 1, _entry()) is not None
    assert fast_requests.fast_model("accumulator", 1, _entry(fast=False)) is None
    model = fast_requests.fast_model("add_sub", 1, _add_sub_entry())
    assert model is not None and not model.is_sequence
    assert fast_requests.fast_model("add_sub", 1, _add_sub_entry(decoupled=True)) is None


@pytest.mark.parametrize(
    ("kw", "session_name", "scope", "fast"),
    [
        ({}, None, 0, True),
        ({"sequence_id": "abc"}, None, 0, True),
        ({"sequence_id": 0}, None, 0, False),  # the engine picks an id
        ({"session": True, "sequence_id": "s"}, "s", 0, False),
        ({}, None, 3, False),  # a stream scope
        ({"parameters": {"x": 1}}, None, 0, False),  # the model may read them
    ],
)
def test_which_requests_take_the_compiled_path(
    kw: dict[str, object], session_name: str | None, scope: int, fast: bool
) -> None:
    assert fast_requests.takes(_request(**kw), session_name, scope) is fast


@pytest.mark.parametrize(
    ("kw", "fast"),
    [
        ({}, True),
        ({"sequence_id": 9, "sequence_start": True}, True),  # ignored, as one process ignores it
        ({"id": "mine"}, False),  # a failed batch's words would name the engine's id, not this
        ({"parameters": {"x": 1}}, False),
        ({"session": True, "sequence_id": "s"}, False),
    ],
)
def test_which_requests_to_a_model_without_a_sequence_batcher_take_the_compiled_path(
    kw: dict[str, object], fast: bool
) -> None:
    assert fast_requests.takes(_add_sub_request(**kw), None, 0, is_sequence=False) is fast


def test_a_submit_refusal_of_a_model_without_a_sequence_batcher_names_the_request_id() -> None:
    model = fast_requests.fast_model("add_sub", 1, _add_sub_entry())
    assert model is not None
    checked = fast_requests.check(model, _add_sub_request())
    assert checked is not None and checked.corrid == 0
    fast = FastRequest(model, checked)
    flags = REPLY_FINAL | REPLY_ERROR
    unavailable = int(Code.UNAVAILABLE)
    full = fast_requests.error_of(fast, flags, unavailable, "Exceeds maximum queue size")
    assert (full.code, full.message) == (Code.UNAVAILABLE, "[request id: <id_unknown>] Exceeds maximum queue size")
    assert full.retry_after_s is None
    stopping = fast_requests.error_of(fast, flags, unavailable, SERVER_STOPPING)
    assert stopping.message == f"[request id: <id_unknown>] {SERVER_STOPPING}"
    # what the core reports after queueing, and a model's failure, carry none (as in one process)
    assert fast_requests.error_of(fast, flags, unavailable, "Request timeout expired").message == (
        "Request timeout expired"
    )
    failed = fast_requests.error_of(fast, flags, int(Code.INTERNAL), "boom (request id 1a2b)")
    assert failed.message == "boom (request id 1a2b)"


def test_a_request_the_validator_refuses_goes_the_slow_way() -> None:
    model = fast_requests.fast_model("accumulator", 1, _entry())
    assert model is not None
    assert fast_requests.check(model, _request()) is not None
    assert fast_requests.check(model, _request(inputs={"INPUT": np.ones((1, 2), np.float32)})) is None
    assert fast_requests.check(model, _request(inputs={"INPUT": np.ones((1, 1), np.int32)})) is None


def test_a_reply_becomes_the_result_one_process_gives() -> None:
    model = fast_requests.fast_model("accumulator", 1, _entry())
    assert model is not None
    checked = fast_requests.check(model, _request(id="r1"))
    assert checked is not None
    fast = FastRequest(model, checked)
    data = np.array([[4.5]], np.float32)
    result = fast_requests.result_of(fast, [(0, (data.tobytes(), (1, 1)))])
    assert isinstance(result, InferResult)
    assert (result.model_name, result.model_version, result.id) == ("accumulator", "1", "r1")
    assert result.outputs["OUTPUT"].tolist() == [[4.5]]
    missing = fast_requests.result_of(fast, [])
    assert not isinstance(missing, InferResult)
    assert missing.code is Code.INTERNAL and "did not produce output 'OUTPUT'" in missing.message


def test_refusals_read_as_submit_raises_them() -> None:
    model = fast_requests.fast_model("accumulator", 1, _entry())
    assert model is not None
    checked = fast_requests.check(model, _request(id="r2"))
    assert checked is not None
    fast = FastRequest(model, checked)
    flags = REPLY_FINAL | REPLY_ERROR
    full = fast_requests.error_of(fast, flags | REPLY_BACKLOG_FULL, int(Code.UNAVAILABLE), "backlog full")
    assert full.code is Code.UNAVAILABLE and full.retry_after_s == 1.0 and full.message == "backlog full"
    later = fast_requests.error_of(fast, flags | (2500 << REPLY_RETRY_SHIFT), int(Code.UNAVAILABLE), "later")
    assert later.retry_after_s == 2.5
    released = fast_requests.error_of(fast, flags | REPLY_RELEASED, int(Code.INVALID_ARG), "moved")
    assert isinstance(released, SequenceReleasedError)
    failed = fast_requests.error_of(fast, flags, int(Code.INTERNAL), "model failed (request id 1a2b)")
    assert failed.code is Code.INTERNAL and failed.message == "model failed (request id 1a2b)"


@pytest.mark.parametrize(
    "batching",
    [
        "",
        "dynamic_batching { }",
        "dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
        "dynamic_batching { priority_levels: 2 priority_queue_policy { key: 1 value: { max_queue_size: 1 } } }",
    ],
)
def test_a_model_whose_queue_refuses_requests_takes_the_fast_path_too(batching: str) -> None:
    """The compiled path counts a full queue's refusals as REJECTED, as one process does
    (tests/integration/test_workers.py compares the metrics)."""
    entry = _add_sub_entry()
    text_format.Merge(batching, entry.config)
    assert fast_requests.fast_model("add_sub", 1, entry) is not None
