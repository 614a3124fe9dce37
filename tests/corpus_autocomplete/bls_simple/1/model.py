"""Forwards INPUT0 and INPUT1 to the model named in MODEL_NAME (a BLS request) and answers with its
OUTPUT0 and OUTPUT1; no config.pbtxt: auto_complete_config declares what a config does not."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        wanted_inputs = [
            {"name": "MODEL_NAME", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [1, 16]},
            {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [1, 16]},
        ]
        wanted_outputs = [
            {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [1, 16]},
            {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [1, 16]},
        ]
        written = config.as_dict()
        have_inputs = [tensor["name"] for tensor in written["input"]]
        have_outputs = [tensor["name"] for tensor in written["output"]]
        for tensor in wanted_inputs:
            if tensor["name"] not in have_inputs:
                config.add_input(tensor)
        for tensor in wanted_outputs:
            if tensor["name"] not in have_outputs:
                config.add_output(tensor)
        config.set_max_batch_size(0)
        return config

    def execute(self, requests):
        answers = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            target = target.decode() if isinstance(target, bytes) else str(target)
            forwarded = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
            )
            answer = forwarded.exec()
            if answer.has_error():
                answers.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message())))
            else:
                answers.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return answers
