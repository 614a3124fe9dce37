"""Classify tokenised texts (step 2 of sentiment_pipeline) with snownlp's trained sentiment model.

The same classifier and three-class derivation as the `sentiment` model (see its model.py).
"""

import gzip
import importlib.util
import marshal
import math
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = ["负面", "正向", "中性"]  # the article's argmax mapping {0: negative, 1: positive, 2: neutral}


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


def positive_probability(model, words):
    """P(positive | words) under snownlp's naive Bayes model, computed as its Bayes.classify does
    (log prior + log add-one frequencies per class, normalised)."""
    score = {}
    for name, cls in model["d"].items():
        score[name] = math.log(cls["total"]) - math.log(model["total"])
        for word in words:
            score[name] += math.log(cls["d"].get(word, cls["none"]) / cls["total"])
    return 1.0 / (1.0 + math.exp(min(700.0, score["neg"] - score["pos"])))


def three_classes(p):
    """[负面, 正向, 中性] from P(positive): two independent readers agree negative, agree positive,
    or disagree (see the example repository's README)."""
    return [(1.0 - p) ** 2, p * p, 2.0 * p * (1.0 - p)]


class TritonPythonModel:
    def initialize(self, args):
        self.model, _ = snownlp_sentiment_model()

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "tokens").as_numpy()  # [n, w] of bytes
            rows = []
            for row in tokens.reshape(tokens.shape[0], -1):
                words = [item.decode("utf-8") for item in row if item]  # b"" is padding
                rows.append(three_classes(positive_probability(self.model, words)))
            probabilities = np.array(rows, dtype=np.float32).reshape(-1, 3)
            labels = [LABELS[int(i)].encode("utf-8") for i in probabilities.argmax(axis=1)]
            prob = np.array(labels, dtype=object).reshape(-1, 1)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("prob", prob), pb_utils.Tensor("probabilities", probabilities)]
                )
            )
        return responses
