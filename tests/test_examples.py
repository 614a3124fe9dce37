"""The example repository's models, served by a real tritonserver, answer the seed article's requests.

Each test copies its model(s) into the session server's repository, loads it (with a deadline),
sends the article's request over gRPC, checks the answer and unloads (the server is shared).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from controlplane.triton.launcher import TritonServer
from tests.conftest import EXAMPLES, install_model

LOAD_TIMEOUT_S = 60.0
INFER_TIMEOUT_S = 10.0
LABELS = ["负面", "正向", "中性"]
SEED_TEXTS = ["这部电影太好了，我很喜欢", "质量很差，非常失望", "还行吧，一般般"]


@contextmanager
def served(
    triton: TritonServer, client: grpcclient.InferenceServerClient, name: str, *extra: str
) -> Iterator[None]:
    """Install `name` (and the models it composes, `extra`) from the examples, load, finally unload."""
    for model in (name, *extra):
        install_model(triton, EXAMPLES / model)
    client.load_model(name, client_timeout=LOAD_TIMEOUT_S)
    try:
        yield
    finally:
        client.unload_model(name, unload_dependents=True)


def tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array)
    return item


def texts(values: list[str]) -> np.ndarray:
    """BYTES [n, 1]: a batch of UTF-8 texts, the way the article's client sends them."""
    return np.array([v.encode("utf-8") for v in values], dtype=object).reshape(-1, 1)


def decoded(array: np.ndarray) -> list[str]:
    return [item.decode("utf-8") for item in array.reshape(-1)]


def softmax(logits: list[float]) -> np.ndarray:
    values = np.exp(np.array(logits) - max(logits))
    return values / values.sum()


def infer(client: grpcclient.InferenceServerClient, model: str, inputs: list, version: str = ""):
    return client.infer(model, inputs, model_version=version, client_timeout=INFER_TIMEOUT_S)


# ------------------------------------------------------------------ offline: the repository itself


def example_models() -> list[str]:
    return sorted(p.parent.name for p in EXAMPLES.glob("*/config.pbtxt"))


