"""Streams the running total of a sequence's numbers, one response per number.

Written against Triton's Python API (``TritonPythonModel``, response senders), so it would run
on Triton too, except for the implicit state: the server passes the total in as ``TOTAL_IN``,
and the ``TOTAL_OUT`` tensor of a response sent before ``execute`` returns becomes the next
step's total (it is not a configured output, so clients never see it).
"""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        for request in requests:
            total = int(pb_utils.get_input_tensor_by_name(request, "TOTAL_IN").as_numpy()[0])
            chunk = pb_utils.get_input_tensor_by_name(request, "CHUNK").as_numpy()
            sender = request.get_response_sender()
            if chunk.size == 0:  # nothing to add: end the request, keep the total
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for k, x in enumerate(chunk.tolist()):
                total += x
                tensors = [pb_utils.Tensor("PARTIAL", np.array([total], np.int32))]
                last = k == chunk.size - 1
                if last:
                    tensors.append(pb_utils.Tensor("TOTAL_OUT", np.array([total], np.int32)))
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
                sender.send(pb_utils.InferenceResponse(tensors), flags=flags)
        return None
