"""Sequences over every transport: HTTP, HTTP aio, gRPC, gRPC aio, and the gRPC stream (sync
start_stream / async_stream_infer and aio stream_infer). Every reply is checked against the
running sum the accumulator models keep. Every sequence opened here is also ended, so the
session server's 8 slots per model never fill up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.support.clients import (
    Client,
    SyncStream,
    acc_input,
    aio_stream,
    expect_error,
    grpc_input,
    http_request,
    new_int_id,
    new_str_id,
    raw_output,
)
from tests.support.process import ServerProcess

START_MSG = "must specify the START flag on the first request of the sequence"
NO_ID_MSG = "must specify a non-zero or non-empty correlation ID"


@pytest.mark.parametrize("model", ["accumulator", "accumulator_corrid"])
async def test_interleaved_sequences(client: Client, model: str) -> None:
    # accumulator_corrid's CORRID control is UINT64, so it takes integer ids only
    ids: list[int | str] = [new_int_id(), new_int_id()]
    if model == "accumulator":
        ids += [new_str_id(), new_str_id()]
    sums = dict.fromkeys(ids, 0.0)
    steps = 4
    for k in range(steps):
        for n, sid in enumerate(ids):
            value = float(10 * n + k + 1)
            sums[sid] += value
            version = "1" if k == 1 else ""  # the versioned route too
            got = await client.step(
                model, sid, value, sequence_start=k == 0, sequence_end=k == steps - 1, model_version=version
            )
            assert got == sums[sid], (sid, k)


async def test_id_reuse_after_end(client: Client) -> None:
    for sid in (new_int_id(), new_str_id()):
        assert await client.step("accumulator", sid, 5, sequence_start=True) == 5
        assert await client.step("accumulator", sid, 2, sequence_end=True) == 7
        # ended: the id is unknown again, so a request without START is refused ...
        await expect_error(client.step("accumulator", sid, 1), client.code("INVALID_ARG"), START_MSG, str(sid))
        # ... and a new START reuses the id for a fresh sequence (state reset)
        assert await client.step("accumulator", sid, 3, sequence_start=True) == 3
        assert await client.step("accumulator", sid, 4, sequence_end=True) == 7


async def test_missing_start(client: Client) -> None:
    sid = new_int_id()
    e = await expect_error(client.step("accumulator", sid, 1), client.code("INVALID_ARG"), START_MSG)
    assert f"sequence {sid} to model 'accumulator'" in e.message()
    e = await expect_error(client.step("accumulator", "never-started", 1), client.code("INVALID_ARG"), START_MSG)
    assert "sequence never-started" in e.message()


async def test_int_and_string_ids_are_distinct(client: Client) -> None:
    n = new_int_id()
    assert await client.step("accumulator", n, 1, sequence_start=True) == 1
    assert await client.step("accumulator", str(n), 100, sequence_start=True) == 100
    assert await client.step("accumulator", n, 2, sequence_end=True) == 3
    assert await client.step("accumulator", str(n), 200, sequence_end=True) == 300


async def test_start_on_active_id_restarts(client: Client) -> None:
    sid = new_int_id()
    assert await client.step("accumulator", sid, 1, sequence_start=True) == 1
    assert await client.step("accumulator", sid, 2) == 3
    assert await client.step("accumulator", sid, 42, sequence_start=True) == 42
    assert await client.step("accumulator", sid, 9, sequence_end=True) == 51


# ----------------------------------------------------------------------------- streams


def _stream_plan(model: str, ids: list[int | str], steps: int) -> list[dict[str, Any]]:
    """Interleaved requests (async_stream_infer keyword dicts) with their expected sums."""
    plan = []
    sums = dict.fromkeys(ids, 0.0)
    for k in range(steps):
        for n, sid in enumerate(ids):
            value = float(n + 1) * (k + 1)
            sums[sid] += value
            plan.append(
                {
                    "model_name": model,
                    "inputs": [grpc_input(value)],
                    "request_id": f"{sid}/{k}",
                    "sequence_id": sid,
                    "sequence_start": k == 0,
                    "sequence_end": k == steps - 1,
                    "expect": sums[sid],
                }
            )
    return plan


def _check_replies(plan: list[dict[str, Any]], replies: list[tuple[Any, Any]]) -> None:
    expected = {p["request_id"]: p["expect"] for p in plan}
    seen: dict[str, list[int]] = {}
    for result, error in replies:
        assert error is None, error
        rid = result.get_response().id
        assert float(result.as_numpy("OUTPUT")[0, 0]) == expected.pop(rid), rid
        assert result.get_response().parameters["triton_final_response"].bool_param is True
        sid, k = rid.rsplit("/", 1)
        seen.setdefault(sid, []).append(int(k))
    assert not expected, f"no reply for {sorted(expected)}"
    for sid, order in seen.items():  # one sequence's replies come back in its order
        assert order == sorted(order), (sid, order)


@pytest.mark.parametrize("model", ["accumulator", "accumulator_corrid"])
def test_sync_stream_interleaved(server: ServerProcess, model: str) -> None:
    ids: list[int | str] = [new_int_id(), new_int_id()]
    if model == "accumulator":
        ids += [new_str_id(), new_str_id()]
    plan = _stream_plan(model, ids, steps=4)
    stream = SyncStream(server)
    try:
        for p in plan:
            stream.send(**{k: v for k, v in p.items() if k != "expect"})
        replies = [stream.get() for _ in plan]
    finally:
        stream.close()
    _check_replies(plan, replies)


@pytest.mark.parametrize("model", ["accumulator", "accumulator_corrid"])
async def test_aio_stream_interleaved(server: ServerProcess, model: str) -> None:
    ids: list[int | str] = [new_int_id(), new_int_id()]
    if model == "accumulator":
        ids += [new_str_id(), new_str_id()]
    plan = _stream_plan(model, ids, steps=4)
    replies = await aio_stream(server, [{k: v for k, v in p.items() if k != "expect"} for p in plan])
    _check_replies(plan, replies)


def _error_plan() -> tuple[list[dict[str, Any]], dict[str, tuple[float | None, str]]]:
    """Good steps of one sequence with failing requests in between: (requests, expectations
    by request id: (sum, None) or (None, error fragment))."""
    sid = new_int_id()
    bad_dtype = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    bad_dtype.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    reqs: list[dict[str, Any]] = [
        {"model_name": "accumulator", "inputs": [grpc_input(1)], "request_id": "ok-1", "sequence_id": sid,
         "sequence_start": True},
        {"model_name": "no_such_model", "inputs": [grpc_input(1)], "request_id": "bad-model"},
        {"model_name": "accumulator", "inputs": [grpc_input(1)], "request_id": "bad-start",
         "sequence_id": new_int_id()},
        {"model_name": "accumulator", "inputs": [grpc_input(2)], "request_id": "ok-2", "sequence_id": sid},
        {"model_name": "accumulator", "inputs": [bad_dtype], "request_id": "bad-dtype", "sequence_id": sid},
        {"model_name": "accumulator", "inputs": [grpc_input(3)], "request_id": "ok-3", "sequence_id": sid,
         "sequence_end": True},
    ]  # fmt: skip
    expect: dict[str, tuple[float | None, str]] = {
        "ok-1": (1.0, ""),
        "bad-model": (None, "Request for unknown model: 'no_such_model' is not found"),
        "bad-start": (None, START_MSG),
        "ok-2": (3.0, ""),
        "bad-dtype": (None, "[request id: bad-dtype] inference input 'INPUT' data-type is 'INT32'"),
        "ok-3": (6.0, ""),
    }
    return reqs, expect


def _check_error_replies(replies: list[tuple[Any, Any]], expect: dict[str, tuple[float | None, str]]) -> None:
    assert len(replies) == len(expect)
    results = [r for r, e in replies if e is None]
    errors = [e for r, e in replies if e is not None]
    got = {r.get_response().id: float(r.as_numpy("OUTPUT")[0, 0]) for r in results}
    assert got == {rid: s for rid, (s, _) in expect.items() if s is not None}
    want_errors = sorted(frag for s, frag in expect.values() if s is None)
    messages = sorted(e.message() for e in errors)
    assert len(messages) == len(want_errors)
    for frag in want_errors:
        assert any(frag in m for m in messages), (frag, messages)


def test_sync_stream_survives_errors(server: ServerProcess) -> None:
    reqs, expect = _error_plan()
    stream = SyncStream(server)
    try:
        for r in reqs:
            stream.send(**r)
        replies = [stream.get() for _ in reqs]
        # the stream is still usable afterwards
        sid = new_str_id()
        stream.send("accumulator", [grpc_input(7)], request_id="after", sequence_id=sid, sequence_start=True,
                    sequence_end=True)  # fmt: skip
        result, error = stream.get()
        assert error is None and float(result.as_numpy("OUTPUT")[0, 0]) == 7.0
    finally:
        stream.close()
    _check_error_replies(replies, expect)


async def test_aio_stream_survives_errors(server: ServerProcess) -> None:
    reqs, expect = _error_plan()
    replies = await aio_stream(server, reqs)
    _check_error_replies(replies, expect)


def test_stream_error_echoes_request_id(server: ServerProcess) -> None:
    """tritonclient drops everything but the message from a stream error; the wire reply
    (read here with tritonclient's own generated stubs) also carries the request id."""

    def req(rid: str, model: str, seq: int, start: bool, raw: bytes) -> service_pb2.ModelInferRequest:
        r = service_pb2.ModelInferRequest(model_name=model, id=rid)
        r.inputs.add(name="INPUT", datatype="FP32", shape=[1, 1])
        r.raw_input_contents.append(raw)
        r.parameters["sequence_id"].int64_param = seq
        r.parameters["sequence_start"].bool_param = start
        return r

    sid = new_int_id()
    one = np.float32(1).tobytes()
    reqs = [
        req("e-model", "no_such_model", sid, True, one),
        req("e-start", "accumulator", new_int_id(), False, one),
        req("e-size", "accumulator", sid, True, b"\0\0"),
        req("good", "accumulator", sid, True, one),
    ]
    end = req("good-end", "accumulator", sid, False, one)
    end.parameters["sequence_end"].bool_param = True
    reqs.append(end)
    with grpc.insecure_channel(server.grpc_url) as ch:
        replies = list(service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelStreamInfer(iter(reqs), timeout=20))
    by_id = {r.infer_response.id: r for r in replies}
    assert set(by_id) == {"e-model", "e-start", "e-size", "good", "good-end"}
    for rid in ("e-model", "e-start", "e-size"):
        assert by_id[rid].error_message, rid
        assert not by_id[rid].infer_response.outputs
    assert "no_such_model" in by_id["e-model"].error_message
    assert START_MSG in by_id["e-start"].error_message
    assert "expecting 4 bytes" in by_id["e-size"].error_message
    assert by_id["good"].error_message == "" and by_id["good-end"].error_message == ""
    out = by_id["good-end"].infer_response.raw_output_contents[0]
    assert np.frombuffer(out, dtype=np.float32).tolist() == [2.0]


# ----------------------------------------------------------------------- server-made ids


def _generated_id(client: Client, result: Any) -> int | str:
    if client.is_http:
        return result.get_response()["parameters"]["sequence_id"]  # type: ignore[no-any-return]
    p = result.get_response().parameters["sequence_id"]
    return p.string_param if p.WhichOneof("parameter_choice") == "string_param" else p.int64_param


@pytest.mark.parametrize("model", ["accumulator", "accumulator_corrid"])
async def test_server_generated_id(client: Client, model: str) -> None:
    """No sequence id to a sequence model starts a new sequence under an id the server makes
    up and returns as the `sequence_id` response parameter; that id continues the sum."""
    inp = client.input("INPUT", np.array([[4.0]], dtype=np.float32))
    first = await client("infer", model, [inp])
    assert float(first.as_numpy("OUTPUT")[0, 0]) == 4.0
    sid = _generated_id(client, first)
    assert sid
    # accumulator: string ids; accumulator_corrid: ids fit its UINT64 CORRID control
    assert isinstance(sid, str if model == "accumulator" else int)
    other = _generated_id(client, await client("infer", model, [inp]))
    assert other != sid  # every id-less request opens its own sequence
    assert await client.step(model, other, 0, sequence_end=True) == 4.0
    assert await client.step(model, sid, 6) == 10.0
    assert await client.step(model, sid, 1, sequence_end=True) == 11.0
    await expect_error(client.step(model, sid, 1), client.code("INVALID_ARG"), START_MSG)


@pytest.mark.parametrize("model", ["accumulator", "accumulator_corrid"])
def test_session_header_generated(server: ServerProcess, model: str) -> None:
    """HTTP: the generated id also comes back in the Inference-Session-Id header, and sending
    that header back (tritonclient `headers=`) continues the sequence."""
    r = http_request(server, "POST", f"/v2/models/{model}/infer", {"inputs": [acc_input(2.0)]})
    assert r.status == 200, r.body
    assert raw_output(r) == [2.0]
    sid = r.headers["inference-session-id"]
    sid_param = r.json()["parameters"]["sequence_id"]
    assert str(sid_param) == sid

    cl = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[3.0]], dtype=np.float32))
        result = cl.infer(model, [inp], headers={"Inference-Session-Id": sid})
        assert float(result.as_numpy("OUTPUT")[0, 0]) == 5.0
    finally:
        cl.close()
    # raw again: the reply names the session; END through the header
    r = http_request(
        server,
        "POST",
        f"/v2/models/{model}/infer",
        {"inputs": [acc_input(1.0)], "parameters": {"sequence_end": True}},
        headers={"Inference-Session-Id": sid},
    )
    assert r.status == 200, r.body
    assert raw_output(r) == [6.0]
    assert r.headers["inference-session-id"] == sid
    # ended: the session's next request is refused (410), not started afresh
    r = http_request(
        server, "POST", f"/v2/models/{model}/infer", {"inputs": [acc_input()]}, {"Inference-Session-Id": sid}
    )
    assert r.status == 410
    assert r.error() == f"session '{sid}' was ended by its END request; start a new session with a new id"
    # the sequence_id parameter keeps Triton's START error
    doc = {"inputs": [acc_input()], "parameters": {"sequence_id": sid_param}}
    r = http_request(server, "POST", f"/v2/models/{model}/infer", doc)
    assert r.status == 400 and START_MSG in r.error()


