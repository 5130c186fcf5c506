"""Test models as code: the model sources and config snippets several modules use, the writers
that put a model into a tmp repository, and the records a loaded Python model keeps.

Shared models that are plain files live in tests/models/<name>/ (`copy_model` puts one into a
repository); the ones here are generated (`state_config`, `identity_config`) or read back by
the tests through their module-level records.
"""

from __future__ import annotations

import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.support.paths import BRIEF, DEMO_REPO, MODELS

# ------------------------------------------------------------------------ model sources

# A batch-level Python model that records what it saw, for scheduler tests. Each execute
# call appends one dict per batch to the module-level list RECORD (see `recorded`).
RECORDING_MODEL = """
import numpy as np
RECORD = []

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        RECORD.append({
            "instance": self.instance,
            "size": batch.size,
            "inputs": {k: v.copy() for k, v in batch.inputs.items()},
            "controls": {k: v.copy() for k, v in batch.controls.items()},
            "states": {k: v.copy() for k, v in batch.states.items()},
            "start": batch.start.copy(), "end": batch.end.copy(), "ready": batch.ready.copy(),
            "corrid": batch.corrid.copy(),
        })
        out = {}
        for name, value in batch.inputs.items():
            out["OUT_" + name[3:] if name.startswith("IN_") else "OUTPUT"] = value.copy()
        return out
"""

# OUT_X = S + IN_X for the model's one implicit state S: input "ACC" with output "ACC_OUT"
# (ACC_STATE below), or a named state such as "S" (input and output of one name). The new S is
# the output state; padding rows get a poison value, which a scheduler that kept a padding row's
# state would show. RECORD keeps every batch, as RECORDING_MODEL does.
ACCUM_MODEL = """
import numpy as np
RECORD = []

class Model:
    def initialize(self, ctx):
        self.instance = ctx.index

    def execute(self, batch):
        (name,) = batch.states
        acc = batch.states[name]
        x = batch.inputs["IN_X"]
        RECORD.append({
            "instance": self.instance, "size": batch.size,
            "inputs": {k: v.copy() for k, v in batch.inputs.items()},
            "controls": {k: v.copy() for k, v in batch.controls.items()},
            "states": {k: v.copy() for k, v in batch.states.items()},
            "start": batch.start.copy(), "end": batch.end.copy(), "ready": batch.ready.copy(),
            "corrid": batch.corrid.copy(),
        })
        new = (acc + x).astype(acc.dtype)
        ready = batch.ready.reshape((-1,) + (1,) * (new.ndim - 1))
        out_name = "ACC_OUT" if name == "ACC" else name
        return {"OUT_X": new, out_name: np.where(ready, new, -1000).astype(acc.dtype)}
"""

# The implicit state ACCUM_MODEL uses by default (a sequence_batching `state` entry).
ACC_STATE = """
  state [ {
    input_name: "ACC" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }
  } ]
"""

# The brief configs (tests/data/brief_configs) served with the python backend (`python_brief`).
BRIEF_A_MODEL = '''
import numpy as np
RECORD = []

class Model:
    """lstm_state[:, 0, 0] keeps the running sum of INPUT__0[:, 0]; OUTPUT__0 = the new state[:, 0, :10]."""

    def execute(self, batch):
        x = batch.inputs["INPUT__0"]
        st = batch.states["lstm_state"]
        RECORD.append({"size": batch.size, "state_shape": st.shape, "corrid": batch.corrid.tolist(),
                       "ready": batch.ready.tolist()})
        new = st.copy()
        new[:, 0, 0] += x[:, 0]
        new[:, 1, :] = x[:, :1]  # something that changes in the second row too
        return {"OUTPUT__0": new[:, 0, :10].copy(), "lstm_state": new}
'''

BRIEF_B_MODEL = '''
import numpy as np
SUMS = {}

class Model:
    """No implicit state in the config: the model keys its running sums by batch.corrid."""

    def execute(self, batch):
        x = batch.inputs["INPUT"]
        out = np.zeros((batch.size, 1), np.float32)
        for row, (ready, start, cid) in enumerate(zip(batch.ready, batch.start, batch.corrid)):
            if ready:
                SUMS[cid] = (0.0 if start else SUMS[cid]) + float(x[row, 0])
                out[row, 0] = SUMS[cid]
        return {"OUTPUT": out}
'''

