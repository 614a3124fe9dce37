"""A batch of texts, shape [n, 1]: each decoded from UTF-8, returned upper-cased with its length."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # [n, 1] of bytes
            texts = [item.decode("utf-8") for item in raw.reshape(-1)]
            upper = np.array([t.upper().encode("utf-8") for t in texts], dtype=object).reshape(-1, 1)
            length = np.array([len(t) for t in texts], dtype=np.int32).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("upper", upper), pb_utils.Tensor("length", length)]
                )
            )
        return responses
