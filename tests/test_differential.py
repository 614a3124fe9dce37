"""Offline validation against the real tritonserver, case by case (tests/differential).

The default suite runs a sample covering every category; `-m slow` runs every generated case. A
case that validation passes and Triton refuses fails the test unless its allow-list entry names
Triton's refusal and the deploy-time host check refuses it too; a case validation refuses but Triton
loads must be a documented stricter rule; a case both refuse must be refused for the same field.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from controlplane.triton.launcher import TritonServer
from controlplane.validation.modelconfig import Problem
from tests.differential.cases import all_cases, categories
from tests.differential.runner import Outcome, run, suite_server
from tests.differential.verdicts import (
    ALLOWED_FALSE_ACCEPTS,
    REASON_DIFFERS,
    SAMPLE,
    STRICTER,
    report,
    sample,
    triton_fields,
    unexpected,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    base = tmp_path_factory.mktemp("differential")
    (base / "repo").mkdir()
    triton = suite_server(base)
    triton.start()
    yield triton
    triton.stop()


def test_generator_covers_every_category_with_200_cases() -> None:
    cases = all_cases()
    assert len(cases) >= 200
    names = {c.name for c in cases}
    assert set(ALLOWED_FALSE_ACCEPTS) <= names and set(STRICTER) <= names and set(REASON_DIFFERS) <= names
    assert set(categories(cases)) >= {"model_warmup", "ensemble", "ensemble_across", "sequence_batching",
                                      "dynamic_batching", "priority_queue", "instance_group", "batch_input",
                                      "label_filename", "execution_env", "datatypes", "reshape", "version_policy"}
    assert {c.category for c in sample()} == set(categories(cases))
    assert len(sample()) == len(SAMPLE)


def _outcome(name: str, offline: list[str], triton: str, deploy: str = "") -> Outcome:
    case = next(c for c in all_cases() if c.name == name)
    problems = [Problem(f"{name}_m/config.pbtxt", field, "why", "error") for field in offline]
    return Outcome(case, not problems, problems, not triton, triton, 0.0, deploy)


def test_an_allow_listed_case_refused_for_another_reason_fails() -> None:
    gpu = "instance group instances_gpu_m_0 of model instances_gpu_m has kind KIND_GPU but no GPUs are available"
    deploy = "instance_group[0] needs a GPU (KIND_GPU); the tritonserver at 127.0.0.1:1 has 0 GPUs"
    assert unexpected([_outcome("instances_gpu", [], gpu, deploy)]) == []
    other = "failed to load 'instances_gpu_m' version 1: Internal: failed to open text file for read x/labels.txt"
    assert unexpected([_outcome("instances_gpu", [], other, deploy)])[0].startswith(
        "instances_gpu: validation passes, excused only for a GPU (instance_group KIND_GPU), but Triton refuses")
    # Triton's reason matches, but the host check before the load would not stop it: not excused either
    assert unexpected([_outcome("instances_gpu", [], gpu, "")])


def test_both_refusing_for_different_fields_fails() -> None:
    dims = "Poll failed for model directory 'dims_zero_m': model input 'x' dimension must be integer >= 1"
    assert triton_fields(dims) == {"input.dims"}
    assert unexpected([_outcome("dims_zero", ["input[0].dims"], dims)]) == []
    assert unexpected([_outcome("dims_zero", ["output[0].dims"], dims)])[0].startswith(
        "dims_zero: both refuse, for different fields: validation ['output.dims'], Triton ['input.dims']")
    unexplained = "failed to load 'dims_zero_m', failed to poll from model repository"
    assert unexpected([_outcome("dims_zero", ["input[0].dims"], unexplained)])  # no reason: not the same field


def test_a_case_that_kills_tritonserver_at_every_attempt_counts_as_refused() -> None:
    """Measured (`python -m tests.differential -k warm`, run a few times): tritonserver 2.51 segfaults loading
    warm_batch_above alone, before it logs a reason. Validation refusing it agrees; passing it does not."""
    gone = "[StatusCode.UNAVAILABLE] Stream removed (Socket closed)"
    refused = replace(_outcome("warm_batch_above", ["model_warmup[0].batch_size"], gone), server_died=True)
    assert unexpected([refused]) == []
    assert "kills Triton  warm_batch_above" in report([refused])
    passed = replace(_outcome("warm_batch_above", [], gone), server_died=True)
    assert unexpected([passed])[0].startswith("warm_batch_above: validation passes a model that killed tritonserver")


@pytest.mark.timeout(300)
def test_sample_agrees_with_tritonserver(server: TritonServer) -> None:
    outcomes = run(sample(), server)
    assert not unexpected(outcomes), report(outcomes)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_case_agrees_with_tritonserver(server: TritonServer) -> None:
    outcomes = run(all_cases(), server)
    assert not unexpected(outcomes), report(outcomes)
    assert "content false accepts: 0;" in report(outcomes)
