"""api/shared_memory: the registry of system shared-memory regions, its bounds and checks."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from seqserve.api.shared_memory import SHM_DIR, SharedMemoryRegistry, TensorPlace, tensor_place
from seqserve.engine import Code, InferenceError

MakeObject = Callable[[int], str]


@pytest.fixture
def make_object() -> Iterator[MakeObject]:
    """Creates POSIX shared-memory objects of a given size; returns their keys; removes them."""
    keys: list[str] = []

    def make(size: int) -> str:
        key = f"/seqserve-test-{uuid.uuid4().hex}"
        fd = os.open(os.path.join(SHM_DIR, key[1:]), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)
        keys.append(key)
        return key

    yield make
    for key in keys:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, key[1:]))


def _refused(code: Code, fragment: str, call: Callable[[], object]) -> None:
    with pytest.raises(InferenceError) as ei:
        call()
    assert ei.value.code == code, repr(ei.value)
    assert fragment in ei.value.message, ei.value.message


def test_round_trip_with_offsets(make_object: MakeObject) -> None:
    reg = SharedMemoryRegistry()
    key = make_object(64)
    reg.register("r", key, 16, 32)  # the region is bytes [16, 48) of the object
    assert reg.status() == [{"name": "r", "key": key, "offset": 16, "byte_size": 32}]
    values = np.array([1.5, 2.5], np.float32)
    assert reg.write_output("OUT", values, TensorPlace("r", 8, 8)) == 8
    got = reg.read_input("IN", "FP32", [2], TensorPlace("r", 8, 8))
    assert got.tolist() == [1.5, 2.5]
    with open(os.path.join(SHM_DIR, key[1:]), "rb") as f:
        assert f.read()[24:32] == values.tobytes()  # 16 (region) + 8 (tensor)
    reg.close()
    assert len(reg) == 0


@pytest.mark.parametrize("key", ["/../etc/passwd", "/a/b", "", "/", "/..", "x/y", "/" + "k" * 300])
def test_keys_are_one_name(key: str) -> None:
    _refused(Code.INVALID_ARG, "must be a name", lambda: SharedMemoryRegistry().register("r", key, 0, 8))


def test_missing_key_and_sizes_beyond_the_object(make_object: MakeObject) -> None:
    reg = SharedMemoryRegistry()
    _refused(Code.INVALID_ARG, "Unable to open shared memory region", lambda: reg.register("r", "/no-such-key-s", 0, 8))
    key = make_object(16)
    _refused(Code.INVALID_ARG, "exceed the 16 bytes", lambda: reg.register("r", key, 8, 16))
    assert len(reg) == 0


def test_names_and_bounds(make_object: MakeObject) -> None:
    reg = SharedMemoryRegistry(max_regions=2, max_input_bytes=100)
    reg.register("a", make_object(40), 0, 40)
    _refused(Code.ALREADY_EXISTS, "already in manager", lambda: reg.register("a", make_object(8), 0, 8))
    reg.register("b", make_object(8), 0, 8)
    _refused(Code.UNAVAILABLE, "2 shared memory regions", lambda: reg.register("c", make_object(8), 0, 8))
    reg.check_input_bytes([TensorPlace("a", 60), TensorPlace("b", 40)])
    _refused(Code.INVALID_ARG, "bound of 100 bytes", lambda: reg.check_input_bytes([TensorPlace("a", 101)]))
    reg.unregister("nothing")  # not registered: no error, as in Triton
    reg.unregister("a")
    reg.register("c", make_object(8), 0, 8)
    assert [r["name"] for r in reg.status()] == ["b", "c"]
    _refused(Code.NOT_FOUND, "Unable to find system shared memory region: 'a'", lambda: reg.status("a"))
    reg.close()


def test_tensor_bounds_are_checked_before_use(make_object: MakeObject) -> None:
    reg = SharedMemoryRegistry()
    key = make_object(32)
    reg.register("r", key, 0, 16)
    _refused(
        Code.INVALID_ARG, "exceed the 16 bytes", lambda: reg.read_input("IN", "FP32", [4], TensorPlace("r", 16, 4))
    )
    _refused(Code.INVALID_ARG, "expecting 16 bytes", lambda: reg.read_input("IN", "FP32", [4], TensorPlace("r", 8)))
    big = np.zeros(8, np.float32)
    _refused(
        Code.INVALID_ARG, "should be at least 32 bytes", lambda: reg.write_output("OUT", big, TensorPlace("r", 16))
    )
    _refused(Code.NOT_FOUND, "'other'", lambda: reg.read_input("IN", "FP32", [1], TensorPlace("other", 4)))
    os.truncate(os.path.join(SHM_DIR, key[1:]), 4)  # the client shrinks the object: no SIGBUS, an error
    _refused(Code.INVALID_ARG, "has been shrunk", lambda: reg.read_input("IN", "FP32", [4], TensorPlace("r", 16)))
    reg.close()


def test_a_region_whose_object_is_gone_is_dropped(make_object: MakeObject) -> None:
    reg = SharedMemoryRegistry()
    kept, gone = make_object(8), make_object(8)
    reg.register("kept", kept, 0, 8)
    reg.register("gone", gone, 0, 8)
    os.unlink(os.path.join(SHM_DIR, gone[1:]))  # what destroy_shared_memory_region does
    assert [r["name"] for r in reg.status()] == ["kept"]
    reg.close()


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"shared_memory_region": "r"}, "'shared_memory_byte_size' must be given"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative"),
        ({"shared_memory_region": 5, "shared_memory_byte_size": 4}, "must be a region name"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": "1"}, "offset"),
        ({"shared_memory_byte_size": 4}, "needs 'shared_memory_region'"),
    ],
)
def test_tensor_place_parameters(params: dict[str, object], fragment: str) -> None:
    _refused(Code.INVALID_ARG, fragment, lambda: tensor_place("T", params))


def test_tensor_place() -> None:
    assert tensor_place("T", {}) is None
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": 8}
    assert tensor_place("T", params) == TensorPlace("r", 4, 8)
