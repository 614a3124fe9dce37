"""y = x . w + b with fixed weights; one row per batch entry.

With dynamic batching, one execute() receives every request the batcher gathered; each response's
"batch" output says how many rows (over all those requests) that execute() computed.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

W = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)  # [3, 1]
B = np.float32(-1.0)


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]  # [batch, 3]
        rows = sum(x.shape[0] for x in xs)
        responses = []
        for x in xs:
            y = (x @ W + B).astype(np.float32)  # [batch, 1]
            batch = np.full((x.shape[0], 1), rows, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y), pb_utils.Tensor("batch", batch)]))
        return responses