# Brief b's config names no inputs or outputs; these are appended to it.
BRIEF_B_IO = """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

# ------------------------------------------------------------------------ repositories


def state_config(
    strategy: str,
    *,
    same: bool,
    mbs: int,
    dims: str,
    init_dims: str,
    output_dims: str,
    candidates: int,
    name: str = "m",
) -> str:
    """A sequence model X (INT64 [1]) -> Y with one INT64 implicit state S -> S_OUT of ``dims``
    (zero-initialised with ``init_dims``), Direct or Oldest (``candidates``), and
    ``use_same_buffer_for_input_output`` set to ``same``."""
    block = "direct { }" if strategy == "direct" else f"oldest {{ max_candidate_sequences: {candidates} }}"
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_INT64 dims: {output_dims} }} ]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  {block}
  state [ {{
    input_name: "S" output_name: "S_OUT" data_type: TYPE_INT64 dims: {dims}
    initial_state {{ name: "zero" data_type: TYPE_INT64 dims: {init_dims} zero_data: true }}
    use_same_buffer_for_input_output: {str(same).lower()}
  }} ]
}}
"""


def write_model(repo: Path, name: str, config: str, model_py: str = RECORDING_MODEL, version: int = 1) -> Path:
    """Write <repo>/<name>/config.pbtxt and <repo>/<name>/<version>/model.py."""
    d = repo / name
    (d / str(version)).mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(config))
    (d / str(version) / "model.py").write_text(textwrap.dedent(model_py))
    return d


def python_brief(repo: Path, dirname: str, name: str, model_py: str, extra: str = "") -> Path:
    """A brief config (tests/data/brief_configs/<dirname>) as model `name` in `repo`, its platform
    swapped for the python backend, `extra` appended, served by `model_py`."""
    text = (BRIEF / dirname / "config.pbtxt").read_text()
    swapped, n = re.subn(r'^platform: "[^"]*".*$', 'backend: "python"', text, flags=re.M)
    assert n == 1
    return write_model(repo, name, swapped + extra, model_py)


def ctl(name: str, kind: str, spec: str) -> str:
    """One sequence_batching control_input entry: `name` carries CONTROL_SEQUENCE_<kind>."""
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {spec} }} ] }}'


def copy_model(repo: Path, name: str, as_name: str | None = None, *, source: Path = MODELS) -> Path:
    """Copy the model folder `source`/<name> (tests/models by default) into `repo`, as `as_name`
    when given (its config's `name:` line follows)."""
    dst = repo / (as_name or name)
    shutil.copytree(source / name, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if as_name is not None and as_name != name:
        cfg = dst / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace(f'name: "{name}"', f'name: "{as_name}"'))
    return dst


def copy_demo_models(repo: Path, *names: str) -> Path:
    """Copy the bundled demo models (all of them when no name is given) into `repo`."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in names or tuple(p.name for p in DEMO_REPO.iterdir() if p.is_dir() and p.name != "__pycache__"):
        copy_model(repo, name, source=DEMO_REPO)
    return repo


# ------------------------------------------------------------------------ every datatype

IDENTITY_DTYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]

IDENTITY_MODEL = """
class Model:
    def execute(self, batch):
        return {"OUT_" + name[3:]: value.copy() for name, value in batch.inputs.items()}
"""


def config_type(dtype: str) -> str:
    """The config.pbtxt data_type of a wire datatype."""
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def identity_config(name: str = "identity") -> str:
    """Stateless, max_batch_size 0: IN_<T> [-1] -> OUT_<T> for every datatype T."""
    ins = ",\n".join(f'  {{ name: "IN_{t}" data_type: {config_type(t)} dims: [ -1 ] }}' for t in IDENTITY_DTYPES)
    outs = ",\n".join(f'  {{ name: "OUT_{t}" data_type: {config_type(t)} dims: [ -1 ] }}' for t in IDENTITY_DTYPES)
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f"input [\n{ins}\n]\noutput [\n{outs}\n]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


# ------------------------------------------------------------------------ loaded models


def model_module(model: str, version: int = 1) -> Any:
    """The module of a loaded python model, for the records it keeps."""
    return sys.modules[f"seqserve_models.{model}.v{version}"]


def recorded(server: object, model: str) -> list[dict]:
    """The RECORD list of a loaded recording model (version 1)."""
    return model_module(model).RECORD  # type: ignore[no-any-return]


def rows(rec: list[dict], key: str) -> list[list]:
    """One list per recorded batch: its `key` array (start, end, ready, corrid...)."""
    return [b[key].tolist() for b in rec]
