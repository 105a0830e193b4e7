"""Test-only decoupled Python-backend model: streams INDEX = 0..COUNT-1, DELAY_S apart.

Each request is served on its own thread so that ``execute`` returns at once, as a real streaming
model does; the last response carries the final flag.
"""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            delay_s = float(pb_utils.get_input_tensor_by_name(request, "DELAY_S").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self._stream, args=(sender, count, delay_s), daemon=True).start()
        return None

    def _stream(self, sender, count, delay_s):
        for index in range(count):
            if sender.is_cancelled():
                break
            time.sleep(delay_s)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("INDEX", np.array([index], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