def test_session_header_names_sequence(server: ServerProcess) -> None:
    """A client-chosen Inference-Session-Id names the sequence like a string sequence_id; the
    first request of a session the server does not know starts it (START implied)."""
    sid = new_str_id()
    path = "/v2/models/accumulator/infer"
    hdr = {"Inference-Session-Id": sid}
    r = http_request(server, "POST", path, {"inputs": [acc_input(1.0)]}, hdr)
    assert r.status == 200, r.body
    assert raw_output(r) == [1.0] and r.headers["inference-session-id"] == sid

    cl = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("INPUT", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[10.0]], dtype=np.float32))
        assert float(cl.infer("accumulator", [inp], headers=hdr).as_numpy("OUTPUT")[0, 0]) == 11.0
        # the header is the same sequence as the string id
        res = cl.infer("accumulator", [inp], sequence_id=sid, sequence_end=True)
        assert float(res.as_numpy("OUTPUT")[0, 0]) == 21.0
    finally:
        cl.close()


async def test_strict_sequence_ids(launch: Callable[..., ServerProcess]) -> None:
    srv = launch(None, "--strict-sequence-ids")
    path = "/v2/models/accumulator/infer"
    for params in ({}, {"sequence_start": True}, {"sequence_end": True}, {"sequence_id": 0}, {"sequence_id": ""}):
        r = http_request(srv, "POST", path, {"inputs": [acc_input()], "parameters": params})
        assert r.status == 400, (params, r.body)
        assert r.error() == f"inference request to model 'accumulator' {NO_ID_MSG}"
        assert "inference-session-id" not in r.headers
    for flavour in ("http", "http_aio", "grpc", "grpc_aio"):
        cl = Client(flavour, srv)
        try:
            inp = cl.input("INPUT", np.array([[1.0]], dtype=np.float32))
            await expect_error(cl("infer", "accumulator_corrid", [inp]), cl.code("INVALID_ARG"), NO_ID_MSG)
            # named sequences and stateless models are unaffected
            sid = new_int_id()
            assert await cl.step("accumulator", sid, 2, sequence_start=True) == 2
            assert await cl.step("accumulator", sid, 3, sequence_end=True) == 5
            a = np.ones((1, 4), dtype=np.float32)
            res = await cl("infer", "add_sub", [cl.input("INPUT0", a), cl.input("INPUT1", a)])
            assert res.as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
        finally:
            await cl.close()
    # a session header still names a sequence in strict mode
    sid = new_str_id()
    r = http_request(
        srv, "POST", path, {"inputs": [acc_input(5.0)], "parameters": {"sequence_start": True, "sequence_end": True}},
        {"Inference-Session-Id": sid},
    )  # fmt: skip
    assert r.status == 200 and raw_output(r) == [5.0]


async def test_concurrent_sequences_all_clients(server: ServerProcess) -> None:
    """Four clients, one sequence each, stepping at the same time (the blocking clients in
    their own threads, where they are also created: gevent sockets stay in their thread)."""

    async def run(flavour: str) -> None:
        cl = Client(flavour, server)
        try:
            sid = new_int_id() if cl.is_aio else new_str_id()
            total = 0.0
            for k in range(8):
                total += k + 1
                got = await cl.step("accumulator", sid, k + 1, sequence_start=k == 0, sequence_end=k == 7)
                assert got == total
        finally:
            await cl.close()

    await asyncio.gather(
        run("http_aio"),
        run("grpc_aio"),
        asyncio.to_thread(asyncio.run, run("http")),
        asyncio.to_thread(asyncio.run, run("grpc")),
    )
