"""The model repository Triton runs in the side-by-side bench, with as many instances (slots) as
seqserve's model has.

The anchor's ``accum_py`` has one instance (8 slots at ``max_batch_size`` 8) while seqserve's demo
``accumulator`` has two (16 slots): at 16 concurrent sequences half of Triton's would wait in its
backlog, and the comparison would measure that wait rather than the servers. So the bench copies
the repository into a temporary folder, sets the model's ``instance_group`` there, and starts
Triton on the copy; the anchor itself is never modified, and the copy is removed on leaving the
context, whatever happens.

The config is edited as protobuf text with seqserve's own ``model_config.proto`` (Triton's schema),
not as a string, and read back to check the result.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from google.protobuf import text_format

from seqserve._proto import model_config_pb2 as mc


class RepoProblem(RuntimeError):
    """The repository or its model config cannot be used; the message says why."""


def config_path(repo: Path, model: str) -> Path:
    return repo / model / "config.pbtxt"


def read_config(path: Path) -> mc.ModelConfig:
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except OSError as e:
        raise RepoProblem(f"cannot read the model config {path}: {e.strerror or e}") from None
    except text_format.ParseError as e:
        raise RepoProblem(f"the model config {path} is not a valid model config: {e}") from None


def instance_count(config: mc.ModelConfig) -> int:
    """Instances the config asks for; Triton makes one when it names no instance group (or count 0)."""
    return sum(g.count or 1 for g in config.instance_group) or 1


def with_instances(config: mc.ModelConfig, count: int) -> mc.ModelConfig:
    """A copy of ``config`` with exactly one instance group of ``count`` CPU instances (every other
    field as it was). CPU: the anchor's Triton is CPU only, and so is the comparison."""
    if count < 1:
        raise ValueError(f"instance count must be >= 1, got {count}")
    out = mc.ModelConfig()
    out.CopyFrom(config)
    del out.instance_group[:]
    out.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)
    return out


@contextmanager
def repo_with_instances(src: Path, model: str, count: int) -> Iterator[Path]:
    """A temporary copy of the repository ``src`` in which ``model`` has ``count`` CPU instances;
    removed on leaving the context (also on an exception or KeyboardInterrupt)."""
    original = read_config(config_path(src, model))
    edited = with_instances(original, count)
    tmp = Path(tempfile.mkdtemp(prefix="sbs-triton-repo-"))
    try:
        dst = tmp / "models"
        # the bytecode caches are the anchor's business; Triton's Python backend writes its own
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"), symlinks=False)
        path = config_path(dst, model)
        path.write_text(
            f"# copied from {config_path(src, model)} by bench.vs_triton: instance_group set to "
            f"{count} CPU instance(s), every other field as there\n" + text_format.MessageToString(edited)
        )
        check = read_config(path)  # what Triton will read, read back
        if check != edited or instance_count(check) != count:
            raise RepoProblem(f"{path}: the edited config does not read back as written")
        yield dst
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
