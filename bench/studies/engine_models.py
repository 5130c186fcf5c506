"""The python-backend models the engine studies (``engine``, ``engine_scale``) load: one sequence
model config (FP32 ``INPUT`` [1] -> ``OUTPUT`` [1], optionally an implicit FP32 state) and two
bodies: an echo, and an accumulator that records where and when it ran."""

from __future__ import annotations

import sys
from pathlib import Path

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}{state}
}}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
"""

STATE = """
  state [ {{
    input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ {elems} ]
    initial_state {{ name: "zero" data_type: TYPE_FP32 dims: [ {elems} ] zero_data: true }}
  }} ]"""

ECHO_MODEL_PY = """\
class Model:
    def execute(self, batch):
        return {"OUTPUT": batch.inputs["INPUT"]}
"""

# The accumulator adds INPUT to its state; while RECORD[0] it records each batch, and it notes the
# threads it ran on (engine_scale tells the core's executor threads from its reaper by them).
PROBE_MODEL_PY = """\
import threading
import time

SCALE_PROBE_MODEL = {name!r}
PROBE = []  # per batch, while RECORD[0]: (t_enter_ns, t_exit_ns, corrid, ready)
RECORD = [False]
TIDS = set()  # native ids of the threads execute() ran on
_perf = time.perf_counter_ns
_tid = threading.get_native_id


class Model:
    def execute(self, batch):
        t0 = _perf()
        TIDS.add(_tid())
        total = batch.states["SUM_IN"] + batch.inputs["INPUT"]
        out = {{"OUTPUT": total[:, :1], "SUM_OUT": total}}
        if RECORD[0]:
            PROBE.append((t0, _perf(), batch.corrid.copy(), batch.ready.copy()))
        return out
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sequence_config(
    name: str,
    *,
    mbs: int,
    strategy: str = "direct",
    capacity: int = 0,
    idle_us: int = 600_000_000,
    instances: int = 1,
    state_elems: int = 0,
) -> str:
    """``strategy`` "direct", or "oldest" with ``capacity`` candidate sequences; no state when
    ``state_elems`` is 0."""
    strat = "direct { }" if strategy == "direct" else f"oldest {{ max_candidate_sequences: {capacity} }}"
    state = STATE.format(elems=state_elems) if state_elems else ""
    return CONFIG.format(name=name, mbs=mbs, idle_us=idle_us, strategy=strat, state=state, instances=instances)


def write_model(root: Path, name: str, config: str, model_py: str) -> None:
    d = root / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(config)
    (d / "1" / "model.py").write_text(model_py)
