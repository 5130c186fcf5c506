"""Fuzzing the live server (issue 11 item 7): random and mutated requests over HTTP JSON, HTTP
binary, gRPC unary and the gRPC stream, while live sequences step beside them
(tests/support/hostile.py).

Each example starts from a valid request for the demo `accumulator` model (or `add_sub`,
`echo_bytes`) and mutates it: JSON fields set to values of every JSON type and edge numbers,
fields deleted, inputs duplicated, shapes, datatypes and parameters replaced, binary tails and
Inference-Header-Content-Length bent, bodies compressed or cut, protobuf fields set out of range,
serialized bytes flipped, cut or extended. Every reply must be a valid success or a clean refusal
(tests/support/wire.py: 4xx or 501 with `{"error": ...}`; gRPC OK or INVALID_ARGUMENT,
NOT_FOUND, UNIMPLEMENTED, RESOURCE_EXHAUSTED, PERMISSION_DENIED, UNAVAILABLE), within 5 s; the
server stays up, and the live sequences keep correct sums. Sequences a successful example may
have left open are ENDed after it, so fuzzing cannot fill the model's sequence slots.

Runtime and reproducibility:
* default (CI): each of the four tests runs at most SEQSERVE_FUZZ_DEFAULT_EXAMPLES (1200) examples
  with `derandomize=True` (the same examples on every run), stops sending after
  SEQSERVE_FUZZ_BUDGET_S (15) seconds, and does not shrink a failure (the first failing example
  is reported as generated): about 60 s for the whole module;
* longer run: `SEQSERVE_FUZZ_EXAMPLES=20000 pytest tests/security/test_fuzz.py -p no:cacheprovider`
  runs that many examples per test, random unless `SEQSERVE_FUZZ_SEED=<int>` fixes the seed, with
  no time budget and with shrinking.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from tests.support.clients import new_int_id
from tests.support.hostile import Harness, log_tail, release_sequence
from tests.support.wire import (
    ALLOWED_GRPC,
    ANSWER_BOUND_S,
    RawStream,
    acc_request,
    assert_clean_grpc,
    bytes_elements,
    error_message,
    grpc_unary,
    http_bytes,
    infer_doc,
    infer_path,
    send_raw,
    stream_reply_value,
)

Code = grpc.StatusCode

LONG_EXAMPLES = int(os.environ.get("SEQSERVE_FUZZ_EXAMPLES", "0"))
SEED = os.environ.get("SEQSERVE_FUZZ_SEED")
DEFAULT_EXAMPLES = int(os.environ.get("SEQSERVE_FUZZ_DEFAULT_EXAMPLES", "1200"))
BUDGET_S = None if LONG_EXAMPLES else float(os.environ.get("SEQSERVE_FUZZ_BUDGET_S", "15"))

FUZZ = settings(
    max_examples=LONG_EXAMPLES or DEFAULT_EXAMPLES,
    derandomize=not LONG_EXAMPLES and SEED is None,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink) if LONG_EXAMPLES else (Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)


def fuzz(fn: Callable[..., None]) -> Callable[..., None]:
    fn = FUZZ(fn)
    return seed(int(SEED))(fn) if SEED is not None else fn


# a 4xx, or 501 where Triton answers UNSUPPORTED; never another 5xx
HTTP_REFUSALS = frozenset({400, 404, 405, 408, 411, 413, 414, 415, 422, 431, 501})
SEQUENCE_MODELS = ("accumulator", "accumulator_corrid")


class Budget:
    """Stops sending once a test has used its time (CI mode); the rest of the examples pass
    without traffic."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.sent = 0

    def spent(self) -> bool:
        return BUDGET_S is not None and time.monotonic() - self.t0 > BUDGET_S


# ----------------------------------------------------------------------- strategies

EDGE_INTS = [
    0, 1, -1, 2, 4, 7, 65, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64,
    -(2**63), -(2**63) - 1, 10**12, 250_000_000, 10**30,
]  # fmt: skip
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
             "BF16", "BYTES"]  # fmt: skip
