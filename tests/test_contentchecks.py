"""`validate` runs the checks the daemon runs before Triton (the same function): every .py compiles,
smoke.json parses and names the config's tensors with its data types; problems name source paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from cli.main import cli
from controlplane.validation.modelconfig import validate_model_dir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"


def linear(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EXAMPLES / "linear", tmp_path / "linear"))


def test_syntax_error_is_named_by_file_and_line(tmp_path: Path) -> None:
    model = linear(tmp_path)
    lines = (model / "1" / "model.py").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "responses = []")
    lines[at] = lines[at].replace("responses = []", "responses = = []")
    (model / "1" / "model.py").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["validate", str(model)])
    assert result.exit_code == 1
    assert f"error linear/1/model.py:{at + 1}: invalid syntax" in result.output.splitlines()


def test_smoke_datatype_and_tensor_names_are_checked(tmp_path: Path) -> None:
    model = linear(tmp_path)
    smoke = json.loads((model / "smoke.json").read_text())
    smoke["requests"][0]["inputs"][0]["datatype"] = "FP33"
    (model / "smoke.json").write_text(json.dumps(smoke))
    lines = [p.line() for p in validate_model_dir(model).errors]
    assert len(lines) == 1 and lines[0].startswith("linear/smoke.json: requests[0].inputs[0].datatype: unknown "
                                                   "datatype 'FP33'"), lines
    smoke["requests"][0]["inputs"][0]["datatype"] = "FP32"
    smoke["requests"][0]["inputs"][0]["name"] = "nope"
    (model / "smoke.json").write_text(json.dumps(smoke))
    lines = [p.line() for p in validate_model_dir(model).errors]
    assert lines and lines[0].startswith("linear/smoke.json: requests[0].inputs: 'nope' is not an input"), lines


def test_a_snapshot_tree_is_named_by_the_model_not_the_store(tmp_path: Path) -> None:
    tree = Path(shutil.copytree(EXAMPLES / "linear", tmp_path / ("eb24d1a8" * 8 + "-ea8e8b0f")))
    (tree / "1" / "model.py").write_text("def f(:\n")
    (problem,) = validate_model_dir(tree, name="linear").errors
    assert problem.line() == "linear/1/model.py:1: invalid syntax"


def test_every_example_still_validates() -> None:
    result = CliRunner().invoke(cli, ["validate", *[str(p) for p in sorted(EXAMPLES.iterdir()) if p.is_dir()]])
    assert result.exit_code == 0, result.output
