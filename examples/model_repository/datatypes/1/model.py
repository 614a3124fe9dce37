"""Echo every input tensor the request sent back as "<name>_out", whatever its data type.

Tensors are passed through DLPack rather than numpy: that works for every type the python backend
takes, BF16 included (numpy has no bfloat16). BYTES (TYPE_STRING) tensors have no DLPack form and
go through numpy as object arrays of bytes.
"""

import triton_python_backend_utils as pb_utils

NAMES = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
         "fp16", "fp32", "fp64", "string", "bf16"]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is None:  # optional: not sent
                    continue
                if name == "string":
                    outputs.append(pb_utils.Tensor(f"{name}_out", tensor.as_numpy()))
                else:
                    outputs.append(pb_utils.Tensor.from_dlpack(f"{name}_out", tensor.to_dlpack()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
