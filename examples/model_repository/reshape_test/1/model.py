"""Shows what the model sees through `reshape`: the request [2., 3., 4.] arrives as [[2., 3., 4.]].

y sums along axis 1, which exists only because of the input reshape, giving [9.] (shape [1], the
output's reshape); the client receives [[9.]] (the output's dims [1, 1]). received_shape reports
the shape the model received.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()  # [1, 3]
            y = x.sum(axis=1).astype(np.float32)  # [1]
            shape = np.array(x.shape, dtype=np.int64)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("y", y), pb_utils.Tensor("received_shape", shape)]
                )
            )
        return responses