BAD_DATATYPES = ["", "fp32", "STRING", "TYPE_FP32", "FP8", "FP32 ", "F" * 300]

ints = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-3, 9), st.integers())
floats = st.floats(allow_nan=True, allow_infinity=True)
texts = st.text(max_size=16)
datatypes = st.sampled_from(DATATYPES + BAD_DATATYPES)
leaves = st.one_of(st.none(), st.booleans(), ints, floats, texts)
json_values = st.recursive(
    leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=10
)
dims = st.one_of(st.integers(0, 3), st.sampled_from(EDGE_INTS))
shapes = st.one_of(st.lists(dims, max_size=6), st.just([1] * 65), st.lists(st.just(1), min_size=60, max_size=70))

JSON_PATHS: list[tuple[Any, ...]] = [
    ("id",), ("inputs",), ("inputs", 0), ("inputs", 0, "name"), ("inputs", 0, "datatype"), ("inputs", 0, "shape"),
    ("inputs", 0, "data"), ("inputs", 0, "parameters"), ("inputs", 0, "parameters", "binary_data_size"),
    ("outputs",), ("outputs", 0), ("outputs", 0, "name"), ("outputs", 0, "parameters"),
    ("outputs", 0, "parameters", "binary_data"), ("parameters",), ("parameters", "sequence_id"),
    ("parameters", "sequence_start"), ("parameters", "sequence_end"), ("parameters", "priority"),
    ("parameters", "timeout"), ("parameters", "binary_data_output"), ("parameters", "custom"),
]  # fmt: skip


def value_for(path: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    last = path[-1]
    special: st.SearchStrategy[Any] | None = None
    if last == "shape":
        special = shapes
    elif last == "datatype":
        special = datatypes
    elif last == "data":
        special = st.lists(leaves, max_size=6) | st.lists(st.lists(leaves, max_size=3), max_size=3)
    elif last in ("sequence_id", "priority", "timeout", "binary_data_size"):
        special = ints | texts | floats
    elif last in ("sequence_start", "sequence_end", "binary_data_output", "binary_data"):
        special = st.booleans() | leaves
    return json_values if special is None else st.one_of(special, special, json_values)


@st.composite
def json_mutations(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "set", "set", "delete", "dup_input", "add_input"]))
        if kind in ("set", "delete"):
            path = draw(st.sampled_from(JSON_PATHS))
            ops.append((kind, path, draw(value_for(path)) if kind == "set" else None))
        elif kind == "add_input":
            ops.append(
                (
                    kind,
                    None,
                    draw(
                        st.dictionaries(
                            st.sampled_from(["name", "datatype", "shape", "data", "parameters"]),
                            json_values,
                            max_size=5,
                        )
                    ),
                )
            )
        else:
            ops.append((kind, None, None))
    return ops


def apply_json(doc: dict[str, Any], ops: list[tuple[Any, ...]]) -> dict[str, Any]:
    for kind, path, value in ops:
        if kind == "dup_input":
            if isinstance(doc.get("inputs"), list) and doc["inputs"]:
                doc["inputs"].append(json.loads(json.dumps(doc["inputs"][0])))
            continue
        if kind == "add_input":
            if isinstance(doc.get("inputs"), list):
                doc["inputs"].append(value)
            continue
        parent: Any = doc
        for key in path[:-1]:
            if isinstance(parent, dict) and isinstance(key, str):
                parent = parent.setdefault(key, {})
            elif isinstance(parent, list) and isinstance(key, int) and key < len(parent):
                parent = parent[key]
            else:
                parent = None
                break
        last = path[-1]
        if isinstance(parent, dict) and isinstance(last, str):
            if kind == "set":
                parent[last] = value
            else:
                parent.pop(last, None)
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            if kind == "set":
                parent[last] = value
            else:
                del parent[last]
    return doc