@pytest.mark.parametrize("model", example_models())
def test_every_example_config_is_complete_and_cpu_only(model: str) -> None:
    text = (EXAMPLES / model / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.name == model
    assert "max_batch_size" in text, "auto-complete is off: max_batch_size must be explicit"
    assert config.input and config.output
    assert all(group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU for group in config.instance_group)
    versions = [p for p in (EXAMPLES / model).iterdir() if p.is_dir() and p.name.isdigit()]
    assert versions
    for version in versions:
        if config.platform == "ensemble":
            assert (version / ".gitkeep").exists()
        else:
            assert config.backend == "python"
            assert (version / "model.py").is_file()


def test_the_seed_models_are_all_there() -> None:
    assert set(example_models()) >= {
        "linear",
        "linear_fixed",
        "reshape_test",
        "string",
        "string_batch",
        "multiversion",
        "sentiment",
        "sentiment_pipeline",
        "sentiment_tokenizer",
        "sentiment_classifier",
    }


# ------------------------------------------------------------------ served


def test_linear_batches_up_to_four_rows(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "linear"):
        x = np.array([[1, 2, 3], [4, 5, 6], [1, 0, 0]], dtype=np.float32)
        y = infer(triton_client, "linear", [tensor("x", x, "FP32")]).as_numpy("y")
        assert y.shape == (3, 1)
        np.testing.assert_allclose(y, [[6.0], [15.0], [-0.5]], atol=1e-6)  # x . [0.5, 1, 1.5] - 1
        with pytest.raises(InferenceServerException, match="batch-size must be <= 4 for .linear."):
            infer(triton_client, "linear", [tensor("x", np.ones((5, 3), np.float32), "FP32")])


def test_linear_fixed_takes_exactly_three_rows(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "linear_fixed"):
        x = np.array([[1, 2, 3], [4, 5, 6], [1, 0, 0]], dtype=np.float32)
        y = infer(triton_client, "linear_fixed", [tensor("x", x, "FP32")]).as_numpy("y")
        np.testing.assert_allclose(y, [[6.0], [15.0], [-0.5]], atol=1e-6)
        with pytest.raises(InferenceServerException) as caught:
            infer(triton_client, "linear_fixed", [tensor("x", np.ones((5, 3), np.float32), "FP32")])
        assert (
            "unexpected shape for input 'x' for model 'linear_fixed'. Expected [3,3], got [5,3]"
            in caught.value.message()
        )


def test_reshape_test_model_receives_one_by_three(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "reshape_test"):
        x = np.array([2.0, 3.0, 4.0], dtype=np.float32)
        result = infer(triton_client, "reshape_test", [tensor("x", x, "FP32")])
        assert result.as_numpy("received_shape").tolist() == [1, 3]  # [[2., 3., 4.]] inside
        assert result.as_numpy("y").tolist() == [[9.0]]  # model made [9.] (reshape [1]); dims [1, 1]


def test_string_decodes_utf8(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "string"):
        data = np.array(["héllo wörld".encode(), "你好 triton".encode()], dtype=object)
        result = infer(triton_client, "string", [tensor("text", data, "BYTES")])
        assert decoded(result.as_numpy("upper")) == ["HÉLLO WÖRLD", "你好 TRITON"]
        assert result.as_numpy("length").tolist() == [11, 9]  # characters, not bytes


def test_string_batch_takes_n_by_one(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "string_batch"):
        batch = tensor("text", texts(["今天天气很好", "ok"]), "BYTES")
        result = infer(triton_client, "string_batch", [batch])
        assert result.as_numpy("upper").shape == (2, 1)
        assert decoded(result.as_numpy("upper")) == ["今天天气很好", "OK"]
        assert result.as_numpy("length").tolist() == [[6], [2]]


def multiversion_request(client: grpcclient.InferenceServerClient, model: str, version: str = ""):
    result = infer(client, model, [tensor("x", np.array([3.0], np.float32), "FP32")], version)
    return result.as_numpy("version").tolist(), result.as_numpy("y").tolist()


def test_multiversion_serves_both_versions(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "multiversion"):
        assert triton_client.is_model_ready("multiversion", "1")
        assert triton_client.is_model_ready("multiversion", "2")
        assert multiversion_request(triton_client, "multiversion", "1") == ([1], [4.0])  # x + 1
        assert multiversion_request(triton_client, "multiversion", "2") == ([2], [30.0])  # x * 10
        assert multiversion_request(triton_client, "multiversion") == ([2], [30.0])  # default: highest


def test_multiversion_with_latest_one_serves_only_version_2(triton: TritonServer, triton_client) -> None:
    name = "multiversion_latest"
    dest = install_model(triton, EXAMPLES / "multiversion", name)
    config = (dest / "config.pbtxt").read_text()
    config = config.replace('name: "multiversion"', f'name: "{name}"')
    config = config.replace("version_policy: { all { } }", "version_policy: { latest { num_versions: 1 } }")
    (dest / "config.pbtxt").write_text(config)
    triton_client.load_model(name, client_timeout=LOAD_TIMEOUT_S)
    try:
        assert multiversion_request(triton_client, name, "2") == ([2], [30.0])
        assert not triton_client.is_model_ready(name, "1")
        with pytest.raises(InferenceServerException) as caught:
            multiversion_request(triton_client, name, "1")
        assert f"Request for unknown model: '{name}' version 1 is not found" in caught.value.message()
    finally:
        triton_client.unload_model(name)


def test_a_config_override_can_narrow_the_version_policy(triton: TritonServer, triton_client) -> None:
    name = "multiversion_override"
    dest = install_model(triton, EXAMPLES / "multiversion", name)
    (dest / "config.pbtxt").write_text(
        (dest / "config.pbtxt").read_text().replace('name: "multiversion"', f'name: "{name}"')
    )
    override = {  # an override replaces the whole config: it must be complete
        "name": name,
        "backend": "python",
        "max_batch_size": 0,
        "version_policy": {"latest": {"num_versions": 1}},
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [
            {"name": "y", "data_type": "TYPE_FP32", "dims": [1]},
            {"name": "version", "data_type": "TYPE_INT32", "dims": [1]},
        ],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    triton_client.load_model(name, config=json.dumps(override), client_timeout=LOAD_TIMEOUT_S)
    try:
        assert multiversion_request(triton_client, name) == ([2], [30.0])
        with pytest.raises(InferenceServerException, match="version 1 is not found"):
            multiversion_request(triton_client, name, "1")
    finally:
        triton_client.unload_model(name)


def expected_sentiment() -> tuple[list[str], np.ndarray]:
    # bag of words: 好 + 喜欢 (positive rows [-1, 2, 0]), 差 + 失望 (negative rows [2, -1, 0]),
    # 还行 + 一般 (neutral rows [0, 0, 1.5]); bias [0, 0, 0.5]
    probabilities = np.array([softmax([-2, 4, 0.5]), softmax([4, -2, 0.5]), softmax([0, 0, 3.5])])
    return ["正向", "负面", "中性"], probabilities


def test_sentiment_classifies_raw_texts_server_side(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "sentiment"):
        result = infer(triton_client, "sentiment", [tensor("text", texts(SEED_TEXTS), "BYTES")])
        labels, probabilities = expected_sentiment()
        assert result.as_numpy("label").shape == (3, 1)
        assert decoded(result.as_numpy("label")) == labels  # Chinese labels round-trip as UTF-8
        got = result.as_numpy("probabilities")
        assert got.shape == (3, 3) and got.dtype == np.float32  # 9 numbers in the JSON response
        np.testing.assert_allclose(got, probabilities, atol=1e-6)
        np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-6)
        assert [LABELS[i] for i in got.argmax(axis=1)] == labels

        english = ["Great movie, I love it!", "terrible and awful", "nothing known here"]
        result = infer(triton_client, "sentiment", [tensor("text", texts(english), "BYTES")])
        assert decoded(result.as_numpy("label")) == ["正向", "负面", "中性"]  # no known word: the bias


def test_sentiment_pipeline_ensemble_matches_the_single_model(triton: TritonServer, triton_client) -> None:
    parts = ("sentiment_tokenizer", "sentiment_classifier")
    with served(triton, triton_client, "sentiment_pipeline", *parts):
        for part in parts:  # loading the ensemble loads what it composes
            assert triton_client.is_model_ready(part)
        counts = infer(triton_client, "sentiment_tokenizer", [tensor("text", texts(SEED_TEXTS), "BYTES")])
        assert counts.as_numpy("counts").shape == (3, 23)
        assert counts.as_numpy("counts").sum(axis=1).tolist() == [2.0, 2.0, 2.0]

        result = infer(triton_client, "sentiment_pipeline", [tensor("text", texts(SEED_TEXTS), "BYTES")])
        labels, probabilities = expected_sentiment()
        assert decoded(result.as_numpy("label")) == labels
        np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, atol=1e-6)
    assert not triton_client.is_model_ready("sentiment_tokenizer")  # unloaded with the ensemble


def test_models_load_from_their_own_directory(triton: TritonServer, triton_client) -> None:
    """Weights are read relative to the model directory, so a renamed copy still loads."""
    name = "sentiment_copy"
    dest = install_model(triton, EXAMPLES / "sentiment", name)
    config: Path = dest / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "sentiment"', f'name: "{name}"'))
    triton_client.load_model(name, client_timeout=LOAD_TIMEOUT_S)
    try:
        result = infer(triton_client, name, [tensor("text", texts(["好"]), "BYTES")])
        assert decoded(result.as_numpy("label")) == ["正向"]
    finally:
        triton_client.unload_model(name)
