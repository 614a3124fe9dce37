"""Python models whose config their own `auto_complete_config` completes at load (issue 57, item 1),
before their code runs: what offline validation accepts with a warning, what it refuses (each measured
against tritonserver 2.51: tests/differential/cases_autocomplete.py asks the real server), a publish that
writes the stamped config.pbtxt such a model lacks, the host check of a tritonserver that does not
complete configs, and the registry's record of what Triton completed. The daemon serving them:
tests/test_autocomplete_e2e.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.steps import stamp_digest
from controlplane.errors import HostCapabilityError
from controlplane.snapshot import ContentStore
from controlplane.store.registry import Registry
from controlplane.triton.capabilities import Capabilities, check
from controlplane.triton.client import DIGEST_PARAMETER
from controlplane.validation import completions
from controlplane.validation.autocomplete import CHECKED_AFTER_LOAD, FIELD, read_code
from controlplane.validation.modelconfig import validate_model_dir, validate_paths

CORPUS = Path(__file__).parent / "corpus_autocomplete"
FIVE = ("auto_complete", "bls_simple", "multi_file", "batch_auto_complete", "nobatch_auto_complete")
EXECUTE = '''
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                                                                 .as_numpy())]) for r in requests]
'''
DECLARE = '''        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [3]})
        config.set_max_batch_size(8)
'''


def model_py(body: str | None = DECLARE, head: str = "class TritonPythonModel:\n") -> str:
    method = "" if body is None else \
        f"    @staticmethod\n    def auto_complete_config(config):\n{body}        return config\n"
    return "import triton_python_backend_utils as pb_utils\n\n\n" + head + method + EXECUTE


def write(tmp_path: Path, name: str, code: str, config: str | None = None) -> Path:
    model = tmp_path / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(code)
    if config is not None:
        (model / "config.pbtxt").write_text(config)
    return model


def lines(path: Path) -> tuple[bool, list[str], list[str]]:
    result = validate_model_dir(path)
    return result.ok, [p.line() for p in result.errors], [p.line() for p in result.warnings]


# --- accepted with a warning -----------------------------------------------------------------------


@pytest.mark.parametrize("name", FIVE)
def test_the_corpus_models_are_accepted_with_the_warning_that_the_load_completes_them(name: str) -> None:
    ok, errors, warnings = lines(CORPUS / name)
    assert ok, errors
    assert warnings == [f"{name}/1/model.py: {FIELD}: {CHECKED_AFTER_LOAD} (no config.pbtxt)"]


def test_tritonctl_validate_accepts_the_corpus_with_the_warning() -> None:
    result = CliRunner().invoke(cli, ["validate", str(CORPUS)])
    assert result.exit_code == 0, result.output
    assert result.output.count(CHECKED_AFTER_LOAD) == 6  # a repository of models without config.pbtxt
    document = json.loads(CliRunner().invoke(cli, ["validate", str(CORPUS), "--json"]).stdout)
    assert {d["model"] for d in document} == {*FIVE, "add_sub_int32"}
    assert all(d["ok"] and [p["severity"] for p in d["problems"]] == ["warning"] for d in document)


def test_a_partial_config_the_method_completes_is_accepted_and_says_what_is_left_to_the_load(tmp_path: Path) -> None:
    ok, errors, warnings = lines(write(tmp_path, "m", model_py(), 'backend: "python"\n'))
    assert ok and warnings == [f"m/1/model.py: {FIELD}: {CHECKED_AFTER_LOAD} (config.pbtxt declares no input or "
                               "output)"]
    full = 'backend: "python"\nmax_batch_size: 8\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    ok, errors, warnings = lines(write(tmp_path, "n", model_py(), full))
    assert ok and "it may add to config.pbtxt's inputs, outputs and max_batch_size" in warnings[0]


def test_a_method_that_adds_only_what_the_config_lacks_is_not_held_to_its_literals(tmp_path: Path) -> None:
    """bls_simple's shape: add_input under `if name not in declared`; a config that declares the tensor
    otherwise loads (Triton never calls add_input for it)."""
    code = (CORPUS / "bls_simple" / "1" / "model.py").read_text()
    config = 'backend: "python"\ninput [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 2, 8 ] } ]\n'
    ok, errors, _ = lines(write(tmp_path, "bls", code, config))
    assert ok, errors


def test_a_class_that_may_inherit_the_method_is_taken_as_completing(tmp_path: Path) -> None:
    base = "class Base:\n    pass\n\n\nclass TritonPythonModel(Base):\n"
    ok, errors, warnings = lines(write(tmp_path, "m", model_py(None, base)))
    assert ok and "(no config.pbtxt; 1/model.py does not define it: TritonPythonModel may inherit it)" in warnings[0]
    assert read_code("from impl import TritonPythonModel\n").defines is None


def test_smoke_json_may_name_tensors_only_the_completed_config_has(tmp_path: Path) -> None:
    model = write(tmp_path, "m", model_py())
    (model / "smoke.json").write_text(json.dumps({"requests": [
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}],
         "outputs": [{"name": "y", "data": [[1, 2, 3]]}]}]}))
    ok, errors, _ = lines(model)
    assert ok, errors


# --- refused before the load ------------------------------------------------------------------------


def test_no_config_and_no_method_is_refused(tmp_path: Path) -> None:
    """Triton 2.51 loads it with no inputs and no outputs (measured): a stricter rule."""
    ok, errors, _ = lines(write(tmp_path, "m", model_py(None)))
    assert not ok and errors == ["m: config.pbtxt: missing, and 1/model.py defines no auto_complete_config: Triton "
                                 "loads the model with no inputs and no outputs, so every request with a tensor fails"]
    ok, errors, _ = lines(write(tmp_path, "n", model_py(None), 'backend: "python"\n'))
    assert not ok and errors[0].startswith("n/config.pbtxt: input: none, and no output: 1/model.py defines no "
                                           "auto_complete_config to add them")


@pytest.mark.parametrize(("config", "expected"), [
    ('backend: "python"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
     'm/config.pbtxt: input[0].dims: [ 4 ], but 1/model.py\'s auto_complete_config adds "x" with dims [ 3 ]: Triton '
     "refuses the load"),
    ('backend: "python"\noutput [ { name: "y" data_type: TYPE_INT32 dims: [ 3 ] } ]\n',
     'm/config.pbtxt: output[0].data_type: TYPE_INT32, but 1/model.py\'s auto_complete_config adds "y" as TYPE_FP32: '
     "Triton refuses the load"),
    ('backend: "python"\nmax_batch_size: 16\n',
     "m/config.pbtxt: max_batch_size: 16, above the 8 that 1/model.py's auto_complete_config sets: Triton refuses "
     "the load"),
])
def test_a_config_that_conflicts_with_what_the_method_always_sets_is_refused(tmp_path: Path, config: str,
                                                                             expected: str) -> None:
    ok, errors, _ = lines(write(tmp_path, "m", model_py(), config))
    assert not ok and errors == [expected]


@pytest.mark.parametrize(("body", "why"), [
    (DECLARE + "        raise RuntimeError('boom')\n", "`raise RuntimeError('boom')` always raises"),
    (DECLARE + "        undefined_variable\n", "name 'undefined_variable' is not defined (NameError)"),
    (DECLARE.replace("[3]})\n        config.add_output", "[3], 'shape': [3]})\n        config.add_output"),
     "add_input of input \"x\" has shape: only data_type, dims, name, optional are taken"),
    (DECLARE.replace('"TYPE_FP32", "dims": [3]})\n        config.add_output', '"FP32", "dims": [3]})\n'
                     "        config.add_output"),
     "add_input of input \"x\" has data_type 'FP32': not a Triton data type (e.g. TYPE_FP32)"),
])
def test_a_method_that_always_fails_is_refused(tmp_path: Path, body: str, why: str) -> None:
    ok, errors, _ = lines(write(tmp_path, "m", model_py(body)))
    assert not ok and errors == [f"m/1/model.py: {FIELD}: {why}: Triton refuses the load"]


def test_a_method_that_returns_no_model_config_is_refused(tmp_path: Path) -> None:
    code = model_py().replace("        return config\n", "        return None\n")
    assert lines(write(tmp_path, "m", code))[1] == [
        f"m/1/model.py: {FIELD}: `return None` returns no ModelConfig: Triton refuses the load"]
    code = model_py().replace("        return config\n", "")
    assert "it has no return statement" in lines(write(tmp_path, "n", code))[1][0]


# --- ensembles over a step completed at load ---------------------------------------------------------


def test_an_ensemble_over_a_step_completed_at_load_waits_for_the_load_with_a_warning(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(CORPUS / "add_sub_int32", repo / "add_sub_int32")
    ensemble = repo / "pipe"
    (ensemble / "1").mkdir(parents=True)
    (ensemble / "config.pbtxt").write_text(
        'name: "pipe"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "A" data_type: TYPE_INT32 dims: [ 1, 16 ] },\n'
        '        { name: "B" data_type: TYPE_INT32 dims: [ 1, 16 ] } ]\n'
        'output [ { name: "S" data_type: TYPE_INT32 dims: [ 1, 16 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "add_sub_int32" model_version: -1\n'
        '  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }\n'
        '  output_map { key: "OUTPUT0" value: "S" } } ] }\n')
    [pipe] = [r for r in validate_paths([ensemble]) if r.model == "pipe"]
    assert pipe.ok, [p.line() for p in pipe.problems]
    assert [p.line() for p in pipe.warnings] == [
        'pipe/config.pbtxt: ensemble_scheduling.step[0].model_name: step model "add_sub_int32" completes its config '
        "at load (auto_complete_config): its inputs and outputs are checked against this ensemble once it has loaded"]


# --- publish, the host check, the record ------------------------------------------------------------


def test_a_model_without_config_pbtxt_is_published_with_a_stamped_one(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "store")
    serving = ServingRepository(tmp_path / "serving", tmp_path / "published")
    snapshot = store.capture(CORPUS / "auto_complete", "auto_complete")
    assert "config.pbtxt" not in {e.path for e in snapshot.entries}
    tree = serving.publish(snapshot, store, stamp_digest(snapshot.digest))
    text = (tree / "config.pbtxt").read_text()
    assert DIGEST_PARAMETER in text and snapshot.digest in text and "input" not in text  # the stamp, no more


def test_a_tritonserver_that_does_not_complete_configs_is_refused_before_the_load(tmp_path: Path) -> None:
    model = write(tmp_path, "m", model_py())
    config = validate_model_dir(model).config
    off = Capabilities("127.0.0.1:1", frozenset({"python"}), 0, host_files=True, auto_complete=False)
    with pytest.raises(HostCapabilityError, match=r"^config\.pbtxt: missing or without inputs and outputs: completed "
                       r"only by the model's auto_complete_config, and the tritonserver at 127\.0\.0\.1:1 runs with "
                       r"--disable-auto-complete-config \(triton_auto_complete = false\)$"):
        check(config, off, model)
    for completes in (True, None):  # it does, or an external server that cannot be asked (its load says)
        check(config, Capabilities("127.0.0.1:1", frozenset({"python"}), 0, auto_complete=completes), model)
    complete = write(tmp_path, "c", model_py(), 'backend: "python"\nmax_batch_size: 8\n'
                     'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
                     'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n')
    check(validate_model_dir(complete).config, off, complete)  # a complete config loads without completion


class _Served:
    def __init__(self, config: dict[str, object]) -> None:
        self.config = config

    def served_config(self, model: str) -> dict[str, object]:
        return self.config


def test_the_completed_config_is_recorded_for_a_content_that_completes_and_no_other(registry: Registry) -> None:
    problems = [{"file": "m/1/model.py", "field": FIELD, "message": CHECKED_AFTER_LOAD, "severity": "warning"}]
    for model, digest, found in (("m", "a" * 64, problems), ("plain", "b" * 64, [])):
        registry.record_snapshot(model, digest, "[]", config={"name": model, "backend": "python"}, versions=[1],
                                 served_versions=[1], valid=True, problems=found, total_bytes=1)
    served = {"name": "m", "backend": "python", "max_batch_size": 8, "input": [{"name": "x"}],
              "parameters": {DIGEST_PARAMETER: {"string_value": "a" * 64}}}
    assert completions.completed_config(registry, "m", "a" * 64) is None
    assert completions.record(registry, _Served(served), "m", "a" * 64)
    assert completions.completed_config(registry, "m", "a" * 64) == {
        "name": "m", "backend": "python", "max_batch_size": 8, "input": [{"name": "x"}]}  # the stamp left out
    assert not completions.record(registry, _Served(served), "plain", "b" * 64)
    assert set(registry.completed_configs()) == {("m", "a" * 64)}
