"""Triton-style Python models answering through response senders: decoupled models streaming
several responses per request (during or after execute, from other threads), and
non-decoupled models answering late. In-process API here; the wire framing (gRPC stream,
unary refusals) is in tests/integration/test_decoupled.py."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from seqserve.engine import Code, InferenceError, InferResult, Server
from seqserve.engine.errors import DecoupledModelError
from tests.support.checks import expect_error, wait_until
from tests.support.models import copy_model, write_model

# The decoupled models other test files use too are files in tests/models: repeat, decoupled_acc
# (served as "acc") and until_cancelled (served as "uc").

# Not decoupled: takes each request's sender in execute and answers through it from a
# thread, after execute returns. MODE 1 also tries a second response; MODE 2 first tries a
# bare final flag. Both misuses raise in the model (logged), and the proper response still
# goes out. MODE 3 never sends the final flag.
LATE = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            t = threading.Thread(target=self.answer, args=(request, request.get_response_sender()))
            t.start()
            self.threads.append(t)
        return None

    def answer(self, request, sender):
        x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if mode == 2:
            try:
                sender.send(flags=final)
            except pb_utils.TritonModelException as e:
                pb_utils.Logger.log_error(f"late: {e}")
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        if mode == 3:  # never sends the final flag: the response alone answers the request
            return
        if mode == 1:
            try:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 3)]))
            except pb_utils.TritonModelException as e:
                pb_utils.Logger.log_error(f"late: {e}")
        sender.send(flags=final)

    def finalize(self):
        for t in self.threads:
            t.join()
"""

