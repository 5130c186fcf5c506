"""Model control pieces without a server: modes and startup models, the paths a config may
name, upload folders, and the repository fingerprints poll mode compares."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from seqserve.engine.config import load_model_config
from seqserve.engine.errors import Code, InferenceError, ModelConfigError
from seqserve.engine.paths import inside, path_problem
from seqserve.engine.server.model_control import ModelControlMode, model_fingerprint, startup_models
from seqserve.engine.server.uploads import UploadDirs

# ------------------------------------------------------------------ modes, --load-model


def test_mode_parse() -> None:
    assert ModelControlMode.parse("EXPLICIT") is ModelControlMode.EXPLICIT
    assert ModelControlMode.parse(ModelControlMode.POLL) is ModelControlMode.POLL
    with pytest.raises(ValueError, match="invalid model control mode 'open'"):
        ModelControlMode.parse("open")


def test_startup_models() -> None:
    none, poll, explicit = ModelControlMode.NONE, ModelControlMode.POLL, ModelControlMode.EXPLICIT
    assert startup_models(none, []) is None  # every model
    assert startup_models(poll, []) is None
    assert startup_models(explicit, []) == []  # Triton: no --load-model, no model
    assert startup_models(explicit, ["*"]) is None
    assert startup_models(explicit, ["b", "a", "b"]) == ["b", "a"]
    for mode in (none, poll):
        with pytest.raises(ValueError) as info:
            startup_models(mode, ["a"])
        assert str(info.value) == "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
    with pytest.raises(ValueError) as info:
        startup_models(explicit, ["*", "a"])
    assert str(info.value) == "Wildcard model name '*' must be the ONLY startup model if specified at all."


# ------------------------------------------------------------------------------ paths


@pytest.mark.parametrize(
    ("rel", "problem"),
    [
        ("model.py", None),
        ("sub/model.onnx", None),
        ("./model.py", None),
        ("", "is empty"),
        ("/etc/passwd", "is an absolute path"),
        ("..", "contains '..'"),
        ("../other/1/model.py", "contains '..'"),
        ("a/../../b", "contains '..'"),
        ("a\\..\\..\\b", "contains a backslash"),
        ("model.py\x00.onnx", "contains a NUL character"),
        ("a//b", "has an empty path component"),
        ("dir/", "has an empty path component"),
    ],
)
def test_path_problem(rel: str, problem: str | None) -> None:
    assert path_problem(rel) == problem


def test_inside(tmp_path: Path) -> None:
    assert inside(tmp_path, "1/model.py", "default_model_filename") == tmp_path / "1" / "model.py"
    with pytest.raises(ModelConfigError) as info:
        inside(tmp_path, "/abs.py", "default_model_filename", "the version folder of model 'm'")
    assert str(info.value) == (
        "default_model_filename '/abs.py' is an absolute path: it must be a file inside the version folder "
        "of model 'm' (a relative path without '..', not an absolute path)"
    )


def _config(tmp_path: Path, top: str = "", output: str = "") -> Path:
    d = tmp_path / "m"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(
        'name: "m"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        f'output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ -1 ] {output} }} ]\n{top}\n'
    )
    return d


@pytest.mark.parametrize(
    ("field", "top", "output", "fragment"),
    [
        ("default_model_filename", "default_model_filename: '/tmp/evil.py'", "", "is an absolute path"),
        ("default_model_filename", "default_model_filename: '../../x/1/model.py'", "", "contains '..'"),
        ("cc_model_filenames['7.5']", "cc_model_filenames { key: '7.5' value: '/x.plan' }", "", "absolute"),
        ("label_filename of output 'Y'", "", "label_filename: '../labels.txt'", "contains '..'"),
        (
            "model_warmup 'w' input 'X' input_data_file",
            "model_warmup { name: 'w' batch_size: 1 inputs { key: 'X' value: { input_data_file: '/dev/zero' } } }",
            "",
            "absolute",
        ),
    ],
)
def test_config_paths_must_stay_inside(tmp_path: Path, field: str, top: str, output: str, fragment: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        load_model_config(_config(tmp_path, top, output))
    assert str(info.value).startswith(field + " '"), str(info.value)
    assert fragment in str(info.value)


def test_config_path_inside_is_fine(tmp_path: Path) -> None:
    d = _config(tmp_path, "default_model_filename: 'impl/main.py'", "label_filename: 'labels.txt'")
    assert load_model_config(d).default_model_filename == "impl/main.py"


def test_onnx_session_path_parameters(tmp_path: Path) -> None:
    from seqserve.engine.backends.onnxrt import session_entry_value

    key = "session.model_external_initializers_file_folder_path"
    assert session_entry_value(key, "weights", tmp_path, "m") == str(tmp_path / "weights")
    assert session_entry_value("session.intra_op.allow_spinning", "0", tmp_path, "m") == "0"
    for bad in ("/var/lib/weights", "../other"):
        with pytest.raises(ModelConfigError, match=f"parameter '{key}'"):
            session_entry_value(key, bad, tmp_path, "m")


# ---------------------------------------------------------------------------- uploads


def test_upload_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    uploads = UploadDirs()
    a = uploads.create("m", {"1/model.py": b"x = 1\n", "config.pbtxt": b""})
    b = uploads.create("m", {"1/model.py": b"x = 2\n"})
    root = uploads.root
    assert root is not None and root.parent == tmp_path
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert (a / "1" / "model.py").read_bytes() == b"x = 1\n" and a.name == "m"
    assert a.parent != b.parent and uploads.owns(a) and not uploads.owns(tmp_path / "m")
    uploads.remove(a)
    assert not a.parent.exists() and b.exists()
    uploads.remove(tmp_path)  # not an upload folder: left alone
    assert tmp_path.exists()
    uploads.remove_all()
    assert not root.exists()


@pytest.mark.parametrize("rel", ["", "/etc/cron.d/x", "../x.py", "1/../../x.py", "1\\..\\x.py", "1//m.py", "1/"])
def test_upload_names_that_could_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rel: str) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    uploads = UploadDirs()
    with pytest.raises(InferenceError) as info:
        uploads.create("m", {"1/model.py": b"", rel: b"pwned"})
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message.startswith(f"Invalid file parameter 'file:{rel}' must stay within model directory")
    # nothing was written, inside or out
    assert sorted(p.name for p in tmp_path.rglob("*")) == [p.name for p in tmp_path.glob("seqserve-uploads-*")]


def test_upload_file_over_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    uploads = UploadDirs()
    with pytest.raises(InferenceError, match=r"Invalid file parameter 'file:1/model\.py'"):
        uploads.create("m", {"1": b"a file", "1/model.py": b""})
    assert uploads.root is not None and list(uploads.root.iterdir()) == []  # the half-made folder is gone


# ----------------------------------------------------------------------- fingerprints


def test_fingerprint(tmp_path: Path) -> None:
    d = tmp_path / "m"
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text('name: "m"')
    (d / "1" / "model.py").write_text("x = 1")
    first = model_fingerprint(d)
    # what Python and editors leave behind does not count
    (d / "1" / "__pycache__").mkdir()
    (d / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (d / ".config.pbtxt.swp").write_text("swap")
    assert model_fingerprint(d) == first
    # a changed file, a new version folder, a removed file
    st = (d / "1" / "model.py").stat()
    os.utime(d / "1" / "model.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = model_fingerprint(d)
    assert second != first
    (d / "2").mkdir()
    third = model_fingerprint(d)
    assert third != second
    (d / "config.pbtxt").unlink()
    assert model_fingerprint(d) not in (first, second, third)


def test_fingerprint_follows_symlinks_once(tmp_path: Path) -> None:
    store = tmp_path / "store" / "v1"
    store.mkdir(parents=True)
    (store / "model.py").write_text("x = 1")
    d = tmp_path / "m"
    d.mkdir()
    (d / "1").symlink_to(store, target_is_directory=True)
    (store / "loop").symlink_to(d, target_is_directory=True)  # a cycle ends
    before = model_fingerprint(d)
    assert ("1/model.py", "file", 5, (store / "model.py").stat().st_mtime_ns) in before
    (store / "model.py").write_text("x = 22")
    assert model_fingerprint(d) != before
