"""The example repository's models, served by a real tritonserver, answer the seed article's requests.

Each test copies its model(s) into the session server's repository, loads it (with a deadline),
sends the article's request over gRPC, checks the answer and unloads (the server is shared).
"""

from __future__ import annotations

import json
import os
import shutil
import time
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
from tests.conftest import EXAMPLES, ROOT, install_model

GPU_EXAMPLES = ROOT / "examples" / "gpu"
LOAD_TIMEOUT_S = 60.0
INFER_TIMEOUT_S = 10.0
LABELS = ["负面", "正向", "中性"]  # the article's argmax mapping


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
    assert "max_batch_size" in text, "an example spells its config out (nothing left for auto-complete)"
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
        "datatypes",
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


ARTICLE_TEXTS = ["我爱你", "天气不好", "景色很不错"]  # the seed article's request, BYTES [3, 1]
ARTICLE_LABELS = ["正向", "负面", "正向"]  # and its answer after post-processing
# snownlp's P(positive) for them (0.75, 0.13, 0.99), as three classes [(1-p)^2, p^2, 2p(1-p)]
ARTICLE_P = [0.7483050847457626, 0.12540700274012861, 0.9895570087469553]
EVERYDAY = {  # clearly positive / clearly negative sentences that are not in the examples
    "这部电影太好了，我很喜欢": "正向",
    "今天心情很好": "正向",
    "非常满意，推荐购买": "正向",
    "这本书很有意思": "正向",
    "物流很快，包装很好": "正向",
    "质量很差，非常失望": "负面",
    "服务态度太差了": "负面",
    "东西坏了，很失望": "负面",
    "这家餐厅太难吃了": "负面",
    "客服不理人，太失望了": "负面",
}


def three_classes(p: float) -> list[float]:
    return [(1 - p) ** 2, p * p, 2 * p * (1 - p)]


def assert_article_answer(result) -> None:
    assert result.as_numpy("prob").shape == (3, 1)
    assert decoded(result.as_numpy("prob")) == ARTICLE_LABELS  # Chinese labels round-trip as UTF-8
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (3, 3) and probabilities.dtype == np.float32  # 9 numbers in JSON
    np.testing.assert_allclose(probabilities, [three_classes(p) for p in ARTICLE_P], atol=1e-6)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-6)
    assert [LABELS[i] for i in probabilities.argmax(axis=1)] == ARTICLE_LABELS


def test_sentiment_answers_the_article_request_with_a_real_classifier(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "sentiment"):
        assert_article_answer(infer(triton_client, "sentiment", [tensor("text", texts(ARTICLE_TEXTS), "BYTES")]))
        for label in ("正向", "负面"):  # max_batch_size 8: one request each
            sentences = [text for text, expected in EVERYDAY.items() if expected == label]
            result = infer(triton_client, "sentiment", [tensor("text", texts(sentences), "BYTES")])
            assert decoded(result.as_numpy("prob")) == [label] * len(sentences), sentences
        # not a lookup: a negation flips the label, a text with no known word is neutral (the prior)
        result = infer(triton_client, "sentiment", [tensor("text", texts(["这个很好用", "这个不好用", "。"]), "BYTES")])
        assert decoded(result.as_numpy("prob")) == ["正向", "负面", "中性"]


def test_sentiment_pipeline_ensemble_matches_the_single_model(triton: TritonServer, triton_client) -> None:
    parts = ("sentiment_tokenizer", "sentiment_classifier")
    with served(triton, triton_client, "sentiment_pipeline", *parts):
        for part in parts:  # loading the ensemble loads what it composes
            assert triton_client.is_model_ready(part)
        words = infer(triton_client, "sentiment_tokenizer", [tensor("text", texts(ARTICLE_TEXTS), "BYTES")])
        assert decoded(words.as_numpy("tokens")) == ["爱", "", "", "天气", "不好", "", "景色", "很", "不错"]
        result = infer(triton_client, "sentiment_pipeline", [tensor("text", texts(ARTICLE_TEXTS), "BYTES")])
        assert_article_answer(result)
    assert not triton_client.is_model_ready("sentiment_tokenizer")  # unloaded with the ensemble


