"""The checkpoint's binary format (engine/replicas/checkpoint.py): exact round trips for every datatype a
state can have, and a decoder that refuses anything malformed, truncated, oversized or hostile
with CheckpointError, without allocating what a header merely claims."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqserve.engine import CheckpointError, SequenceCheckpoint
from seqserve.engine.replicas.checkpoint import FORMAT_VERSION, MAGIC, MAX_HEADER_BYTES
from seqserve.engine.tensors import DATA_TYPES

PREFIX = struct.Struct("<8sHHI")


def ckpt(**states: np.ndarray) -> SequenceCheckpoint:
    return SequenceCheckpoint("m", 3, 42, 7, False, states)


def blob(header: object, payload: bytes = b"", *, fmt: int = FORMAT_VERSION, flags: int = 0) -> bytes:
    h = orjson.dumps(header) if not isinstance(header, bytes) else header
    return PREFIX.pack(MAGIC, fmt, flags, len(h)) + h + payload


def header(states: object = None, **over: object) -> dict:
    h = {
        "model": "m",
        "version": 1,
        "sequence_id": 5,
        "steps": 2,
        "session": True,
        "states": [] if states is None else states,
    }
    h.update(over)
    return h


def state(name: str = "S", dtype: str = "FP32", shape: list[int] | None = None, nbytes: int = 4) -> dict:
    return {"name": name, "dtype": dtype, "shape": [1] if shape is None else shape, "nbytes": nbytes}


def same(a: SequenceCheckpoint, b: SequenceCheckpoint) -> None:
    assert (a.model, a.version, a.sequence_id, a.steps, a.session) == (
        b.model,
        b.version,
        b.sequence_id,
        b.steps,
        b.session,
    )
    assert type(a.sequence_id) is type(b.sequence_id)
    assert list(a.states) == list(b.states)
    for k in a.states:
        x, y = np.asarray(a.states[k]), b.states[k]
        assert x.shape == y.shape and (x.dtype == y.dtype or x.dtype.kind in "SUO"), k
        assert x.tolist() == y.tolist(), k


# ------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dt", [d for d in DATA_TYPES if d.numpy is not None and not d.is_bytes], ids=lambda d: d.wire)
def test_every_numeric_dtype_round_trips_exactly(dt) -> None:
    rng = np.random.default_rng(1)
    value = rng.integers(0, 255, size=(2, 3, 4), dtype=np.uint8).view(np.uint8)
    arr = np.frombuffer(value.tobytes() * dt.itemsize, dtype=dt.numpy)[:24].reshape(2, 3, 4)
    if dt.numpy.kind == "b":
        arr = value.astype(bool)
    c = ckpt(S=arr)
    back = SequenceCheckpoint.from_bytes(c.to_bytes())
    same(c, back)
    assert back.states["S"].tobytes() == np.ascontiguousarray(arr).tobytes()  # bit-exact (NaNs too)
    assert not back.states["S"].flags.writeable


def test_shapes_ids_and_flags_round_trip() -> None:
    states = {
        "scalar": np.array(2.5, np.float64),  # rank 0
        "empty": np.zeros((0, 3), np.int32),  # no elements
        "strided": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],  # not contiguous
        "big_endian": np.array([1, 2], dtype=">i4"),  # stored in the table's little-endian form
        "text": np.array([[b"a", b""], ["\u00e9", b"\x00\xff"]], dtype=object),
    }
    for sid in (1, 2**64 - 1, "s", "\u00e9" * 100):
        for session in (False, True):
            c = SequenceCheckpoint("model \u00e9", 2**63 - 1, sid, 2**64 - 1, session, states)
            back = SequenceCheckpoint.from_bytes(c.to_bytes())
            assert back.sequence_id == sid and back.session is session and back.steps == 2**64 - 1
            assert back.states["scalar"].shape == () and back.states["scalar"].item() == 2.5
            assert back.states["empty"].shape == (0, 3)
            assert back.states["strided"].tolist() == [[0, 2], [4, 6], [8, 10]]
            assert back.states["big_endian"].dtype == np.dtype("<i4") and back.states["big_endian"].tolist() == [1, 2]
            assert back.states["text"].tolist() == [[b"a", b""], ["\u00e9".encode(), b"\x00\xff"]]


def test_no_states_and_every_input_buffer_type() -> None:
    c = SequenceCheckpoint("m", 0, "x", 0, False, {})
    data = c.to_bytes()
    for form in (data, bytearray(data), memoryview(data)):
        same(c, SequenceCheckpoint.from_bytes(form))


def test_mutable_input_is_copied() -> None:
    buf = bytearray(ckpt(S=np.array([1, 2], np.int32)).to_bytes())
    back = SequenceCheckpoint.from_bytes(buf)
    buf[-8:] = bytes(8)
    assert back.states["S"].tolist() == [1, 2]


def test_state_bytes() -> None:
    assert ckpt(A=np.zeros(4, np.float32), B=np.array([b"abc"], dtype=object)).state_bytes == 16 + 7


@pytest.mark.parametrize(
    "bad",
    [
        {"sequence_id": 0},
        {"sequence_id": ""},
        {"sequence_id": 2**64},
        {"sequence_id": -1},
        {"sequence_id": 1.5},
        {"sequence_id": True},
        {"steps": -1},
        {"version": -1},
        {"model": ""},
        {"session": 1},
    ],
)
def test_to_bytes_refuses_fields_out_of_range(bad: dict) -> None:
    fields = {"model": "m", "version": 1, "sequence_id": 1, "steps": 0, "session": False} | bad
    with pytest.raises(CheckpointError):
        SequenceCheckpoint(states={}, **fields).to_bytes()  # type: ignore[arg-type]


def test_to_bytes_refuses_what_is_not_a_tensor() -> None:
    with pytest.raises(CheckpointError, match="not a tensor datatype"):
        ckpt(S=np.array([1 + 2j])).to_bytes()
    with pytest.raises(CheckpointError, match="rank 17"):
        ckpt(S=np.zeros((1,) * 17, np.int8)).to_bytes()


# ----------------------------------------------------------------------- the decoder


def test_prefix_checks() -> None:
    good = ckpt(S=np.array([1.0], np.float32)).to_bytes()
    for n in range(len(good)):  # every truncation
        with pytest.raises(CheckpointError):
            SequenceCheckpoint.from_bytes(good[:n])
    with pytest.raises(CheckpointError, match="bad magic"):
        SequenceCheckpoint.from_bytes(b"X" + good[1:])
    with pytest.raises(CheckpointError, match="format 2 is not supported"):
        SequenceCheckpoint.from_bytes(blob(header(), fmt=2))
    with pytest.raises(CheckpointError, match="flags"):
        SequenceCheckpoint.from_bytes(blob(header(), flags=1))
    with pytest.raises(CheckpointError, match="declare 4 bytes, it carries 5"):
        SequenceCheckpoint.from_bytes(good + b"\x00")  # trailing bytes
    with pytest.raises(CheckpointError, match="more than the limit"):
        SequenceCheckpoint.from_bytes(good, max_bytes=len(good) - 1)
    with pytest.raises(CheckpointError, match="not str"):
        SequenceCheckpoint.from_bytes("text")  # type: ignore[arg-type]


def test_header_length_is_bounded() -> None:
    huge = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, MAX_HEADER_BYTES + 1) + b"{" * (MAX_HEADER_BYTES + 1)
    with pytest.raises(CheckpointError, match="header"):
        SequenceCheckpoint.from_bytes(huge)
    with pytest.raises(CheckpointError, match="header"):
        SequenceCheckpoint.from_bytes(PREFIX.pack(MAGIC, FORMAT_VERSION, 0, 2**32 - 1) + b"{}")


@pytest.mark.parametrize(
    ("hdr", "match"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "exactly the keys"),
        (orjson.dumps({**header(), "extra": 1}), "exactly the keys"),
        (orjson.dumps({k: v for k, v in header().items() if k != "steps"}), "exactly the keys"),
        (orjson.dumps(header(model=7)), "model"),
        (orjson.dumps(header(version=True)), "version"),
        (orjson.dumps(header(version=2**63)), "version"),
        (orjson.dumps(header(sequence_id=0)), "non-zero"),
        (orjson.dumps(header(sequence_id=None)), "sequence id"),
        (orjson.dumps(header(sequence_id="x" * 70000)), "sequence id"),
        (orjson.dumps(header(steps=-1)), "steps"),
        (orjson.dumps(header(session="yes")), "session"),
        (orjson.dumps(header(states={})), "list"),
        (orjson.dumps(header(states=[1])), "exactly the keys"),
        (orjson.dumps(header(states=[{**state(), "x": 1}])), "exactly the keys"),
        (orjson.dumps(header(states=[state(name="")])), "state name"),
        (orjson.dumps(header(states=[state(dtype="FP128")])), "not a datatype"),
        (orjson.dumps(header(states=[state(dtype="BF16")])), "not a datatype"),
        (orjson.dumps(header(states=[state(dtype=4)])), "not a datatype"),
        (orjson.dumps(header(states=[state(shape=[1] * 17)])), "at most 16"),
        (orjson.dumps(header(states=[state(shape=[-1])])), "dims >= 0"),
        (orjson.dumps(header(states=[state(shape=[True])])), "dims >= 0"),
        (orjson.dumps(header(states=[state(shape="1")])), "dims >= 0"),
        (orjson.dumps(header(states=[state(nbytes=-4)])), "byte count"),
        (orjson.dumps(header(states=[state(nbytes=1.0)])), "byte count"),
        (orjson.dumps(header(states=[state(), state()])), "twice"),
        (orjson.dumps(header(states=[state()] * 1025)), "at most 1024"),
    ],
)
def test_malformed_headers(hdr: bytes, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        SequenceCheckpoint.from_bytes(blob(hdr, b"\x00" * 4))


def test_sizes_must_agree_with_shapes_and_data() -> None:
    with pytest.raises(CheckpointError, match="needs 8 bytes, it has 4"):
        SequenceCheckpoint.from_bytes(blob(header([state(shape=[2], nbytes=4)]), b"\x00" * 4))
    with pytest.raises(CheckpointError, match="declare 8 bytes, it carries 4"):
        SequenceCheckpoint.from_bytes(blob(header([state(shape=[2], nbytes=8)]), b"\x00" * 4))
    # a BYTES state whose elements do not fill its bytes exactly
    data = struct.pack("<I", 2) + b"ab" + b"!"
    with pytest.raises(CheckpointError, match="state 'S'"):
        SequenceCheckpoint.from_bytes(blob(header([state(dtype="BYTES", nbytes=len(data))]), data))
    data = struct.pack("<I", 100) + b"ab"
    with pytest.raises(CheckpointError, match="state 'S'"):
        SequenceCheckpoint.from_bytes(blob(header([state(dtype="BYTES", nbytes=len(data))]), data))


def test_hostile_sizes_allocate_nothing_large() -> None:
    """Shapes that claim terabytes are refused from the header, before any allocation."""
    hostile = [
        blob(header([state(dtype="BYTES", shape=[2**40], nbytes=8)]), b"\x00" * 8),
        blob(header([state(dtype="BYTES", shape=[2**31, 2**31], nbytes=4)]), b"\x00" * 4),
        blob(header([state(dtype="FP64", shape=[2**62, 2**62, 2**62], nbytes=8)]), b"\x00" * 8),
        blob(header([state(nbytes=2**62)]), b"\x00" * 4),
        blob(header([state(shape=[0], nbytes=0)] + [state(name=f"s{i}", nbytes=2**60) for i in range(8)])),
    ]
    tracemalloc.start()
    try:
        for data in hostile:
            with pytest.raises(CheckpointError):
                SequenceCheckpoint.from_bytes(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


# ------------------------------------------------------------------------------- fuzz

VALID = ckpt(
    A=np.arange(6, dtype=np.float32).reshape(2, 3), B=np.array([b"xy", b""], dtype=object), C=np.array(True)
).to_bytes()


def _decode_or_refuse(data: bytes) -> None:
    try:
        got = SequenceCheckpoint.from_bytes(data, max_bytes=1 << 16)
    except CheckpointError:
        return
    # whatever decodes encodes back to the same bytes (the format has one spelling per value,
    # up to the header's JSON, which we re-encode canonically)
    again = SequenceCheckpoint.from_bytes(got.to_bytes())
    same(got, again)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_or_refuse(data)
    _decode_or_refuse(MAGIC + data)
    _decode_or_refuse(PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(data)) + data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, len(VALID)),
)
def test_fuzz_mutated_checkpoint(flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID)
    for pos, value in flips:
        data[pos] = value
    _decode_or_refuse(bytes(data))
    _decode_or_refuse(bytes(data[:cut]))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(
            st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8).map(lambda v: np.array(v, np.int32)),
            st.lists(st.floats(width=32, allow_nan=False), max_size=8).map(lambda v: np.array(v, np.float32)),
            st.lists(st.binary(max_size=8), max_size=4).map(lambda v: np.array(v, dtype=object)),
        ),
        max_size=4,
    ),
    st.one_of(st.integers(1, 2**64 - 1), st.text(min_size=1, max_size=10)),
    st.integers(0, 2**64 - 1),
    st.booleans(),
)
def test_fuzz_round_trip(states: dict, sid: object, steps: int, session: bool) -> None:
    c = SequenceCheckpoint("m", 1, sid, steps, session, states)  # type: ignore[arg-type]
    same(c, SequenceCheckpoint.from_bytes(c.to_bytes()))
