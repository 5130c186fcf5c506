"""IN (int32 [n]) -> n responses OUT=[IN[k]], IDX=[k], sent by a thread after execute returns.
MODE: 0 = a bare final flag after the last response, 1 = the last response carries the final
flag. IN[k] < 0 sends an error response for k and goes on. IN[0] == 99 sends one response from
execute, then execute raises. IN[0] == 77 never answers."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        self.logger = pb_utils.Logger

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if len(values) and values[0] == 99:
                request.get_response_sender().send(self.response(5, 0))
                raise ValueError("boom")
            if len(values) and values[0] == 77:
                continue
            t = threading.Thread(target=self.stream, args=(request.get_response_sender(), values, mode))
            t.start()
            self.threads.append(t)
        return None

    @staticmethod
    def response(value, k):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([k], np.uint32)),
            ]
        )

    def stream(self, sender, values, mode):
        for k, v in enumerate(values):
            time.sleep(0.002)
            last = k == len(values) - 1
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if (last and mode == 1) else 0
            if v < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"negative value at {k}")), flags)
            else:
                sender.send(self.response(int(v), k), flags)
        if mode != 1 or not len(values):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(self.response(0, 0))
        except pb_utils.TritonModelException as e:
            self.logger.log_error(f"after final: {e}")

    def finalize(self):
        for t in self.threads:
            t.join()