@st.composite
def byte_mutations(draw: st.DrawFn) -> list[tuple[str, float, bytes]]:
    """A few edits at relative positions: flip, insert, delete, cut, duplicate."""
    if draw(st.integers(0, 3)):  # mostly none
        return []
    return draw(
        st.lists(
            st.tuples(st.sampled_from(["flip", "insert", "delete", "cut", "dup"]), st.floats(0, 1),
                      st.binary(min_size=1, max_size=8)),
            min_size=1, max_size=3,
        )
    )  # fmt: skip


def apply_bytes(data: bytes, edits: list[tuple[str, float, bytes]]) -> bytes:
    buf = bytearray(data)
    for op, where, payload in edits:
        i = min(int(where * len(buf)), max(len(buf) - 1, 0))
        if op == "flip" and buf:
            buf[i] ^= payload[0] or 0xFF
        elif op == "insert":
            buf[i:i] = payload
        elif op == "delete":
            del buf[i : i + len(payload)]
        elif op == "cut":
            del buf[i:]
        elif op == "dup":
            buf[i:i] = buf[i : i + 64]
    return bytes(buf)


models = st.sampled_from(["accumulator"] * 6 + ["accumulator_corrid", "add_sub", "echo_bytes", "no_such_model"])
encodings = st.sampled_from([None] * 6 + ["gzip", "deflate", "gzip-cut", "br", "identity"])