LATE_CONFIG = """
name: "late"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def repeat_inputs(values: list[int], mode: int = 0) -> dict[str, np.ndarray]:
    return {"IN": np.array(values, np.int32), "MODE": np.array([mode], np.int32)}


async def collect(s: Server, model: str, inputs: dict[str, np.ndarray], **kw: object) -> list[tuple[object, bool]]:
    """Every (response, final) a streaming submit gets, up to the final one."""
    got: asyncio.Queue[tuple[object, bool]] = asyncio.Queue()
    s.submit_streaming(model, inputs, lambda r, final: got.put_nowait((r, final)), **kw)  # type: ignore[arg-type]
    out = []
    while True:
        item = await asyncio.wait_for(got.get(), 10)
        out.append(item)
        if item[1]:
            return out


def values(responses: list[tuple[object, bool]]) -> list[tuple[int, int] | str | None]:
    out: list[tuple[int, int] | str | None] = []
    for r, _ in responses:
        if isinstance(r, InferResult):
            out.append((int(r.outputs["OUT"][0]), int(r.outputs["IDX"][0])))
        elif isinstance(r, InferenceError):
            out.append(str(r))
        else:
            out.append(r)
    return out


@pytest.fixture
async def repeat(repo, serve) -> Server:
    copy_model(repo, "repeat")
    return await serve()


# ------------------------------------------------------------------------ decoupled


async def test_responses_stream_after_execute_returns(repeat: Server) -> None:
    responses = await collect(repeat, "repeat", repeat_inputs([4, 5, 6]), request_id="r1")
    assert values(responses) == [(4, 0), (5, 1), (6, 2), None]  # a bare final flag comes as None
    assert [final for _, final in responses] == [False, False, False, True]
    assert all(r.id == "r1" and r.model_version == "1" for r, _ in responses[:3])  # type: ignore[attr-defined]


async def test_final_flag_on_the_last_response(repeat: Server) -> None:
    responses = await collect(repeat, "repeat", repeat_inputs([4, 5], mode=1))
    assert values(responses) == [(4, 0), (5, 1)]
    assert [final for _, final in responses] == [False, True]


async def test_zero_responses(repeat: Server) -> None:
    assert values(await collect(repeat, "repeat", repeat_inputs([]))) == [None]


async def test_concurrent_requests_keep_their_own_order(repeat: Server) -> None:
    runs = await asyncio.gather(*(collect(repeat, "repeat", repeat_inputs(list(range(i, i + 20)))) for i in range(8)))
    for i, responses in enumerate(runs):
        assert values(responses) == [(i + k, k) for k in range(20)] + [None]


async def test_error_response_does_not_end_the_stream(repeat: Server) -> None:
    responses = await collect(repeat, "repeat", repeat_inputs([1, -1, 3]))
    assert values(responses) == [(1, 0), "negative value at 1", (3, 2), None]
    # Server.stream raises the error response
    got = []
    with pytest.raises(InferenceError, match="negative value at 1"):
        async for r in repeat.stream("repeat", repeat_inputs([1, -1, 3])):
            got.append(int(r.outputs["OUT"][0]))
    assert got == [1]


async def test_stream_yields_every_response(repeat: Server) -> None:
    got = [int(r.outputs["OUT"][0]) async for r in repeat.stream("repeat", repeat_inputs([7, 8, 9]))]
    assert got == [7, 8, 9]


async def test_send_after_final_raises_in_the_model(repeat: Server, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        await collect(repeat, "repeat", repeat_inputs([1]))
        await wait_until(lambda: "after final" in caplog.text, "the model has tried to send after the final flag")
    assert "after final: Unable to send response. Response sender has been closed." in caplog.text


async def test_execute_failure_after_a_response(repeat: Server) -> None:
    responses = await collect(repeat, "repeat", repeat_inputs([99, 1]))
    assert values(responses)[0] == (5, 0)
    err = responses[1][0]
    assert isinstance(err, InferenceError) and responses[1][1]
    assert str(err).startswith("Failed to process the request(s) for model 'repeat_0_0', message: ValueError: boom (")
    # the model keeps serving
    assert values(await collect(repeat, "repeat", repeat_inputs([3]))) == [(3, 0), None]


async def test_single_response_calls_are_refused(repeat: Server) -> None:
    e = await expect_error(repeat.infer("repeat", repeat_inputs([1])), Code.UNSUPPORTED)
    assert isinstance(e, DecoupledModelError)
    assert "uses the decoupled transaction policy" in str(e)


async def test_unload_fails_a_request_that_never_ends(repo, serve) -> None:
    copy_model(repo, "repeat")
    s = await serve(exit_timeout_s=0.2)
    got: asyncio.Queue[tuple[object, bool]] = asyncio.Queue()
    s.submit_streaming("repeat", repeat_inputs([77]), lambda r, f: got.put_nowait((r, f)))
    await wait_until(lambda: s.model("repeat").open_responses, "the model has executed the request")
    await s.unload_model("repeat")
    r, final = await asyncio.wait_for(got.get(), 5)
    assert final and isinstance(r, InferenceError) and r.code == Code.UNAVAILABLE
    assert str(r) == "model 'repeat' was unloaded before it sent the final response for this request"


async def test_shutdown_waits_for_streaming_requests(repo, serve) -> None:
    copy_model(repo, "repeat")
    s = await serve(exit_timeout_s=10)
    got: asyncio.Queue[tuple[object, bool]] = asyncio.Queue()
    s.submit_streaming("repeat", repeat_inputs(list(range(50))), lambda r, f: got.put_nowait((r, f)))
    await wait_until(lambda: got.qsize() > 0, "the stream has begun")
    await s.shutdown()
    items = [got.get_nowait() for _ in range(got.qsize())]
    assert len(items) == 51 and items[-1] == (None, True)


async def test_decoupled_sequence_with_implicit_state(repo, serve) -> None:
    copy_model(repo, "decoupled_acc", "acc")
    s = await serve()

    async def run(sid: int, xs: list[int]) -> list[list[int]]:
        steps = []
        for k, x in enumerate(xs):
            responses = await collect(
                s,
                "acc",
                {"IN": np.array([[x]], np.int32)},
                sequence_id=sid,
                sequence_start=k == 0,
                sequence_end=k == len(xs) - 1,
            )
            steps.append([int(r.outputs["OUT"][0, 0]) for r, _ in responses if r is not None])  # type: ignore[attr-defined]
        return steps

    a, b = await asyncio.gather(run(1, [1, 2, 3]), run(2, [10, 20, 30]))
    assert a == [[1, -1], [3, -3], [6, -6]]
    assert b == [[10, -10], [30, -30], [60, -60]]
    # the final response is sent from inside execute, so it can overtake the batch's statistics
    await wait_until(lambda: s.statistics("acc")[0].inference_stats.success.count == 6, "six requests counted")
    assert s.statistics("acc")[0].inference_stats.fail.count == 0


# ------------------------------------------------------------- non-decoupled, late


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
async def test_non_decoupled_answers_after_execute(repo, serve, caplog, mode) -> None:
    write_model(repo, "late", LATE_CONFIG, LATE)
    s = await serve()
    with caplog.at_level(logging.ERROR):
        results = await asyncio.gather(
            *(s.infer("late", {"IN": np.array([i], np.int32), "MODE": np.array([mode], np.int32)}) for i in range(5))
        )
    assert [int(r.outputs["OUT"][0]) for r in results] == [0, 2, 4, 6, 8]
    expected = {
        0: None,
        1: "late: Unable to send response. Non-decoupled model cannot send more than one response.",
        2: "late: Unable to send response. Non-decoupled model cannot send complete final before sending a response.",
        3: None,
    }[mode]
    if expected is not None:
        assert expected in caplog.text
    # a streaming submit to a non-decoupled model gets its single response as final
    responses = await collect(s, "late", {"IN": np.array([4], np.int32), "MODE": np.array([0], np.int32)})
    assert len(responses) == 1 and responses[0][1]
    assert int(responses[0][0].outputs["OUT"][0]) == 8  # type: ignore[attr-defined]
    # answered requests are not waited for at shutdown
    await wait_until(lambda: s.model("late").open_responses == 0, "no response is open")


# Not decoupled, answering twice: MODE 0 sends OUT=1 with the final flag and also returns
# OUT=2; MODE 1 returns OUT=2 and sends OUT=1 through the sender afterwards (from a thread).
TWICE = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        out = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                sender.send(self.response(1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                t = threading.Thread(target=self.late, args=(sender,))
                self.threads.append(t)
            out.append(self.response(2))
        return out

    def late(self, sender):
        try:
            sender.send(self.response(1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except pb_utils.TritonModelException as e:
            pb_utils.Logger.log_error(f"twice: {e}")

    @staticmethod
    def response(v):
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([v], np.int32))])

    def finalize(self):
        for t in self.threads:
            t.join()
"""


