"""Models for tests: the writers that put a model into a tmp repository, the config snippets and
generators several modules use, and the records a loaded Python model keeps.

Shared models are files in tests/models/<name>/ (config.pbtxt and 1/model.py): `copy_model`
puts one into a repository, `model_source` reads one's model.py to serve it under another
config. A model that is the point of one test stays inline in that test.
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


def model_source(name: str) -> str:
    """The model.py of the shared test model tests/models/<name> (version 1)."""
    return (MODELS / name / "1" / "model.py").read_text()


# A batch-level model that records what it saw (tests/models/recording): each execute call
# appends one dict per batch to the module-level list RECORD (see `recorded`).
RECORDING_MODEL = model_source("recording")

# OUT_X = S + IN_X for the model's one implicit state S (tests/models/accum, which says more).
ACCUM_MODEL = model_source("accum")

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


def in_x_config(
    rest: str = "", *, name: str = "m", mbs: int = 4, dims: str = "[ 1 ]", out_dims: str | None = None
) -> str:
    """A Python model `name`: IN_X -> OUT_X (INT32 `dims`, `out_dims` when they differ) with
    max_batch_size `mbs` (the I/O of the recording and accum models), then `rest` (scheduling
    and any other config)."""
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "IN_X" data_type: TYPE_INT32 dims: {dims} }} ]
output [ {{ name: "OUT_X" data_type: TYPE_INT32 dims: {out_dims or dims} }} ]
{rest}
"""


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


def copy_model(
    repo: Path, name: str, as_name: str | None = None, *, source: Path = MODELS, model_py: str | None = None
) -> Path:
    """Copy the model folder `source`/<name> (tests/models by default) into `repo`, as `as_name`
    when given (its config's `name:` line follows), over what is there (as `write_model`);
    `model_py` replaces version 1's model.py (the same config served by another model)."""
    dst = repo / (as_name or name)
    shutil.copytree(source / name, dst, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    if as_name is not None and as_name != name:
        cfg = dst / "config.pbtxt"
        cfg.write_text(cfg.read_text().replace(f'name: "{name}"', f'name: "{as_name}"', 1))
    if model_py is not None:
        (dst / "1" / "model.py").write_text(textwrap.dedent(model_py))
    return dst


def copy_demo_models(repo: Path, *names: str) -> Path:
    """Copy the bundled demo models (all of them when no name is given) into `repo`."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in names or tuple(p.name for p in DEMO_REPO.iterdir() if p.is_dir() and p.name != "__pycache__"):
        copy_model(repo, name, source=DEMO_REPO)
    return repo


# ------------------------------------------------------------------------ every datatype

# The datatypes of tests/models/identity: IN_<T> [-1] -> OUT_<T> for each (max_batch_size 0).
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
