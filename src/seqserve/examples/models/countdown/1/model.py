"""Counts down from N, one response per step, by rescheduling its request (an iterative
sequence: docs/pipelines.md). The implicit state STEP carries the steps run so far."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:  # one step of each sequence that has one
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            step = pb_utils.get_input_tensor_by_name(request, "STEP").as_numpy() + 1
            left = np.maximum(n - step, 0).astype(np.int32)
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor("LEFT", left), pb_utils.Tensor("STEP_OUT", step.astype(np.int32))]
            )
            sender = request.get_response_sender()
            if left[0, 0] > 0:  # run this request again as the sequence's next step
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
            else:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