def base_json(model: str, sid: int) -> dict[str, Any]:
    if model == "add_sub":
        pair = {"datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}
        return {"inputs": [{"name": "INPUT0", **pair}, {"name": "INPUT1", **pair}]}
    if model == "echo_bytes":
        return {"inputs": [{"name": "IN", "datatype": "BYTES", "shape": [1, 2], "data": ["ab", "c"]}]}
    return {
        "id": "fz",
        "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
        "outputs": [{"name": "OUTPUT"}],
        "parameters": {"sequence_id": sid, "sequence_start": True, "sequence_end": True},
    }


def encode(body: bytes, encoding: str | None) -> tuple[bytes, list[tuple[str, str]]]:
    if encoding is None:
        return body, []
    if encoding == "gzip":
        return gzip.compress(body), [("Content-Encoding", "gzip")]
    if encoding == "deflate":
        return zlib.compress(body), [("Content-Encoding", "deflate")]
    if encoding == "gzip-cut":
        z = gzip.compress(body)
        return z[: len(z) // 2], [("Content-Encoding", "gzip")]
    return body, [("Content-Encoding", encoding)]


# ------------------------------------------------------------------------- checking


@dataclass
class Sent:
    """What an example sent, for the cleanup: sequence ids it may have opened."""

    model: str
    ids: list[int | str] = field(default_factory=list)


def _ids_in_doc(doc: Any) -> list[int | str]:
    params = doc.get("parameters") if isinstance(doc, dict) else None
    if isinstance(params, dict) and params.get("sequence_end") is not True:
        sid = params.get("sequence_id")
        if isinstance(sid, int | str) and not isinstance(sid, bool) and sid not in (0, ""):
            return [sid]
    return []


def cleanup(h: Harness, sent: Sent, extra: list[Any]) -> None:
    if sent.model not in SEQUENCE_MODELS:
        return
    for sid in [*sent.ids, *extra]:
        if (isinstance(sid, int) and 0 < sid < 2**64) or (isinstance(sid, str) and 0 < len(sid) <= 128):
            release_sequence(h.port, sent.model, sid)


def check_live(h: Harness) -> None:
    assert h.live is not None
    assert not h.live.failures, f"the live sequences broke: {h.live.failures}\n{log_tail(h.server)}"


def check_http(h: Harness, data: bytes, sent: Sent) -> None:
    note(f"request bytes: {data[:2000]!r}")
    reply = send_raw(h.port, data)
    if reply.status is None:
        assert h.server.alive(), f"the server died: {reply.describe()}\n{log_tail(h.server)}"
    assert reply.status is not None, reply.describe()
    assert reply.status == 200 or reply.status in HTTP_REFUSALS, reply.describe()
    assert reply.elapsed <= ANSWER_BOUND_S, reply.describe()
    extra: list[Any] = []
    if reply.status == 200:
        doc, _ = infer_doc(reply)
        params = doc.get("parameters") or {}
        extra = [params["sequence_id"]] if "sequence_id" in params else []
    else:
        error_message(reply)
    cleanup(h, sent, extra)
    check_live(h)


def run_fuzz_test(budget: Budget, body: Callable[[], None]) -> None:
    if budget.spent():
        return
    budget.sent += 1
    body()


@pytest.fixture
def live_check(hostile: Harness) -> Any:
    """After a fuzz test: the server is up and the live sequences stepped on."""
    assert hostile.live is not None
    since = hostile.live.snapshot()
    yield hostile
    problems = hostile.problems(since)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------- HTTP JSON


def test_fuzz_http_json(live_check: Harness) -> None:
    h = live_check
    budget = Budget()

    @fuzz
    @given(model=models, ops=json_mutations(), edits=byte_mutations(), encoding=encodings)
    def example(model: str, ops: list[tuple[Any, ...]], edits: list[Any], encoding: str | None) -> None:
        def body() -> None:
            doc = apply_json(base_json(model, new_int_id()), ops)
            raw = apply_bytes(json.dumps(doc, allow_nan=True).encode(), edits)
            payload, headers = encode(raw, encoding)
            check_http(h, http_bytes("POST", infer_path(model), payload, headers), Sent(model, _ids_in_doc(doc)))

        run_fuzz_test(budget, body)

    example()


# -------------------------------------------------------------------- HTTP binary

IHCL_JUNK = ["", "-1", "abc", "\u00b2", "1e3", "0x10", str(2**64), "9" * 40, " 7 ", "+7"]


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[str, dict[str, Any], bytes]:
    model = draw(st.sampled_from(["accumulator"] * 3 + ["echo_bytes", "add_sub"]))
    sid = new_int_id()
    if model == "echo_bytes":
        items = draw(st.lists(st.binary(max_size=12), min_size=1, max_size=4))
        tail = bytes_elements(*items)
        inputs = [{"name": "IN", "datatype": "BYTES", "shape": [1, len(items)],
                   "parameters": {"binary_data_size": len(tail)}}]  # fmt: skip
        doc: dict[str, Any] = {"inputs": inputs}
    elif model == "add_sub":
        tail = bytes(32)
        doc = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}
                          for n in ("INPUT0", "INPUT1")]}  # fmt: skip
    else:
        tail = struct.pack("<f", 1.0)
        doc = base_json("accumulator", sid)
        doc["inputs"][0].pop("data")
        doc["inputs"][0]["parameters"] = {"binary_data_size": 4}
    return model, doc, tail


