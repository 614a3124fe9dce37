"""The tensors of multi_file, kept apart from its model.py."""

NAME = "io_spec"
INPUTS = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]
OUTPUTS = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]
