"""A linear classifier over bag-of-words counts (step 2 of sentiment_pipeline).

1/weights.json holds the labels, the bias and one [negative, positive, neutral] row per vocabulary
word, in the order of sentiment_tokenizer's vocab.json.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "weights.json")
        with open(path, encoding="utf-8") as handle:
            weights = json.load(handle)
        self.labels = weights["labels"]
        self.bias = np.array(weights["bias"], dtype=np.float64)  # [3]
        self.weights = np.array(weights["weights"], dtype=np.float64)  # [vocabulary, 3]

    def execute(self, requests):
        responses = []
        for request in requests:
            counts = pb_utils.get_input_tensor_by_name(request, "counts").as_numpy()  # [n, vocabulary]
            logits = counts.astype(np.float64) @ self.weights + self.bias
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            probabilities = (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)
            labels = [self.labels[int(i)].encode("utf-8") for i in probabilities.argmax(axis=1)]
            label = np.array(labels, dtype=object).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("label", label), pb_utils.Tensor("probabilities", probabilities)]
                )
            )
        return responses
