"""api/classification: the top classes of an output as Triton writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seqserve.api.classification import class_count, read_labels, top_classes
from seqserve.engine import Code, InferenceError


def test_floats_six_decimals_highest_first_ties_by_index() -> None:
    arr = np.array([0.5, 2.0, 0.5, -1.0], dtype=np.float32)
    assert top_classes("o", arr, 3, False, ()).tolist() == [b"2.000000:1", b"0.500000:0", b"0.500000:2"]


def test_batched_rows_and_labels() -> None:
    arr = np.array([[1, 5, 3], [9, 0, 2]], dtype=np.int64)
    got = top_classes("o", arr, 2, True, ("a", "b"))
    assert got.shape == (2, 2)
    assert got.tolist() == [[b"5:1:b", b"3:2"], [b"9:0:a", b"2:2"]]


def test_a_count_beyond_the_classes_gives_them_all() -> None:
    arr = np.array([[[1.0], [2.0]]], dtype=np.float64)  # batch 1, 2 classes in [2, 1]
    assert top_classes("o", arr, 10, True, ()).tolist() == [[b"2.000000:1", b"1.000000:0"]]


def test_unsigned_and_empty() -> None:
    assert top_classes("o", np.array([2**64 - 1, 0], dtype=np.uint64), 1, False, ()).tolist() == [
        f"{2**64 - 1}:0".encode()
    ]
    assert top_classes("o", np.zeros((2, 0), np.float32), 3, True, ()).shape == (2, 0)


@pytest.mark.parametrize("arr", [np.zeros(2, np.float16), np.zeros(2, bool), np.array([b"x"], dtype=object)])
def test_unrankable_datatypes(arr: np.ndarray) -> None:
    with pytest.raises(InferenceError) as ei:
        top_classes("o", arr, 1, False, ())
    assert ei.value.code == Code.INVALID_ARG and "unsupported type" in ei.value.message


@pytest.mark.parametrize("value", [-1, 1.0, "1", None, True])
def test_class_count_must_be_a_non_negative_integer(value: object) -> None:
    with pytest.raises(InferenceError):
        class_count("o", value)
    assert class_count("o", 0) == 0 and class_count("o", 3) == 3


def test_labels_are_lines_reread_when_changed(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_text("cat\r\ndog\n")
    assert read_labels(str(path))[:2] == ("cat", "dog")
    path.write_text("emu\n\nowl\nyak\n")  # another size: a change even within one mtime tick
    assert read_labels(str(path))[:3] == ("emu", "", "owl")
    assert read_labels(str(tmp_path / "missing.txt")) == ()