@pytest.mark.parametrize(("mode", "expected"), [(0, 1), (1, 2)])
async def test_a_request_is_answered_once(repo, serve, caplog, mode, expected) -> None:
    write_model(repo, "twice", LATE_CONFIG.replace('"late"', '"twice"'), TWICE)
    s = await serve()
    inputs = {"IN": np.array([0], np.int32), "MODE": np.array([mode], np.int32)}
    responses: list[tuple[object, bool]] = []
    s.submit_streaming("twice", inputs, lambda r, final: responses.append((r, final)))
    await wait_until(lambda: responses, "the request is answered")
    await wait_until(lambda: s.statistics("twice")[0].execution_count == 1, "execute has returned")
    await asyncio.sleep(0.1)  # a second answer would have arrived by now
    assert len(responses) == 1 and responses[0][1]
    assert int(responses[0][0].outputs["OUT"][0]) == expected  # type: ignore[attr-defined]
    if mode == 1:
        model = s.model("twice")._instances[0]._obj  # type: ignore[attr-defined]
        with caplog.at_level(logging.ERROR):
            for t in model.threads:
                t.start()
                t.join()
        assert "twice: Unable to send response. Response sender has been closed." in caplog.text
    assert len(responses) == 1
    assert s.model("twice").open_responses == 0


# ------------------------------------------------------------ batch-level decoupled

# seqserve's batch-level API, decoupled: every row's request gets IN+k for k in 0..2, the
# first from execute, the others from a thread after it returns; the state (ACC) is returned.
BATCH_LEVEL = """
import threading
import numpy as np

class Model:
    def initialize(self, ctx):
        self.threads = []

    def execute(self, batch):
        total = batch.states["ACC"] + batch.inputs["IN"]
        for i in range(len(batch.request_rows)):
            if not batch.ready[i]:
                continue
            r = batch.responder(i)
            r.send({"OUT": total[i : i + 1].copy()})
            t = threading.Thread(target=self.rest, args=(r, total[i : i + 1].copy()))
            t.start()
            self.threads.append(t)
        return {"ACC_OUT": total}

    def rest(self, responder, value):
        responder.send({"OUT": value + 1})
        responder.send({"OUT": value + 2}, final=True)

    def finalize(self):
        for t in self.threads:
            t.join()
"""


async def test_batch_level_decoupled_model(repo, serve) -> None:
    copy_model(repo, "decoupled_acc", "acc", model_py=BATCH_LEVEL)
    s = await serve()

    async def run(sid: int, xs: list[int]) -> list[list[int]]:
        steps = []
        for k, x in enumerate(xs):
            got = [
                int(r.outputs["OUT"][0, 0])
                async for r in s.stream(
                    "acc",
                    {"IN": np.array([[x]], np.int32)},
                    sequence_id=sid,
                    sequence_start=k == 0,
                    sequence_end=k == len(xs) - 1,
                )
            ]
            steps.append(got)
        return steps

    a, b = await asyncio.gather(run(1, [1, 2]), run(2, [10, 20]))
    assert a == [[1, 2, 3], [3, 4, 5]]
    assert b == [[10, 11, 12], [30, 31, 32]]
    await expect_error(s.infer("acc", {"IN": np.array([[1]], np.int32)}, sequence_id=3), Code.UNSUPPORTED)


# ------------------------------------------------- Triton's stub behaviours, one by one

ASYNC_LATE = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils
from decoupled_helper_mod import OFFSET  # a module next to model.py, as Triton allows

class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            # answered by a task that outlives execute, on the instance's own event loop
            asyncio.get_running_loop().create_task(self.answer(request.get_response_sender()))
        return None

    async def answer(self, sender):
        await asyncio.sleep(0.2)
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([OFFSET], np.int32))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


