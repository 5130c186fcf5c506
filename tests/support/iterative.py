"""Iterative sequence models for tests: Triton's own QA Python model (cached under
tests/data/triton_qa, see its README for origin and licence), and seqserve's stand-in for the C++
test backend that Triton's qa/L0_iterative_sequence serves (the same observable behaviour:
per sequence, the input is how many responses to send; each step sends the count left, after a
delay, and reschedules until none is left)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.models import write_model
from tests.support.paths import TESTS

TRITON_QA = TESTS / "data" / "triton_qa"

# INPUT (INT32 [1]) responses per sequence; OUTPUT = responses still to come after this one.
# Parameter delay_ms: how long each step takes before the request is released.
COUNTDOWN_BY_SEQUENCE = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay_s = int(params.get("delay_ms", {}).get("string_value", "0")) / 1000
        self.batched = json.loads(args["model_config"]).get("max_batch_size", 0) > 0
        self.left = {}

    def execute(self, requests):
        for request in requests:
            cid = request.correlation_id()
            first = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            left = self.left.get(cid, first) - 1
            if left > 0:
                self.left[cid] = left
            else:
                self.left.pop(cid, None)
            value = np.array([[left]] if self.batched else [left], np.int32)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", value)])
            time.sleep(self.delay_s)
            sender = request.get_response_sender()
            if left > 0:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def countdown_config(name: str, scheduling: str, *, delay_ms: int = 0, mbs: int = 1) -> str:
    """The L0 test's model config (INPUT/OUTPUT INT32 [1], decoupled) with `scheduling`."""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
{scheduling}
parameters {{ key: "delay_ms" value: {{ string_value: "{delay_ms}" }} }}
instance_group [ {{ kind: KIND_CPU }} ]
"""


def write_countdown(repo: Path, name: str, scheduling: str, *, delay_ms: int = 0, mbs: int = 1) -> Path:
    config = countdown_config(name, scheduling, delay_ms=delay_ms, mbs=mbs)
    return write_model(repo, name, config, COUNTDOWN_BY_SEQUENCE)


def write_triton_iterative(repo: Path, name: str = "iterative_sequence") -> Path:
    """Triton's qa/python_models/iterative_sequence, unmodified (its config names it
    iterative_sequence; another `name` renames it in the config only)."""
    src = TRITON_QA / "iterative_sequence"
    dst = repo / name
    (dst / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "model.py.txt", dst / "1" / "model.py")
    config = (src / "config.pbtxt").read_text()
    (dst / "config.pbtxt").write_text(config.replace('name: "iterative_sequence"', f'name: "{name}"', 1))
    return dst
