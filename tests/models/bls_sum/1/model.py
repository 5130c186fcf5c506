"""A BLS model: each step of its own sequences calls the model named by the parameter `callee`
(the demo `accumulator` by default) with this sequence's correlation id and START/END flags,
and answers with the callee's OUTPUT, so OUTPUT is the running sum of INPUT.

Parameter `mode`: `sync` (exec, one call after the other), `async` (async execute, the batch's
calls at once with async_exec), `bad_input` (sends INPUT as INT32, which the callee refuses),
`stream` / `async_stream` (a decoupled callee such as `repeat`: IN = 1..INPUT, MODE 0;
OUTPUT = the sum of every OUT; exec(decoupled=True) / async_exec(decoupled=True)).
Parameter `timeout_us`: the calls' timeout (0: none). A failed call fails that request only,
with the callee's error."""

import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.callee = params["callee"]["string_value"]
        self.mode = params["mode"]["string_value"]
        self.timeout_us = int(params["timeout_us"]["string_value"])

    def call(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
        if self.mode in ("stream", "async_stream"):
            n = int(x.reshape(-1)[0])
            inputs = [
                pb_utils.Tensor("IN", np.arange(1, n + 1, dtype=np.int32)),
                pb_utils.Tensor("MODE", np.array([0], np.int32)),
            ]
            return pb_utils.InferenceRequest(
                model_name=self.callee, requested_output_names=["OUT"], inputs=inputs, timeout=self.timeout_us
            )
        if self.mode == "bad_input":
            x = x.astype(np.int32)
        return pb_utils.InferenceRequest(
            model_name=self.callee,
            requested_output_names=["OUTPUT"],
            inputs=[pb_utils.Tensor("INPUT", x)],
            correlation_id=request.correlation_id(),
            flags=request.flags(),
            timeout=self.timeout_us,
        )

    def execute(self, requests):
        if self.mode.startswith("async"):
            return self.execute_async(requests)
        if self.mode == "stream":
            return [self.summed(self.call(r).exec(decoupled=True)) for r in requests]
        return [self.answer(self.call(r).exec()) for r in requests]

    async def execute_async(self, requests):
        decoupled = self.mode == "async_stream"
        answers = await asyncio.gather(*(self.call(r).async_exec(decoupled=decoupled) for r in requests))
        if decoupled:
            return [self.summed(a) for a in answers]
        return [self.answer(a) for a in answers]

    @staticmethod
    def answer(response):
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out.reshape(1, 1))])

    @staticmethod
    def summed(responses):
        total = 0
        for response in responses:
            if response.has_error():
                return pb_utils.InferenceResponse(error=response.error())
            if response.output_tensors():  # the last may be empty: a bare final flag
                total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[total]], np.float32))])
