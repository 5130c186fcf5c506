"""BLS without a server: ModelCalls against a fake server on a loop thread, and the pb_utils
objects (InferenceRequest.exec / async_exec, the responses they give) built on it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from seqserve.engine.backends import bls, triton_adapter, triton_bls
from seqserve.engine.backends import triton_utils as pb
from seqserve.engine.errors import Code, InferenceError
from seqserve.engine.request import InferRequest
from seqserve.engine.responses import InferResult, ResponseCallback


class FakeModel:
    def __init__(self, name: str, version: int = 1) -> None:
        self.name = name
        self.version = version
        self.instance_names = ["0"]
        self.decoupled = name.startswith("dec")
        self.inline_ended = 0

    def end_inline(self) -> None:
        self.inline_ended += 1


class FakeServer:
    """Answers each request on the loop with what ``script`` says for its model: a list of
    (response, final) pairs, or nothing (it never answers)."""

    def __init__(self, script: dict[str, list[tuple[Any, bool]]]) -> None:
        self.script = script
        self.models: dict[str, FakeModel] = {}
        self.requests: list[InferRequest] = []
        self.cancelled: list[InferRequest] = []

    def model(self, name: str, version: str | int = "") -> FakeModel:
        if name not in self.script and name not in self.models:
            raise InferenceError(Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return self.models.setdefault(name, FakeModel(name))

    def enqueue_streaming(
        self, request: InferRequest, on_response: ResponseCallback, *, model: Any = None
    ) -> Callable[[], None]:
        self.requests.append(request)
        loop = asyncio.get_running_loop()
        for response, final in self.script.get(request.model, []):
            loop.call_soon(on_response, response, final)
        return lambda: self.cancelled.append(request)


def result(value: float, name: str = "OUTPUT") -> InferResult:
    return InferResult("m", "1", "", {name: np.array([[value]], np.float32)})


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def calls_on(
    loop: asyncio.AbstractEventLoop, script: dict[str, list[tuple[Any, bool]]]
) -> tuple[bls.ModelCalls, FakeServer]:
    server = FakeServer(script)
    calls = bls.ModelCalls(server)
    calls.bind(loop)
    return calls, server


def request(model: str = "acc") -> InferRequest:
    return bls.call_request(model, {"INPUT": np.ones((1, 1), np.float32)}, "", 0, False, False, (), "", None)


def test_infer_returns_the_callee_result(loop) -> None:
    calls, server = calls_on(loop, {"acc": [(result(3.0), True)], "caller": []})
    got = calls.caller("caller", 1).infer(
        "acc", {"INPUT": np.ones((1, 1), np.float32)}, sequence_id=5, sequence_start=True
    )
    assert float(got.outputs["OUTPUT"][0, 0]) == 3.0
    (sent,) = server.requests
    assert (sent.sequence_id, sent.sequence_start, sent.sequence_end) == (5, True, False)
    # the caller blocks in execute: it was taken off inline execution, once
    calls.caller("caller", 1).infer("acc", {"INPUT": np.ones((1, 1), np.float32)})
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
    assert server.models["caller"].inline_ended == 1


def test_a_self_call_is_refused(loop) -> None:
    calls, _ = calls_on(loop, {"m": [(result(1.0), True)]})
    with pytest.raises(InferenceError) as e:
        calls.caller("m", 1).infer("m", {})
    assert e.value.code == Code.INVALID_ARG
    assert "model 'm' called itself from its own execute" in e.value.message


def test_unknown_callee(loop) -> None:
    calls, _ = calls_on(loop, {})
    with pytest.raises(InferenceError) as e:
        calls.caller("m", 1).infer("nowhere", {})
    assert e.value.code == Code.NOT_FOUND and "nowhere" in e.value.message


def test_timeout_cancels_the_call(loop) -> None:
    calls, server = calls_on(loop, {"silent": []})
    with pytest.raises(InferenceError) as e:
        calls.caller("m", 1).infer("silent", {}, timeout_s=0.05)
    assert e.value.code == Code.UNAVAILABLE
    assert e.value.message.startswith("Request timeout expired")
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01), loop).result(5)
    assert server.cancelled == server.requests


def test_stream_yields_responses_then_raises_an_error(loop) -> None:
    err = InferenceError(Code.INTERNAL, "boom")
    calls, _ = calls_on(
        loop,
        {"dec": [(result(1.0), False), (result(2.0), False), (None, True)], "bad": [(result(1.0), False), (err, True)]},
    )
    caller = calls.caller("m", 1)
    assert [float(r.outputs["OUTPUT"][0, 0]) for r in caller.stream("dec", {})] == [1.0, 2.0]
    assert list(calls.stream(request("dec"), None, None))[-1] is None  # the bare final flag
    got = []
    with pytest.raises(InferenceError, match="boom"):
        for r in caller.stream("bad", {}):
            got.append(r)
    assert len(got) == 1


def test_a_blocking_call_on_the_loop_is_refused(loop) -> None:
    calls, server = calls_on(loop, {"acc": [(result(1.0), True)], "m": []})

    async def on_loop() -> None:
        calls.caller("m", 1).infer("acc", {})

    with pytest.raises(InferenceError) as e:
        asyncio.run_coroutine_threadsafe(on_loop(), loop).result(5)
    assert e.value.code == Code.UNAVAILABLE and "event loop" in e.value.message
    assert server.models["m"].inline_ended == 1
    assert not server.requests


def test_no_server_running() -> None:
    calls = bls.ModelCalls(FakeServer({}))
    with pytest.raises(InferenceError) as e:
        calls.caller("m", 1).infer("acc", {})
    assert e.value.code == Code.UNAVAILABLE


def test_infer_async_on_another_loop(loop) -> None:
    calls, _ = calls_on(loop, {"acc": [(result(4.0), True)], "silent": []})

    async def model_loop() -> tuple[list[Any], InferenceError]:
        got = await calls.infer_async(request("acc"), bls.Caller("m", 1), None)
        with pytest.raises(InferenceError) as e:
            await calls.infer_async(request("silent"), bls.Caller("m", 1), 0.05)
        return got, e.value

    got, err = asyncio.run(model_loop())
    assert float(got[0].outputs["OUTPUT"][0, 0]) == 4.0
    assert err.message.startswith("Request timeout expired")


# ---------------------------------------------------------------------------- pb_utils

assert triton_adapter.TritonInstance  # the adapter wires pb_utils' exec to triton_bls when imported


def pb_request(model: str = "acc", **kw: Any) -> pb.InferenceRequest:
    return pb.InferenceRequest(
        model_name=model,
        inputs=[pb.Tensor("INPUT", np.ones((1, 1), np.float32))],
        requested_output_names=["OUTPUT"],
        **kw,
    )


def test_engine_request_carries_sequence_flags_and_timeout() -> None:
    flags = pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    r = pb_request(correlation_id="s-1", flags=flags, timeout=250_000, request_id="7", parameters={"k": 1})
    engine, timeout_s = triton_bls.engine_request(r, "acc", 2)
    assert (engine.model, engine.version, engine.id, engine.sequence_id) == ("acc", "2", "7", "s-1")
    assert engine.sequence_start and engine.sequence_end
    assert engine.outputs == ("OUTPUT",) and engine.parameters == {"k": 1}
    assert timeout_s == 0.25
    engine, timeout_s = triton_bls.engine_request(pb_request(), "acc", -1)
    assert engine.version == "" and timeout_s is None
    assert not engine.sequence_start and not engine.sequence_end
    with pytest.raises(pb.TritonModelException, match="model_name"):
        triton_bls.engine_request(pb_request(), "", -1)


def test_responses_as_pb_utils_presents_them() -> None:
    ok = triton_bls.response_of(result(2.0))
    assert not ok.has_error()
    assert pb.get_output_tensor_by_name(ok, "OUTPUT").as_numpy().tolist() == [[2.0]]
    assert triton_bls.response_of(None).output_tensors() == []
    bad = triton_bls.response_of(InferenceError(Code.INVALID_ARG, "bad input"))
    assert bad.has_error()
    assert bad.error().message() == "bad input" and bad.error().code() == pb.TritonError.INVALID_ARG


def test_exec_through_the_current_caller(loop) -> None:
    calls, server = calls_on(loop, {"acc": [(result(5.0), True)], "dec": [(result(1.0), False), (None, True)], "m": []})
    token = bls.CURRENT.set(calls.caller("m", 1))
    try:
        answer = pb_request(correlation_id=9, flags=pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START).exec()
        assert pb.get_output_tensor_by_name(answer, "OUTPUT").as_numpy().tolist() == [[5.0]]
        assert server.requests[-1].sequence_id == 9 and server.requests[-1].sequence_start
        responses = list(pb_request("dec").exec(decoupled=True))
        assert len(responses) == 2 and responses[-1].output_tensors() == []
        missing = pb_request("nowhere").exec()
        assert missing.has_error() and missing.error().code() == pb.TritonError.NOT_FOUND
        assert pb_request("m").exec().error().code() == pb.TritonError.INVALID_ARG  # itself
        (only,) = list(pb_request("nowhere").exec(decoupled=True))
        assert only.has_error()

        async def async_execute() -> Any:
            return await pb_request().async_exec()

        assert pb.get_output_tensor_by_name(asyncio.run(async_execute()), "OUTPUT") is not None
    finally:
        bls.CURRENT.reset(token)


def test_preferred_memory_is_accepted() -> None:
    memory = pb.PreferredMemory(pb.TRITONSERVER_MEMORY_GPU, 0)
    assert pb_request(preferred_memory=memory).requested_output_names() == ["OUTPUT"]
    assert memory.preferred_memory_type == pb.TRITONSERVER_MEMORY_GPU


def test_model_name_inputs_and_outputs_are_required() -> None:
    with pytest.raises(TypeError):
        pb.InferenceRequest(inputs=[], requested_output_names=["OUTPUT0"])
    with pytest.raises(TypeError):
        pb.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"])
    with pytest.raises(TypeError):
        pb.InferenceRequest(model_name="add_sub", inputs=[])


def test_no_calls_while_initializing_or_finalizing() -> None:
    token = bls.CURRENT.set(bls.NOT_EXECUTING)
    try:
        with pytest.raises(pb.TritonModelException, match=r"BLS is only supported during the 'execute' function\."):
            pb_request().exec()
    finally:
        bls.CURRENT.reset(token)


def test_a_circle_of_waits_is_refused(loop) -> None:
    """A's one instance waits on B; B's execute calling A could never be answered."""
    calls, server = calls_on(loop, {"a": [], "b": []})
    server.model("a")
    server.model("b")
    a_waits = threading.Thread(target=lambda: calls.stream(request("b"), bls.Caller("a", 1), 2.0))
    a_waits.start()
    a_waits.join()
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0.01), loop).result(5)
    assert [r.model for r in server.requests] == ["b"]
    with pytest.raises(InferenceError) as e:
        calls.caller("b", 1).infer("a", {})
    assert e.value.code == Code.UNAVAILABLE
    assert "model 'b' called model 'a': refused, since every instance of 'a', 'b' would wait" in e.value.message
    # with a second instance of A free, the same call can go (and waits, here, until its timeout)
    server.models["a"].instance_names = ["0", "1"]
    with pytest.raises(InferenceError, match="Request timeout expired"):
        calls.caller("b", 1).infer("a", {}, timeout_s=0.05)


def test_one_response_calls_to_a_decoupled_model_are_refused(loop) -> None:
    calls, server = calls_on(loop, {"dec": [(result(1.0), False), (None, True)]})
    with pytest.raises(InferenceError, match=r"model 'dec' is decoupled .*: call it with ctx\.stream"):
        calls.caller("m", 1).infer("dec", {})
    token = bls.CURRENT.set(calls.caller("m", 1))
    try:
        refused = pb_request("dec").exec()
        assert refused.error().message().startswith("Model dec is using the decoupled. The current BLS request call")
        assert len(list(pb_request("dec").exec(decoupled=True))) == 2
    finally:
        bls.CURRENT.reset(token)
    assert len(server.requests) == 1  # the refused ones never reached it
