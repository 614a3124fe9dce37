"""Strings arrive as bytes: decode UTF-8, return each text upper-cased and its length in characters."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # [n] of bytes
            texts = [item.decode("utf-8") for item in raw.reshape(-1)]
            upper = np.array([t.upper().encode("utf-8") for t in texts], dtype=object)
            length = np.array([len(t) for t in texts], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("upper", upper), pb_utils.Tensor("length", length)]
                )
            )
        return responses
