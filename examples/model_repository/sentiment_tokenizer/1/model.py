"""Tokenise raw texts into bag-of-words counts (step 1 of sentiment_pipeline).

Same tokeniser as the `sentiment` model: lower-cased English words, Chinese runs split by forward
maximum matching against the vocabulary (1/vocab.json); unknown tokens are dropped.
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


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "vocab.json")
        with open(path, encoding="utf-8") as handle:
            words = json.load(handle)["vocabulary"]
        self.index = {word: i for i, word in enumerate(words)}
        self.longest = max(len(word) for word in words)

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # [n, 1] of bytes
            texts = [item.decode("utf-8") for item in raw.reshape(-1)]
            counts = np.zeros((len(texts), len(self.index)), dtype=np.float32)
            for row, text in enumerate(texts):
                for token in tokenize(text, self.index, self.longest):
                    counts[row, self.index[token]] += 1.0
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("counts", counts)]))
        return responses
