"""Tokenise raw texts (step 1 of sentiment_pipeline), as the `sentiment` model does.

Rows of words are padded with b"" to the longest one in the request.
"""

import gzip
import importlib.util
import marshal
import math
import re
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

HAN_RUNS = re.compile("([\u4e00-\u9fa5]+)")
MAX_WORD = 4  # characters
STOP_COUNT = 5000


def snownlp_sentiment_model():
    """snownlp's trained naive Bayes sentiment model and stop words, read from the installed package.

    Read as files (importing `snownlp` would also load its 13 MB segmentation model: 5-18 s per
    python stub on a busy 2-core machine, for a tokeniser this model replaces; see the README).
    """
    spec = importlib.util.find_spec("snownlp")  # found, not imported
    if spec is None or spec.origin is None:
        raise RuntimeError("the snownlp package is not installed in the python that runs this model "
                           "(pip install 'tritonctl[embedded]' or 'snownlp>=0.12.3,<0.13')")
    root = Path(spec.origin).parent
    with gzip.open(root / "sentiment" / "sentiment.marshal.3", "rb") as handle:
        model = marshal.loads(handle.read())  # {"total": N, "d": {"neg"|"pos": {"d": counts, "total", "none"}}}
    with open(root / "normal" / "stopwords.txt", encoding="utf-8") as handle:
        stop_words = {line.strip() for line in handle if line.strip()}
    return model, stop_words


class Tokenizer:
    """Maximum-probability segmentation over the words snownlp's classifier was trained on.

    Word probabilities are their counts in the training data (stop words, which training dropped,
    count STOP_COUNT); each run of Chinese characters is split into the most probable sequence of
    known words (unknown single characters allowed), other text on whitespace; stop words are then
    dropped, as snownlp's own preprocessing does.
    """

    def __init__(self, model, stop_words):
        self.stop_words = stop_words
        self.counts = {}
        for cls in model["d"].values():
            for word, count in cls["d"].items():
                self.counts[word] = self.counts.get(word, 0) + count
        for word in stop_words:
            self.counts[word] = max(self.counts.get(word, 0), STOP_COUNT)
        self.log_total = math.log(model["total"])

    def split_run(self, run):
        best = [0.0] + [-math.inf] * len(run)
        start_of = [0] * (len(run) + 1)
        for end in range(1, len(run) + 1):
            for start in range(max(0, end - MAX_WORD), end):
                count = self.counts.get(run[start:end])
                if count is None and end - start > 1:
                    continue
                score = best[start] + math.log((count or 0) + 0.5) - self.log_total
                if score > best[end]:
                    best[end], start_of[end] = score, start
        words, end = [], len(run)
        while end > 0:
            words.append(run[start_of[end]:end])
            end = start_of[end]
        return words[::-1]

    def __call__(self, text):
        words = []
        for part in HAN_RUNS.split(text):
            part = part.strip()
            if part:
                words += self.split_run(part) if HAN_RUNS.fullmatch(part) else part.split()
        return [word for word in words if word not in self.stop_words]


class TritonPythonModel:
    def initialize(self, args):
        self.tokenize = Tokenizer(*snownlp_sentiment_model())

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # [n, 1] of bytes
            words = [self.tokenize(item.decode("utf-8")) for item in raw.reshape(-1)]
            width = max([len(w) for w in words] + [1])
            tokens = np.full((len(words), width), b"", dtype=object)
            for row, items in enumerate(words):
                for column, word in enumerate(items):
                    tokens[row, column] = word.encode("utf-8")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("tokens", tokens)]))
        return responses