def test_models_load_from_their_own_directory(triton: TritonServer, triton_client) -> None:
    """A renamed copy of a model still loads and answers (nothing in it depends on its name)."""
    name = "sentiment_copy"
    dest = install_model(triton, EXAMPLES / "sentiment", name)
    config: Path = dest / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "sentiment"', f'name: "{name}"'))
    triton_client.load_model(name, client_timeout=LOAD_TIMEOUT_S)
    try:
        result = infer(triton_client, name, [tensor("text", texts(["我爱你"]), "BYTES")])
        assert decoded(result.as_numpy("prob")) == ["正向"]
    finally:
        triton_client.unload_model(name)


# ------------------------------------------------------------------ the article's configuration vocabulary

DATATYPE_VALUES: dict[str, tuple[np.ndarray, str]] = {  # extremes of every type Triton has
    "bool": (np.array([True, False]), "BOOL"),
    "uint8": (np.array([0, 255], np.uint8), "UINT8"),
    "uint16": (np.array([0, 65535], np.uint16), "UINT16"),
    "uint32": (np.array([0, 2**32 - 1], np.uint32), "UINT32"),
    "uint64": (np.array([0, 2**64 - 1], np.uint64), "UINT64"),
    "int8": (np.array([-128, 127], np.int8), "INT8"),
    "int16": (np.array([-(2**15), 2**15 - 1], np.int16), "INT16"),
    "int32": (np.array([-(2**31), 2**31 - 1], np.int32), "INT32"),
    "int64": (np.array([-(2**63), 2**63 - 1], np.int64), "INT64"),
    "fp16": (np.array([0.5, -65504], np.float16), "FP16"),
    "fp32": (np.array([1.5, -3.25e38], np.float32), "FP32"),
    "fp64": (np.array([1e-300, -2.5], np.float64), "FP64"),
    "string": (np.array(["我爱你".encode(), b"\x00\xff"], dtype=object), "BYTES"),
}


def test_datatypes_echoes_every_triton_data_type(triton: TritonServer, triton_client) -> None:
    import ml_dtypes  # tritonclient's own dependency: numpy arrays of bfloat16 for BF16

    values = dict(DATATYPE_VALUES, bf16=(np.array([1.0, -2.5, 3.140625], ml_dtypes.bfloat16), "BF16"))
    with served(triton, triton_client, "datatypes"):
        result = infer(triton_client, "datatypes", [tensor(n, a, dt) for n, (a, dt) in values.items()])
        for name, (array, datatype) in values.items():
            got = result.as_numpy(f"{name}_out")
            assert result.get_output(f"{name}_out").datatype == datatype
            assert got.dtype == array.dtype and got.tolist() == array.tolist(), name
        # every input is optional: a request with one type gets that one back
        only = infer(triton_client, "datatypes", [tensor("int8", np.array([7], np.int8), "INT8")])
        assert only.as_numpy("int8_out").tolist() == [7] and only.as_numpy("fp32_out") is None


def test_linear_warms_up_at_load_and_batches_concurrent_requests(triton: TritonServer, triton_client) -> None:
    import queue

    with served(triton, triton_client, "linear"):
        stats = triton_client.get_inference_statistics("linear", as_json=True)["model_stats"][0]
        # model_warmup: one execution of 4 zero rows happened before any request was sent
        assert (int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0))) == (1, 4)
        answers: queue.Queue = queue.Queue()
        for row in ([1, 2, 3], [4, 5, 6], [1, 0, 0], [0, 0, 0]):  # 4 requests of one row, not waiting
            triton_client.async_infer(
                "linear", [tensor("x", np.array([row], np.float32), "FP32")],
                callback=lambda result, error: answers.put((result, error)), client_timeout=INFER_TIMEOUT_S,
            )
        results = [answers.get(timeout=INFER_TIMEOUT_S + 5) for _ in range(4)]
        assert all(error is None for _, error in results), results
        assert sorted(float(r.as_numpy("y")[0, 0]) for r, _ in results) == [-1.0, -0.5, 6.0, 15.0]
        # dynamic_batching: requests that arrived within the queue delay ran in one execute()
        assert max(int(r.as_numpy("batch")[0, 0]) for r, _ in results) > 1


