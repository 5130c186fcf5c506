"""A decoupled sequence model with implicit state: each step adds IN to the running total (state
ACC) and sends two responses from execute, OUT=total and OUT=-total, the first carrying the new
state; the final flag comes alone."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            acc = pb_utils.get_input_tensor_by_name(request, "ACC").as_numpy()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            total = acc + x
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total), pb_utils.Tensor("ACC_OUT", total)]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", -total)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
