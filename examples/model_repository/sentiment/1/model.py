"""Sentiment of raw texts, tokenised and post-processed server-side.

initialize() loads the bag-of-words weights shipped next to this file (weights.json: labels, bias
and one [negative, positive, neutral] weight row per vocabulary word). execute() decodes each text
(UTF-8), tokenises it (lower-cased English words; Chinese runs split by forward maximum matching
against the vocabulary), sums the weight rows of the known tokens plus the bias, applies softmax and
maps the argmax to its label.
"""

import json
import os
import re

import numpy as np
import triton_python_backend_utils as pb_utils

_RUNS = re.compile(r"[a-z]+|[\u4e00-\u9fff]+")


def tokenize(text, vocabulary, longest):
    tokens = []
    for run in _RUNS.findall(text.lower()):
        if run.isascii():
            if run in vocabulary:
                tokens.append(run)
            continue
        start = 0
        while start < len(run):
            for size in range(min(longest, len(run) - start), 0, -1):
                if run[start : start + size] in vocabulary:
                    tokens.append(run[start : start + size])
                    start += size
                    break
            else:
                start += 1  # unknown character
    return tokens


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "weights.json")
        with open(path, encoding="utf-8") as handle:
            weights = json.load(handle)
        self.labels = weights["labels"]
        self.bias = np.array(weights["bias"], dtype=np.float64)
        self.rows = {word: np.array(row, dtype=np.float64) for word, row in weights["vocabulary"].items()}
        self.longest = max(len(word) for word in self.rows)

    def classify(self, text):
        logits = self.bias.copy()
        for token in tokenize(text, self.rows, self.longest):
            logits += self.rows[token]
        return softmax(logits)

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # [n, 1] of bytes
            texts = [item.decode("utf-8") for item in raw.reshape(-1)]
            probabilities = np.array([self.classify(t) for t in texts], dtype=np.float32).reshape(-1, 3)
            labels = [self.labels[int(i)].encode("utf-8") for i in probabilities.argmax(axis=1)]
            label = np.array(labels, dtype=object).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("label", label), pb_utils.Tensor("probabilities", probabilities)]
                )
            )
        return responses
