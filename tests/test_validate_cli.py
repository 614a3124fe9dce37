"""`tritonctl validate`: every corpus case fails with its one-line error and exit 1; the --json shape
is a stable contract; warnings alone exit 0; the installed entry point behaves the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from tests.conftest import EXAMPLES, ROOT
from tests.corpus_gen import GENERATORS, write_model
from tests.test_modelconfig import CORPUS, GENERATED, OFFLINE, RUNTIME, _ids

TRITONCTL = Path(sys.executable).parent / "tritonctl"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def assert_error_line(stdout: str, case: dict) -> None:
    want = case["offline"]
    lines = [line for line in stdout.splitlines() if line.startswith("error ")]
    where = f": {want['field']}: " if want["field"] else ": "  # file-level problems (file:line: message)
    assert any(where in line and want["contains"] in line for line in lines), (case, stdout)


@pytest.mark.parametrize("case", OFFLINE, ids=_ids(OFFLINE))
def test_stored_case_exits_1_with_its_error(case: dict) -> None:
    code, out, _ = run(str(CORPUS / case["case"] / case["model"]))
    assert code == 1
    assert_error_line(out, case)
    assert "Traceback" not in out


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", GENERATED, ids=_ids(GENERATED))
def test_generated_case_exits_1_with_its_error(case: dict, tmp_path: Path) -> None:
    code, out, _ = run(os.fspath(GENERATORS[case["case"]](tmp_path)))
    assert code == 1
    assert_error_line(out, case)


def test_runtime_cases_pass_offline() -> None:
    code, out, _ = run(*(str(CORPUS / c["case"] / c["model"]) for c in RUNTIME))
    assert code == 0, out
    assert out.count("ok linear (serving version 1)") == len(RUNTIME)
    assert f"{len(RUNTIME)} models checked: {len(RUNTIME)} ok, 0 invalid" in out


def test_json_shape(tmp_path: Path) -> None:
    good = write_model(tmp_path / "good", versions=(1, 2), extra="version_policy: { all { } }")
    bad = write_model(tmp_path / "bad", name="other")
    code, out, _ = run(str(good), str(bad), "--json")
    assert code == 1
    document = json.loads(out)
    assert [list(item) for item in document] == [
        ["model", "path", "ok", "versions", "served_versions", "problems"]
    ] * 2
    assert document[0] == {"model": "good", "path": str(good), "ok": True, "versions": [1, 2],
                           "served_versions": [1, 2], "problems": []}
    assert document[1]["ok"] is False
    assert document[1]["problems"] == [{
        "file": "bad/config.pbtxt", "field": "name",
        "message": '"other" does not match the directory name "bad"', "severity": "error",
    }]


def test_json_of_an_unreadable_name_is_still_json(tmp_path: Path) -> None:
    model = GENERATORS["gen_non_utf8_model_name"](tmp_path)
    code, out, _ = run(os.fspath(model), "--json")
    assert code == 1
    [item] = json.loads(out)
    assert item["model"] == "m\\xff" and item["problems"][0]["field"] == "directory"


def test_warnings_alone_exit_0(tmp_path: Path) -> None:
    model = write_model(tmp_path / "linear")
    (model / "v2").mkdir()
    code, out, _ = run(str(model))
    assert code == 0
    assert out.splitlines() == [
        "ok linear (serving version 1)",
        "warning linear: v2: not a numeric version directory: Triton ignores it",
        "1 model checked: 1 ok, 0 invalid (0 errors, 1 warning)",
    ]


def test_repository_path_validates_each_model(tmp_path: Path) -> None:
    write_model(tmp_path / "repo" / "a")
    write_model(tmp_path / "repo" / "b", versions=())
    code, out, _ = run(str(tmp_path / "repo"))
    assert code == 1
    assert "ok a (serving version 1)" in out
    assert "error b: versions: no numeric version directory" in out
    assert "2 models checked: 1 ok, 1 invalid (1 error, 0 warnings)" in out


def test_missing_path_is_a_usage_error(tmp_path: Path) -> None:
    code, out, err = run(str(tmp_path / "nope"))
    assert code == 2
    assert err.strip() == f"error: {tmp_path / 'nope'}: no such file or directory"
    assert "Traceback" not in out + err


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(cli, ["validate", "--help"])
    assert result.exit_code == 0
    assert "tritonctl validate examples/model_repository/*" in result.output


def test_installed_entry_point(tmp_path: Path) -> None:
    case = next(c for c in OFFLINE if c["case"] == "name_mismatch")
    proc = subprocess.run(
        [str(TRITONCTL), "validate", str(CORPUS / case["case"] / case["model"])],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stderr
    assert 'error linear/config.pbtxt: name: "lineer" does not match the directory name "linear"' in proc.stdout
    assert "\x1b[" not in proc.stdout  # no colour when stdout is not a terminal
    assert proc.stderr == ""


def test_example_repository_is_valid() -> None:
    entries = sorted(EXAMPLES.glob("*")) if EXAMPLES.is_dir() else []
    if not any(p.is_dir() for p in entries):
        pytest.skip("examples/model_repository has no models yet")
    code, out, _ = run(*map(str, entries))  # as the shell expands examples/model_repository/*
    assert code == 0, out
    assert "error " not in out


# --- ensembles across the repository ----------------------------------------------------------------

PIPE = ('name: "pipe"\nplatform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "step" model_version: -1 '
        'input_map { key: "KEY" value: "x" } output_map { key: "y" value: "y" } } ] }\n')


def _pipe(repo: Path, key: str = "x") -> Path:
    pipe = repo / "pipe"
    (pipe / "1").mkdir(parents=True)
    (pipe / "config.pbtxt").write_text(PIPE.replace("KEY", key))
    return pipe


def test_ensemble_is_checked_against_its_sibling_step_model(tmp_path: Path) -> None:
    write_model(tmp_path / "step")
    pipe = _pipe(tmp_path)
    assert run(str(pipe))[0] == 0  # the step model found next to it, in the same repository
    assert run(str(tmp_path))[0] == 0
    (pipe / "config.pbtxt").write_text(PIPE.replace("KEY", "nosuch"))
    code, out, _ = run(str(pipe))
    assert code == 1
    assert ('error pipe/config.pbtxt: ensemble_scheduling.step[0].input_map: key "nosuch" is not an input '
            'of "step" (inputs: x)') in out.splitlines()


def test_ensemble_step_models_given_on_the_command_line(tmp_path: Path) -> None:
    pipe = _pipe(tmp_path / "a")
    step = write_model(tmp_path / "b" / "step")
    code, out, _ = run(str(pipe))
    assert code == 1 and 'ensemble_scheduling.step[0].model_name: step model "step" is not in the repository' in out
    code, out, _ = run(str(pipe), str(step))
    assert code == 0, out
    config = step / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 4", "max_batch_size: 2"))
    code, out, _ = run(str(pipe), str(step))
    assert code == 1 and "max_batch_size: 4 is above step model \"step\"'s max_batch_size 2" in out


def test_ensemble_prefers_the_step_model_of_its_own_repository(tmp_path: Path) -> None:
    pipe = _pipe(tmp_path / "repo")
    own = write_model(tmp_path / "repo" / "step")
    config = own / "config.pbtxt"
    config.write_text(config.read_text().replace("TYPE_FP32 dims: [ 3 ]", "TYPE_INT32 dims: [ 3 ]"))
    other = write_model(tmp_path / "elsewhere" / "step")  # fits, but Triton would load repo/step
    code, out, _ = run(str(pipe), str(other))
    assert code == 1
    assert ('error pipe/config.pbtxt: ensemble_scheduling.step[0].input_map: ensemble tensor "x": data type '
            'TYPE_FP32 from ensemble "pipe" but TYPE_INT32 from model "step"') in out.splitlines()
