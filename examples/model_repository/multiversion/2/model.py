"""Version 2: y = x * 10; `version` says which version answered."""

import numpy as np
import triton_python_backend_utils as pb_utils

VERSION = 2


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()  # [1]
            y = (x * 10.0).astype(np.float32)
            version = np.array([VERSION], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("y", y), pb_utils.Tensor("version", version)])
            )
        return responses
