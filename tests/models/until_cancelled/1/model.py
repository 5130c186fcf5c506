"""Streams OUT=0,1,2,... (IDX=k) every 5 ms until the client goes, then logs and ends the request."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []
        self.cancelled_seen = []

    def execute(self, requests):
        for request in requests:
            t = threading.Thread(target=self.stream, args=(request, request.get_response_sender()))
            t.start()
            self.threads.append(t)
        return None

    def stream(self, request, sender):
        k = 0
        while not sender.is_cancelled() and k < 2000:
            sender.send(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([k], np.int32)), pb_utils.Tensor("IDX", np.array([k], np.uint32))]
                )
            )
            k += 1
            time.sleep(0.005)
        self.cancelled_seen.append(request.is_cancelled())
        pb_utils.Logger.log_info(f"until_cancelled: stopped after {k} responses, cancelled={sender.is_cancelled()}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for t in self.threads:
            t.join()