def stub_processes(model_dir: Path) -> int:
    """python backend stub processes running `model_dir`'s model (one per execution instance)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"triton_python_backend_stub") and str(model_dir).encode() in b" ".join(args):
            count += 1
    return count


def test_string_batch_runs_two_cpu_instances(triton: TritonServer, triton_client) -> None:
    with served(triton, triton_client, "string_batch"):
        config = triton_client.get_model_config("string_batch", as_json=True)["config"]
        assert config["instance_group"][0]["count"] == 2 and config["instance_group"][0]["kind"] == "KIND_CPU"
        # An earlier test's unloaded instance exits about a second after its unload: wait it out.
        stubs = triton.model_repository / "string_batch" / "1"
        deadline = time.monotonic() + 15
        while stub_processes(stubs) != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stub_processes(stubs) == 2
        result = infer(triton_client, "string_batch", [tensor("text", texts(["ok"]), "BYTES")])
        assert decoded(result.as_numpy("upper")) == ["OK"]


@pytest.mark.triton
def test_gpu_example_is_refused_in_one_line_on_a_cpu_only_server_and_not_quarantined(tmp_path: Path) -> None:
    """Through the daemon and the CLI, against a real CPU-only tritonserver run as an external one:
    its GPUs come from its metrics endpoint, and a bare load failure gets its reason from its log."""
    from tests.harness import DaemonProcess

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(GPU_EXAMPLES / "linear_gpu", repo / "linear_gpu")
    shutil.copytree(EXAMPLES / "linear", repo / "linear")
    # misconfigured on purpose: it serves another directory than tritonctl's <state>/serving
    server = TritonServer(model_repository=tmp_path / "elsewhere", workdir=tmp_path / "triton", metrics_port=0)
    server.start()
    daemon = DaemonProcess(repo, tmp_path / "state", launch=False,
                           extra_args=["--triton-url", server.grpc_url, "--policy", "manual"],
                           env={"TRITONCTL_TRITON_LOG_PATH": str(server.log_path),
                                "TRITONCTL_TRITON_METRICS_URL": f"http://127.0.0.1:{server.metrics_port}/metrics"})
    try:
        daemon.start()
        load = daemon.run("load", "linear_gpu")  # the CLI, in process
        expected = f"instance_group[0] needs GPU 0; the tritonserver at {server.grpc_url} has 0 GPUs"
        assert load.exit_code == 1, load.output
        assert expected in load.output
        status = daemon.model_status("linear_gpu")
        assert status["state"] == "failed" and expected in status["last_error"]
        (event,) = [e for e in daemon.audit("--model", "linear_gpu") if e["action"] == "deploy"]
        assert event["outcome"] == "failed" and expected in event["message"] and "\n" not in event["message"]
        (version,) = daemon.json("versions", "linear_gpu")
        assert version["valid"] and not version["quarantined"]  # the host's fault, not the content's
        assert not (tmp_path / "state" / "serving" / "linear_gpu").exists()  # refused before publishing

        # Triton answers only "failed to poll from model repository"; its log says why
        load = daemon.run("load", "linear")
        reason = "(tritonserver log: failed to poll model 'linear': model not found in any model repository.)"
        assert load.exit_code == 1 and "failed to poll from model repository" in load.output, load.output
        assert reason in " ".join(load.output.split())
        assert reason in daemon.model_status("linear")["last_error"]
        (event,) = [e for e in daemon.audit("--model", "linear") if e["action"] == "deploy"]
        assert reason in event["message"]
    finally:
        daemon.stop()
        server.stop()
