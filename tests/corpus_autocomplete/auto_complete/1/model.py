"""Sums and differences of two FP32 vectors; no config.pbtxt: auto_complete_config declares the tensors."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        first = {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}
        second = {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}
        config.set_max_batch_size(0)
        config.add_input(first)
        config.add_input(second)
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def initialize(self, args):
        completed = json.loads(args["model_config"])
        # only a completed config has the outputs: without completion this fails as Triton's QA model does
        self.types = [pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(completed, name)["data_type"])
                      for name in ("OUTPUT0", "OUTPUT1")]

    def execute(self, requests):
        answers = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            answers.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(self.types[0])),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(self.types[1]))]))
        return answers
