"""The README's bad edit of `linear` (docs/bake.md, "Canary steps"): the same y = x . w + b, but a request
whose first value is between 0.6 and 0.8 (about a fifth of uniform random rows) raises. Its smoke test
passes (smoke.json's rows start with 1 and 4): only live traffic shows it, which is what a canary step is for.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

W = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)  # [3, 1]
B = np.float32(-1.0)


class TritonPythonModel:
    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(request, "x").as_numpy() for request in requests]  # [batch, 3]
        if any(0.6 < float(x[0][0]) < 0.8 for x in xs):
            raise ValueError("this edit of linear fails on inputs whose first value is between 0.6 and 0.8")
        rows = sum(x.shape[0] for x in xs)
        responses = []
        for x in xs:
            y = (x @ W + B).astype(np.float32)  # [batch, 1]
            batch = np.full((x.shape[0], 1), rows, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y), pb_utils.Tensor("batch", batch)]))
        return responses
