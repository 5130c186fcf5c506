"""BLS: each step of a sequence calls the demo `accumulator` with this sequence's correlation id
and its START/END flags, so `accumulator` keeps the running sum in the same sequence, and
answers with accumulator's OUTPUT. A failed call fails that request alone, with the callee's
error. The calls of a batch go out together (async execute and async_exec)."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        calls = [
            pb_utils.InferenceRequest(
                model_name="accumulator",
                requested_output_names=["OUTPUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT")],
                correlation_id=request.correlation_id(),
                flags=request.flags(),
            ).async_exec()
            for request in requests
        ]
        return [self.answer(response) for response in await asyncio.gather(*calls)]

    @staticmethod
    def answer(response):
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        return pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(response, "OUTPUT")])
