"""A model spread over files: its tensors come from io_spec.py (a sibling module), its computation from
helpers.py (a relative import); no config.pbtxt."""

import io_spec
import triton_python_backend_utils as pb_utils

from . import helpers


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for tensor in io_spec.INPUTS:
            config.add_input(tensor)
        for tensor in io_spec.OUTPUTS:
            config.add_output(tensor)
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        if io_spec.NAME != "io_spec" or helpers.NAME != "helpers":
            raise pb_utils.TritonModelException("the model's own modules were not imported")

    def execute(self, requests):
        answers = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", helpers.doubled(values))]))
        return answers