async def test_async_execute_tasks_outlive_execute(repo, serve) -> None:
    d = copy_model(repo, "repeat", "alate", model_py=ASYNC_LATE)
    (d / "1" / "decoupled_helper_mod.py").write_text("OFFSET = 41\n")
    s = await serve()
    # one request alone: nothing else drives the model, yet its answer comes
    responses = await asyncio.wait_for(collect(s, "alate", repeat_inputs([1])), 5)
    assert [int(r.outputs["OUT"][0]) for r, _ in responses] == [41]  # type: ignore[attr-defined]


SEND_THEN_RAISE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1000], np.int32))]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1001], np.int32))]))
        return None
"""


async def test_non_decoupled_response_stands_when_execute_raises(repo, serve) -> None:
    """The second send raises out of execute; the first response was already the answer."""
    write_model(repo, "sr", LATE_CONFIG.replace('"late"', '"sr"'), SEND_THEN_RAISE)
    s = await serve()
    r = await s.infer("sr", {"IN": np.array([0], np.int32), "MODE": np.array([0], np.int32)})
    assert r.outputs["OUT"].tolist() == [1000]
    # the answer can overtake the executor's clean-up of the batch, which fails
    await wait_until(lambda: s.statistics("sr")[0].inference_stats.fail.count == 1, "the batch has failed")
    assert s.model("sr").open_responses == 0


RETURNS_LIST = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


async def test_decoupled_execute_must_return_none(repo, serve) -> None:
    copy_model(repo, "repeat", "rl", model_py=RETURNS_LIST)
    s = await serve()
    responses = await collect(s, "rl", repeat_inputs([1]))
    ((err, final),) = responses
    assert final and isinstance(err, InferenceError)
    assert str(err).startswith(
        "Python model 'rl_0_0' is using the decoupled mode and the execute function must return None. (request id "
    )


async def test_leaving_a_stream_cancels_the_request(repo, serve) -> None:
    copy_model(repo, "until_cancelled", "uc")
    s = await serve()
    got = []
    async for r in s.stream("uc", repeat_inputs([0])):
        got.append(int(r.outputs["OUT"][0]))
        if len(got) == 3:
            break
    assert got == [0, 1, 2]
    # the model notices, stops and ends the request
    await wait_until(lambda: s.model("uc").open_responses == 0, "the request has ended")
    model = s.model("uc")._instances[0]._obj  # type: ignore[attr-defined]
    assert model.cancelled_seen == [True]


# Not decoupled: execute polls request.is_cancelled() for up to 5 s.
POLLS_CANCEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.executing = False
        self.seen = []

    def execute(self, requests):
        self.executing = True
        out = []
        for request in requests:
            for _ in range(500):
                if request.is_cancelled():
                    break
                time.sleep(0.01)
            self.seen.append(request.is_cancelled())
            err = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            out.append(pb_utils.InferenceResponse(error=err))
        return out
"""


async def test_unary_caller_that_leaves_cancels_the_request(repo, serve) -> None:
    write_model(repo, "pc", LATE_CONFIG.replace('"late"', '"pc"'), POLLS_CANCEL)
    s = await serve()
    task = asyncio.create_task(s.infer("pc", {"IN": np.array([0], np.int32), "MODE": np.array([0], np.int32)}))
    model = s.model("pc")._instances[0]._obj  # type: ignore[attr-defined]
    await wait_until(lambda: model.executing, "the model is executing the request")
    task.cancel()
    await wait_until(lambda: model.seen, "the model has finished the request")
    assert model.seen == [True]


# Reuses one buffer for every response, and checks the sender's argument rules.
REUSES_BUFFER = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.errors = []

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            buf = np.zeros(1, np.int32)
            idx = np.zeros(1, np.uint32)
            for k in range(3):
                buf[0] = 10 * k
                idx[0] = k
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", buf), pb_utils.Tensor("IDX", idx)]))
            for args in ((None, 0), (None, 7)):
                try:
                    sender.send(*args)
                except pb_utils.TritonModelException as e:
                    self.errors.append(str(e))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


async def test_each_response_is_a_copy(repo, serve) -> None:
    copy_model(repo, "repeat", "rb", model_py=REUSES_BUFFER)
    s = await serve()
    responses = await collect(s, "rb", repeat_inputs([0]))
    assert values(responses) == [(0, 0), (10, 1), (20, 2), None]
    assert s.model("rb")._instances[0]._obj.errors == [  # type: ignore[attr-defined]
        "Inference Response object must be provided when the response flags is set to zero.",
        "Unable to send response. Unsupported flag provided.",
    ]
