"""Sentiment of raw Chinese texts with snownlp's trained classifier, tokenised and post-processed here.

snownlp (PyPI, pure Python) ships a naive Bayes sentiment model trained on product reviews; it gives
p, the probability that a text is positive (我爱你 0.75, 天气不好 0.13, 景色很不错 0.99). Nothing is
downloaded: the trained model is a file inside the installed package. execute() decodes each text
(UTF-8), tokenises it (Tokenizer), computes p, turns it into three class probabilities and maps
their argmax to its label:

three classes from one probability: read p as the chance that one reader calls the text positive and
ask two independent readers. Both say positive: p²; both negative: (1 − p)²; they disagree: 2p(1 − p),
"neutral". The three add up to 1; the argmax is 正向 for p > 2/3, 负面 for p < 1/3 and 中性 in
between (a text with no known word gets the prior, p ≈ 0.53: 中性).
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
        self.model, stop_words = snownlp_sentiment_model()
        self.tokenize = Tokenizer(self.model, stop_words)

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()  # [n, 1] of bytes
            texts = [item.decode("utf-8") for item in raw.reshape(-1)]
            rows = [three_classes(positive_probability(self.model, self.tokenize(text))) for text in texts]
            probabilities = np.array(rows, dtype=np.float32).reshape(-1, 3)
            labels = [LABELS[int(i)].encode("utf-8") for i in probabilities.argmax(axis=1)]
            prob = np.array(labels, dtype=object).reshape(-1, 1)  # post-processed: the label per text
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("prob", prob), pb_utils.Tensor("probabilities", probabilities)]
                )
            )
        return responses
