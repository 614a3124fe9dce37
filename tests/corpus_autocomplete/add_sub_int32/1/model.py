"""INT32 [1, 16] sums and differences, the model bls_simple forwards to in the tests; no config.pbtxt."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for name in ("INPUT0", "INPUT1"):
            config.add_input({"name": name, "data_type": "TYPE_INT32", "dims": [1, 16]})
        for name in ("OUTPUT0", "OUTPUT1"):
            config.add_output({"name": name, "data_type": "TYPE_INT32", "dims": [1, 16]})
        config.set_max_batch_size(0)
        return config

    def execute(self, requests):
        answers = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b),
                                                       pb_utils.Tensor("OUTPUT1", a - b)]))
        return answers
