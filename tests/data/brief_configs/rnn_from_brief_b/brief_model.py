"""The users' brief B model as a Triton-style Python model: a running sum over every element
of the `sequence` input, per session (`total` = the sum of everything the session sent so far).

Brief B's config declares no implicit state, so the model keeps each sequence's sum itself,
keyed by correlation id: set at START (sent by the client, or implied by the server for a new
session), dropped at END. A step of a sequence it has no sum for fails loudly instead of
starting over from 0, so a server that lost a session's state cannot hide it.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
END = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            flags = request.flags()
            x = pb_utils.get_input_tensor_by_name(request, "sequence").as_numpy()
            if not flags & START and cid not in self.sums:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"no running sum for sequence {cid!r}"))
                )
                continue
            total = (0 if flags & START else self.sums[cid]) + int(x.sum())
            if flags & END:
                self.sums.pop(cid, None)
            else:
                self.sums[cid] = total
            out = pb_utils.Tensor("total", np.array([[total]], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