@st.composite
def tail_edits(draw: st.DrawFn) -> tuple[str, int, bytes]:
    return (
        draw(st.sampled_from(["keep"] * 3 + ["cut", "append", "replace", "prefix"])),
        draw(st.integers(0, 64)),
        draw(st.binary(max_size=64) | st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x80ab", b"\x07\x00"])),
    )


def test_fuzz_http_binary(live_check: Harness) -> None:
    h = live_check
    budget = Budget()

    @fuzz
    @given(
        req=binary_requests(),
        ops=json_mutations(),
        tail_op=tail_edits(),
        ihcl=st.one_of(st.just(0), st.just(0), st.integers(-8, 8), st.sampled_from(IHCL_JUNK)),
        encoding=encodings,
    )
    def example(
        req: tuple[str, dict[str, Any], bytes],
        ops: list[tuple[Any, ...]],
        tail_op: tuple[str, int, bytes],
        ihcl: int | str,
        encoding: str | None,
    ) -> None:
        def body() -> None:
            model, doc, tail = req
            doc = apply_json(json.loads(json.dumps(doc)), ops)
            op, n, junk = tail_op
            if op == "cut":
                tail = tail[: n % (len(tail) + 1)]
            elif op == "append":
                tail += junk
            elif op == "replace":
                tail = junk
            elif op == "prefix":
                tail = junk[:4] + tail
            head = json.dumps(doc, allow_nan=True).encode()
            value = str(len(head) + ihcl) if isinstance(ihcl, int) else ihcl
            payload, headers = encode(head + tail, encoding)
            headers.append(("Inference-Header-Content-Length", value))
            check_http(h, http_bytes("POST", infer_path(model), payload, headers), Sent(model, _ids_in_doc(doc)))

        run_fuzz_test(budget, body)

    example()


# ------------------------------------------------------------------------- gRPC

PARAM_KEYS = ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "custom", "binary_data_output"]
param_values = st.one_of(
    st.tuples(st.just("bool_param"), st.booleans()),
    st.tuples(st.just("int64_param"), st.sampled_from([0, 1, -1, 2**31, -(2**63), 2**63 - 1]) | st.integers(-(2**63),
                                                                                                            2**63 - 1)),
    st.tuples(st.just("uint64_param"), st.sampled_from([0, 1, 2**31, 2**63, 2**64 - 1]) | st.integers(0, 2**64 - 1)),
    st.tuples(st.just("double_param"), floats),
    st.tuples(st.just("string_param"), st.text(max_size=200)),
    st.tuples(st.just("unset"), st.none()),
)  # fmt: skip
int64s = st.one_of(st.sampled_from([0, 1, -1, 2**31, 2**62, 2**63 - 1, -(2**63), 10**12, 250_000_000]),
                   st.integers(-(2**63), 2**63 - 1))  # fmt: skip
CONTENT_FIELDS = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32, allow_nan=True),
    "fp64_contents": floats,
    "bytes_contents": st.binary(max_size=8),
}


@st.composite
def grpc_mutations(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["model", "version", "id", "shape", "shape", "datatype", "name", "raw", "raw",
                                     "add_input", "contents", "param", "param", "param", "output"]))  # fmt: skip
        if kind == "model":
            ops.append((kind, draw(st.sampled_from(["", "no_such", "add_sub", "echo_bytes", "accumulator_corrid"])
                                   | st.text(max_size=40))))  # fmt: skip
        elif kind == "version":
            versions = st.sampled_from(["1", "2", "0", "-1", "abc", " 1", "9" * 30]) | st.text(max_size=8)
            ops.append((kind, draw(versions)))
        elif kind == "id":
            ops.append((kind, draw(st.text(max_size=64))))
        elif kind == "shape":
            ops.append((kind, draw(st.lists(int64s, max_size=8) | st.just([1] * 65))))
        elif kind == "datatype":
            ops.append((kind, draw(datatypes)))
        elif kind == "name":
            ops.append((kind, draw(st.sampled_from(["", "INPUT", "INPUT0", "IN", "X"]) | st.text(max_size=10))))
        elif kind == "raw":
            ops.append(
                (
                    kind,
                    draw(st.sampled_from(["replace", "append", "clear"])),
                    draw(st.binary(max_size=32) | st.sampled_from([b"\xff\xff\xff\xffab", b"\x02\x00"])),
                )
            )
        elif kind == "add_input":
            ops.append((kind, draw(st.text(max_size=8)), draw(datatypes), draw(st.lists(int64s, max_size=4))))
        elif kind == "contents":
            name = draw(st.sampled_from(sorted(CONTENT_FIELDS)))
            ops.append((kind, name, draw(st.lists(CONTENT_FIELDS[name], max_size=5)), draw(st.booleans())))
        elif kind == "param":
            ops.append((kind, draw(st.sampled_from(PARAM_KEYS) | st.text(max_size=8)), *draw(param_values)))
        else:
            ops.append((kind, draw(st.sampled_from(["OUTPUT", "", "NOPE", "OUTPUT0"]) | st.text(max_size=8))))
    return ops


