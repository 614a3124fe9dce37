"""Smoke requests: smoke.json is checked offline with one-line errors, and run against a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controlplane.deploy.smoke import InferFn, SmokeResult, run_smoke, smoke_test
from controlplane.errors import ModelConfigError
from controlplane.triton.client import TritonClient
from controlplane.triton.launcher import TritonServer
from controlplane.validation.smokefile import SmokeInput, SmokeOutput, SmokeRequest, load_smoke_file
from tests.conftest import EXAMPLES, install_model

LOAD_TIMEOUT_S = 60.0
LINEAR_REQUEST: dict[str, Any] = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}],
    "outputs": [{"name": "y", "data": [6], "tolerance": 1e-6}],
}


def write_smoke(tmp_path: Path, document: object, model: str = "linear") -> Path:
    path = tmp_path / model / "smoke.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document if isinstance(document, str) else json.dumps(document), encoding="utf-8")
    return path


def request_with(**changes: object) -> dict[str, object]:
    request = json.loads(json.dumps(LINEAR_REQUEST))
    for key, value in changes.items():
        kind, field = key.split("__")
        request[kind][0][field] = value
    return {"requests": [request]}


# ------------------------------------------------------------------ parsing


def test_parses_the_documented_example(tmp_path: Path) -> None:
    (request,) = load_smoke_file(write_smoke(tmp_path, {"requests": [dict(LINEAR_REQUEST, version="1")]}))
    assert request.version == "1"
    (x,) = request.inputs
    assert (x.name, x.datatype, x.array.dtype, x.array.shape) == ("x", "FP32", np.float32, (1, 3))
    assert x.array.tolist() == [[1.0, 2.0, 3.0]]
    (y,) = request.outputs
    assert (y.name, y.tolerance, y.shape, y.expected.tolist()) == ("y", 1e-6, None, [6.0])


def test_nested_data_bytes_and_defaults(tmp_path: Path) -> None:
    document = {
        "requests": [
            {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2, 1], "data": [["好"], ["ok"]]}],
                "outputs": [{"name": "label", "shape": [2, 1], "data": [["正向"], ["中性"]]}],
            }
        ]
    }
    (request,) = load_smoke_file(write_smoke(tmp_path, document))
    assert request.version == ""
    assert request.inputs[0].array.dtype == object
    assert request.inputs[0].array.reshape(-1).tolist() == ["好".encode(), b"ok"]
    assert request.outputs[0].shape == (2, 1)
    assert request.outputs[0].expected.reshape(-1).tolist() == ["正向", "中性"]


def test_every_example_smoke_file_parses() -> None:
    files = sorted(EXAMPLES.glob("*/smoke.json"))
    assert {p.parent.name for p in files} >= {"linear", "sentiment"}
    for path in files:
        assert load_smoke_file(path)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {
                "requests": [
                    {
                        "inputs": [
                            LINEAR_REQUEST["inputs"][0],
                            {"name": "z", "datatype": "FP33", "shape": [1], "data": [1]},
                        ]
                    }
                ]
            },
            "linear/smoke.json: requests[0].inputs[1].datatype: unknown datatype 'FP33'",
        ),
        (
            request_with(inputs__data=[1, 2]),
            "linear/smoke.json: requests[0].inputs[0].data: 2 values do not fill shape [1, 3]",
        ),
        (
            request_with(inputs__data=[[1, 2, 3], [4, 5, 6]]),
            "requests[0].inputs[0].data: nested data has shape [2, 3] but shape is [1, 3]",
        ),
        (request_with(inputs__data=[[1, 2], [3]]), "requests[0].inputs[0].data: ragged nested lists"),
        (
            request_with(inputs__data=[1, "2", 3]),
            "requests[0].inputs[0].data: value 1: FP32 data must be numbers",
        ),
        (
            request_with(inputs__datatype="BYTES"),
            "requests[0].inputs[0].data: value 0: BYTES data must be strings",
        ),
        (
            request_with(inputs__datatype="UINT8", inputs__data=[1, 2, 300]),
            "requests[0].inputs[0].data: value 2: 300 is not a UINT8",
        ),
        (
            request_with(inputs__shape=[1, -3]),
            "requests[0].inputs[0].shape: expected a list of integers >= 0",
        ),
        (request_with(outputs__tolerance=-1), "requests[0].outputs[0].tolerance: expected a number >= 0"),
        (request_with(outputs__tolerence=0.1), "requests[0].outputs[0].tolerence: unknown field"),
        (request_with(outputs__data=[1, "a"]), "requests[0].outputs[0].data: value 1: expected all numbers"),
        (request_with(outputs__shape=[2]), "requests[0].outputs[0].data: 1 values do not fill shape [2]"),
        (
            {"requests": [dict(LINEAR_REQUEST, version="v1")]},
            "requests[0].version: expected a version number",
        ),
        ({"requests": [{"outputs": []}]}, "requests[0].inputs: expected a non-empty list"),
        ({"requests": []}, "linear/smoke.json: requests: expected a non-empty list"),
        ([], "linear/smoke.json: (top level): expected an object"),
        (
            {"requests": [{"inputs": [LINEAR_REQUEST["inputs"][0]] * 2}]},
            "requests[0].inputs: name 'x' appears twice",
        ),
        ('{"requests": [\n  {"inputs": [}\n]}', "linear/smoke.json: invalid JSON at line 2 col 15"),
    ],
)
def test_bad_files_fail_with_one_line_naming_file_and_field(
    tmp_path: Path, document: object, message: str
) -> None:
    with pytest.raises(ModelConfigError) as caught:
        load_smoke_file(write_smoke(tmp_path, document))
    text = str(caught.value)
    assert message in text
    assert text.startswith("linear/smoke.json: ")
    assert "\n" not in text


def test_a_missing_file_is_a_model_config_error(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="linear/smoke.json: cannot read"):
        load_smoke_file(tmp_path / "linear" / "smoke.json")


# ------------------------------------------------------------------ comparing (no server needed)


def fixed_answer(**outputs: np.ndarray):
    def infer(model: str, version: str, inputs: Sequence[SmokeInput], names: Sequence[str]):
        return dict(outputs)

    return infer


def one_request(*outputs: SmokeOutput, version: str = "") -> list[SmokeRequest]:
    x = SmokeInput("x", "FP32", np.zeros((1, 3), np.float32))
    return [SmokeRequest(inputs=(x,), outputs=outputs, version=version)]


def test_run_smoke_reports_the_first_differing_index() -> None:
    expected = SmokeOutput("y", np.array([[1.0, 2.0], [3.0, 4.0]]), 1e-3, None)
    got = np.array([[1.0, 2.0], [3.5, 4.0]], np.float32)
    assert run_smoke("m", one_request(expected, version="2"), fixed_answer(y=got)) == [
        "m version 2 request 0: output 'y' differs at index [1, 0]: expected 3.0, got 3.5 (tolerance 0.001)"
    ]
    within = np.array([[1.0005, 2.0], [3.0, 4.0]], np.float32)
    assert run_smoke("m", one_request(expected), fixed_answer(y=within)) == []


def test_run_smoke_checks_shape_only_when_given() -> None:
    got = np.array([[6.0]], np.float32)
    without = SmokeOutput("y", np.array([6.0]), 1e-6, None)
    assert run_smoke("m", one_request(without), fixed_answer(y=got)) == []
    shaped = SmokeOutput("y", np.array([6.0]), 1e-6, (1,))
    assert run_smoke("m", one_request(shaped), fixed_answer(y=got)) == [
        "m request 0: output 'y' has shape [1, 1], expected [1]"
    ]


def test_run_smoke_compares_bytes_exactly_after_decoding() -> None:
    expected = SmokeOutput("label", np.array(["正向", "负面"], dtype=object), 0.5, None)
    good = np.array(["正向".encode(), "负面".encode()], dtype=object)
    assert run_smoke("m", one_request(expected), fixed_answer(label=good)) == []
    bad = np.array(["正向".encode(), "中性".encode()], dtype=object)
    assert run_smoke("m", one_request(expected), fixed_answer(label=bad)) == [
        "m request 0: output 'label' differs at index 1: expected '负面', got '中性'"
    ]


def test_run_smoke_reports_missing_outputs_and_keeps_infer_errors() -> None:
    expected = SmokeOutput("y", np.array([6.0]), 1e-6, None)
    assert run_smoke("m", one_request(expected), fixed_answer()) == [
        "m request 0: output 'y' missing from the response"
    ]

    def broken(model: str, version: str, inputs: Sequence[SmokeInput], names: Sequence[str]):
        raise RuntimeError("connection\nrefused")

    assert run_smoke("m", one_request(expected) * 2, broken) == [
        "m request 0: infer failed: connection refused",
        "m request 1: infer failed: connection refused",
    ]


# ------------------------------------------------------------------ against the real server


@pytest.fixture
def infer(triton: TritonServer) -> Iterator[InferFn]:
    """The transport a deploy gives run_smoke: the daemon's Triton client."""
    client = TritonClient(triton.grpc_url)

    def fn(model: str, version: str, inputs: Sequence[SmokeInput], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        return client.infer(model, version, [(i.name, i.datatype, i.array) for i in inputs if i.array is not None],
                            outputs)

    yield fn
    client.close()


@pytest.mark.parametrize("model", sorted(p.parent.name for p in EXAMPLES.glob("*/smoke.json")))
def test_every_example_passes_its_own_smoke_file(
    triton: TritonServer, triton_client, infer: InferFn, model: str
) -> None:
    parts = ("sentiment_tokenizer", "sentiment_classifier") if model == "sentiment_pipeline" else ()
    for part in (model, *parts):
        install_model(triton, EXAMPLES / part)
    triton_client.load_model(model, client_timeout=LOAD_TIMEOUT_S)
    try:
        requests = load_smoke_file(EXAMPLES / model / "smoke.json")
        assert run_smoke(model, requests, infer) == []
    finally:
        triton_client.unload_model(model, unload_dependents=True)


def test_a_wrong_expectation_fails_with_a_clear_message(
    triton: TritonServer, triton_client, infer: InferFn, tmp_path: Path
) -> None:
    wrong = json.loads((EXAMPLES / "linear" / "smoke.json").read_text())
    wrong["requests"][1]["outputs"][0]["data"] = [[15], [0.5]]  # the model answers -0.5
    wrong["requests"].append(dict(LINEAR_REQUEST, version="7"))
    requests = load_smoke_file(write_smoke(tmp_path, wrong))
    install_model(triton, EXAMPLES / "linear")
    triton_client.load_model("linear", client_timeout=LOAD_TIMEOUT_S)
    try:
        failures = run_smoke("linear", requests, infer)
    finally:
        triton_client.unload_model("linear")
    assert failures == [
        "linear request 1: output 'y' differs at index [1, 0]: expected 0.5, got -0.5 (tolerance 1e-06)",
        "linear version 7 request 2: infer failed: infer 'linear': "
        "Request for unknown model: 'linear' version 7 is not found",
    ]


def test_the_readme_example_is_valid_and_passes(
    triton: TritonServer, triton_client, infer: InferFn, tmp_path: Path
) -> None:
    reference = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    section = reference.split("## Smoke requests", 1)[1]
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    requests = load_smoke_file(write_smoke(tmp_path, example))
    install_model(triton, EXAMPLES / "linear")
    triton_client.load_model("linear", client_timeout=LOAD_TIMEOUT_S)
    try:
        assert run_smoke("linear", requests, infer) == []
    finally:
        triton_client.unload_model("linear")


class Batches:
    """A stand-in for a model under client traffic: each try of the smoke request either shares a batch that another
    request fails (the smoke fails too, and Triton counts two failures) or runs in a good one; other requests
    pass meanwhile unless `nobody_passes`."""

    def __init__(self, poisoned: list[bool], answer: float = 1.0, nobody_passes: bool = False) -> None:
        self.poisoned, self.answer, self.nobody_passes = list(poisoned), answer, nobody_passes
        self.success = self.failure = 0

    def infer(self, model: str, version: str, inputs: Any, names: Any) -> dict[str, np.ndarray]:
        if not self.nobody_passes:
            self.success += 3  # other clients' good batches
        if self.poisoned.pop(0):
            self.failure += 2  # the batch: a marked request and the smoke request
            raise RuntimeError("a marked request is in this batch: the whole batch fails")
        self.success += 1
        return {"y": np.array([[self.answer]], dtype=np.float32)}

    def counts(self) -> tuple[int, int]:
        return self.success, self.failure


def test_a_smoke_request_that_failed_in_a_shared_batch_is_tried_again_alone() -> None:
    """Issue 57: a request that failed only where others failed too is tried again (3 tries in all); one pass
    is a pass; three failed tries, each beside another failure while others passed, are `shared` (nobody's
    proven fault). A wrong answer, a failure nobody else had, or a model that passes nothing, is its own."""
    request = one_request(SmokeOutput("y", np.array([[1.0]]), 1e-6, None))
    naps: list[float] = []
    batches = Batches([True, True, False])
    assert smoke_test("m", request, batches.infer, batches.counts, sleep=naps.append) == SmokeResult([])
    assert naps == [0.2, 0.5]
    batches = Batches([True, True, True])
    result = smoke_test("m", request, batches.infer, batches.counts, sleep=naps.append)
    assert result.shared and len(result.failures) == 1 and "infer failed: a marked request" in result.failures[0]
    wrong = Batches([False], answer=2.0)
    result = smoke_test("m", request, wrong.infer, wrong.counts, sleep=naps.append)
    assert not result.shared and "expected 1.0, got 2.0" in result.failures[0]
    broken = Batches([True, True, True], nobody_passes=True)
    assert not smoke_test("m", request, broken.infer, broken.counts, sleep=naps.append).shared
    alone = Batches([True])
    alone.infer = lambda *a: (_ for _ in ()).throw(RuntimeError("initialize left it broken"))  # type: ignore[method-assign]
    result = smoke_test("m", request, alone.infer, alone.counts, sleep=naps.append)  # counted: nothing else failed
    assert not result.shared and result.failures
    assert not smoke_test("m", request, Batches([True] * 3).infer, None, sleep=naps.append).shared  # no figures
