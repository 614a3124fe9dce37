"""Ensemble rules across models, without a server: the pure check with a lookup, and the registry
lookup the daemon uses (a step it does not serve is an EnvironmentFault; a map key that does not fit
the step's recorded config is a content problem). The real-server side: tests/test_differential.py
and tests/test_ensemble_daemon.py."""

from __future__ import annotations

import pytest

from controlplane.errors import EnvironmentFault, ModelConfigError
from controlplane.store.records import ServingRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.validation.ensemblemembers import member_problems, require_members
from controlplane.validation.ensembles import StepModel, check_ensemble_graph, check_ensemble_members
from controlplane.validation.modelconfig import parse_config_text
from tests.corpus_gen import config_text

STEP = parse_config_text(config_text("step"), "step/config.pbtxt")  # x FP32 [3] -> y FP32 [1], batch 4


def pipe(key: str = "x", mbs: int = 4, version: int = -1, extra_input: str = "") -> str:
    return ('name: "pipe"\nplatform: "ensemble"\n'
            f'max_batch_size: {mbs}\ninput [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }}{extra_input} ]\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            f'ensemble_scheduling {{ step [ {{ model_name: "step" model_version: {version} '
            f'input_map {{ key: "{key}" value: "x" }} output_map {{ key: "y" value: "y" }} }} ] }}\n')


def members(text: str, served: tuple[int, ...] = (1,)) -> list[str]:
    config = parse_config_text(text, "pipe/config.pbtxt")
    found = check_ensemble_members(config, "pipe", lambda name: StepModel(STEP, served) if name == "step" else None)
    return [f"{f.field}: {f.message}{' [environment]' if f.environment else ''}" for f in found]


def test_member_rules() -> None:
    assert members(pipe()) == []
    assert members(pipe(key="nosuch")) == [
        'ensemble_scheduling.step[0].input_map: key "nosuch" is not an input of "step" (inputs: x)',
        'ensemble_scheduling.step[0].input_map: input "x" of "step" is not mapped to any ensemble tensor']
    assert members(pipe(mbs=8)) == ['max_batch_size: 8 is above step model "step"\'s max_batch_size 4']
    assert members(pipe(version=2), served=(1,)) == [
        'ensemble_scheduling.step[0].model_version: 2: step model "step" serves only version(s) 1 [environment]']
    assert members(pipe().replace('"step"', '"other"')) == [
        'ensemble_scheduling.step[0].model_name: step model "other" is not in the repository [environment]']


def test_graph_rules_need_no_members() -> None:
    config = parse_config_text(pipe(extra_input=', { name: "u" data_type: TYPE_FP32 dims: [ 1 ] }'), "c")
    assert [(f.field, f.message) for f in check_ensemble_graph(config, "pipe")] == [
        ("input", 'ensemble input "u" is not used by any step\'s input_map')]


def record(reg: Registry, model: str, digest: str, text: str):  # type: ignore[no-untyped-def]
    from google.protobuf import json_format

    config = json_format.MessageToDict(parse_config_text(text, "c"), preserving_proto_field_name=True)
    snap, _ = reg.record_snapshot(model, digest, "{}", config=config, versions=[1], served_versions=[1], valid=True,
                                  problems=[], total_bytes=1)
    return snap


def serve(reg: Registry, model: str, digest: str) -> None:
    dep = reg.begin_deployment(model, "deploy", digest, None, "test")
    reg.finish_deployment(dep.id, outcome="ok", error=None, audit=AuditEntry("test", "deploy", model, digest, "ok", ""),
                          serving=ServingRecord(model, digest, [1]), model_state="serving")


def test_daemon_lookup_environment_vs_content(registry: Registry) -> None:
    good, bad = record(registry, "pipe", "a" * 64, pipe()), record(registry, "pipe", "b" * 64, pipe(key="nosuch"))
    # no step model at all: not the ensemble's fault, nothing to record against its content
    assert member_problems(registry, "pipe", good.config) == []
    assert member_problems(registry, "pipe", bad.config) == []
    with pytest.raises(EnvironmentFault, match=r'step model "step" is not served by this daemon; deploy it first'):
        require_members(registry, good)
    # the step recorded but not deployed: content is checked against it, the deploy still waits
    record(registry, "step", "c" * 64, config_text("step"))
    assert member_problems(registry, "pipe", good.config) == []
    assert [p["field"] for p in member_problems(registry, "pipe", bad.config)] == [
        "ensemble_scheduling.step[0].input_map", "ensemble_scheduling.step[0].input_map"]
    with pytest.raises(EnvironmentFault):
        require_members(registry, good)
    serve(registry, "step", "c" * 64)
    require_members(registry, good)
    with pytest.raises(ModelConfigError, match=r'key "nosuch" is not an input of "step"'):
        require_members(registry, bad)
