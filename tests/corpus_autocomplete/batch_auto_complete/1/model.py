"""Sums and differences of FP32 [4] rows, in batches of up to 4; no config.pbtxt: auto_complete_config declares the
tensors a config does not (as python_backend's examples/auto_complete does)."""

import json

import triton_python_backend_utils as pb_utils

TENSORS = {
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
              {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
}


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        written = config.as_dict()
        for kind, add in (("input", config.add_input), ("output", config.add_output)):
            declared = {tensor["name"] for tensor in written[kind]}
            for tensor in TENSORS[kind]:
                if tensor["name"] not in declared:
                    add(tensor)
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def initialize(self, args):
        completed = json.loads(args["model_config"])
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