def base_grpc(model: str) -> service_pb2.ModelInferRequest:
    if model == "add_sub":
        r = service_pb2.ModelInferRequest(model_name="add_sub", id="fz")
        for name in ("INPUT0", "INPUT1"):
            r.inputs.add(name=name, datatype="FP32", shape=[1, 4])
            r.raw_input_contents.append(bytes(16))
        return r
    if model == "echo_bytes":
        r = service_pb2.ModelInferRequest(model_name="echo_bytes", id="fz")
        r.inputs.add(name="IN", datatype="BYTES", shape=[1, 2])
        r.raw_input_contents.append(bytes_elements(b"ab", b"c"))
        return r
    return acc_request(new_int_id(), 1.0, model=model, rid="fz")


def apply_grpc(r: service_pb2.ModelInferRequest, ops: list[tuple[Any, ...]]) -> service_pb2.ModelInferRequest:
    for op in ops:
        kind = op[0]
        t = r.inputs[0] if r.inputs else r.inputs.add(name="INPUT", datatype="FP32")
        if kind == "model":
            r.model_name = op[1]
        elif kind == "version":
            r.model_version = op[1]
        elif kind == "id":
            r.id = op[1]
        elif kind == "shape":
            del t.shape[:]
            t.shape.extend(op[1])
        elif kind == "datatype":
            t.datatype = op[1]
        elif kind == "name":
            t.name = op[1]
        elif kind == "raw":
            if op[1] == "clear":
                r.ClearField("raw_input_contents")
            elif op[1] == "append" or not r.raw_input_contents:
                r.raw_input_contents.append(op[2])
            else:
                r.raw_input_contents[0] = op[2]
        elif kind == "add_input":
            r.inputs.add(name=op[1], datatype=op[2], shape=op[3])
        elif kind == "contents":
            getattr(t.contents, op[1]).extend(op[2])
            if op[3]:
                r.ClearField("raw_input_contents")
        elif kind == "param":
            _, key, which, value = op
            if which == "unset":
                r.parameters[key].Clear()
            else:
                setattr(r.parameters[key], which, value)
        else:
            r.outputs.add(name=op[1])
    return r


def _ids_in_msg(r: service_pb2.ModelInferRequest) -> list[int | str]:
    if "sequence_id" not in r.parameters:
        return []
    if "sequence_end" in r.parameters and r.parameters["sequence_end"].bool_param is True:
        return []
    p = r.parameters["sequence_id"]
    kind = p.WhichOneof("parameter_choice")
    if kind == "int64_param":
        return [p.int64_param & (2**64 - 1)]
    if kind == "uint64_param":
        return [p.uint64_param]
    if kind == "string_param":
        return [p.string_param]
    return []


def _decodes(payload: bytes) -> service_pb2.ModelInferRequest | None:
    try:
        return service_pb2.ModelInferRequest.FromString(payload)
    except Exception:
        return None


def _reply_ids(resp: service_pb2.ModelInferResponse) -> list[Any]:
    if "sequence_id" in resp.parameters:
        p = resp.parameters["sequence_id"]
        return [getattr(p, p.WhichOneof("parameter_choice") or "string_param")]
    return []


