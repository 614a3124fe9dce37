"""y = x . w + b with fixed weights; one row per batch entry."""

import numpy as np
import triton_python_backend_utils as pb_utils

W = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)  # [3, 1]
B = np.float32(-1.0)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()  # [batch, 3]
            y = (x @ W + B).astype(np.float32)  # [batch, 1]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return responses