def test_fuzz_grpc_unary(live_check: Harness) -> None:
    h = live_check
    budget = Budget()

    @fuzz
    @given(model=models, ops=grpc_mutations(), edits=byte_mutations())
    def example(model: str, ops: list[tuple[Any, ...]], edits: list[Any]) -> None:
        def body() -> None:
            msg = apply_grpc(base_grpc(model if model != "no_such_model" else "accumulator"), ops)
            payload = apply_bytes(msg.SerializeToString(), edits)
            note(f"payload: {payload[:2000]!r}")
            decoded = _decodes(payload)
            reply = grpc_unary(h.channel(), "ModelInfer", payload)
            if reply.code == Code.UNAVAILABLE:
                assert h.server.alive(), f"the server died: {reply.describe()}\n{log_tail(h.server)}"
            assert_clean_grpc(reply, {Code.OK, *ALLOWED_GRPC})
            extra: list[Any] = []
            if reply.code == Code.OK:
                assert reply.payload is not None
                resp = service_pb2.ModelInferResponse.FromString(reply.payload)
                assert len(resp.raw_output_contents) == len(resp.outputs), resp
                extra = _reply_ids(resp)
            if decoded is not None:
                cleanup(h, Sent(decoded.model_name, _ids_in_msg(decoded)), extra)
            check_live(h)

        run_fuzz_test(budget, body)

    example()


# ------------------------------------------------------------------------- stream


def test_fuzz_grpc_stream(live_check: Harness) -> None:
    h = live_check
    budget = Budget()

    @fuzz
    @given(
        batch=st.lists(st.tuples(models, grpc_mutations(), byte_mutations()), min_size=1, max_size=4),
        garbage=st.one_of(st.none(), st.none(), st.binary(min_size=1, max_size=24)),
    )
    def example(batch: list[tuple[str, list[Any], list[Any]]], garbage: bytes | None) -> None:
        def body() -> None:
            payloads = []
            for model, ops, edits in batch:
                msg = apply_grpc(base_grpc(model if model != "no_such_model" else "accumulator"), ops)
                payloads.append(apply_bytes(msg.SerializeToString(), edits))
            if garbage is not None:
                payloads.insert(len(payloads) // 2, garbage)
            note(f"payloads: {[p[:500] for p in payloads]!r}")
            decoded = [_decodes(p) for p in payloads]
            stream = RawStream(h.channel())
            extra: list[Any] = []
            try:
                for p in payloads:
                    stream.send(p)
                sid = new_int_id()
                stream.send(acc_request(sid, 2.0, rid="after"))
                for i, d in enumerate(decoded):
                    ev = stream.next_event(ANSWER_BOUND_S)
                    assert ev is not None, f"the stream went silent after payload {i}"
                    if ev.message is None:
                        # ending the stream is a clean answer only to a payload that is no message
                        assert ev.code in ALLOWED_GRPC, ev.describe()
                        assert any(x is None for x in decoded[i:]), (
                            f"a decodable request ended the stream: {ev.describe()}"
                        )
                        return
                    resp = ev.message.infer_response
                    assert resp.id != "after" or ev.message.error_message, f"payload {i} got no reply: {ev.describe()}"
                    if d is not None:
                        assert resp.id == d.id, f"reply {i} does not echo its request's id: {ev.describe()}"
                    if not ev.message.error_message:
                        assert len(resp.raw_output_contents) == len(resp.outputs), ev.describe()
                        extra += _reply_ids(resp)
                ev = stream.next_event(ANSWER_BOUND_S)
                assert ev is not None and ev.message is not None, ev and ev.describe()
                assert not ev.message.error_message and ev.message.infer_response.id == "after", ev.describe()
                assert stream_reply_value(ev.message) == 2.0
            finally:
                stream.cancel()
                for d in decoded:
                    if d is not None:
                        cleanup(h, Sent(d.model_name, _ids_in_msg(d)), [])
                for sid_ in extra:
                    for m in SEQUENCE_MODELS:
                        release_sequence(h.port, m, sid_)
            check_live(h)

        run_fuzz_test(budget, body)

    example()


def test_fuzz_settings_are_bounded() -> None:
    """CI runs are bounded and reproducible unless a long run is asked for."""
    if not LONG_EXAMPLES:
        assert FUZZ.derandomize or SEED is not None
        assert BUDGET_S is not None and BUDGET_S <= 30
