"""Offline validation: the corpus of broken models, version policies, stamping, and the file-system
rules (no reads beyond config.pbtxt, no symlink followed out, no hang on FIFOs)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from controlplane.errors import ModelConfigError
from controlplane.validation.modelconfig import (
    Problem,
    ValidationResult,
    parse_config_text,
    served_versions,
    stamp_parameter,
    validate_model_dir,
    validate_paths,
)
from controlplane.validation.smokefile import load_smoke_file
from tests.corpus_gen import GENERATORS, MODEL_PY, config_text, write_model

CORPUS = Path(__file__).resolve().parent / "corpus"
CASES = json.loads((CORPUS / "cases.json").read_text())
STORED = [c for c in CASES if not c.get("generated")]
GENERATED = [c for c in CASES if c.get("generated")]
OFFLINE = [c for c in STORED if c["offline"]]
RUNTIME = [c for c in STORED if not c["offline"]]


def _ids(cases: list[dict]) -> list[str]:
    return [c["case"] for c in cases]


def assert_expected(result: ValidationResult, case: dict) -> None:
    want = case["offline"]
    lines = [p.line() for p in result.problems]
    hits = [p for p in result.errors if p.field == want["field"] and want["contains"] in p.message]
    assert hits, f"{case['case']}: expected error {want} among {lines}"
    assert not result.ok and result.first_error is not None


# --- the corpus itself ------------------------------------------------------------------------------


def test_corpus_index_matches_the_directories() -> None:
    names = [c["case"] for c in CASES]
    assert len(names) == len(set(names))
    assert len(OFFLINE) >= 55
    on_disk = {p.name for p in CORPUS.iterdir() if p.is_dir()}
    assert on_disk == {c["case"] for c in STORED}
    assert {c["case"] for c in GENERATED} == set(GENERATORS)
    for case in CASES:
        assert set(case) >= {"case", "model", "offline", "runtime", "note"}
        assert case["runtime"] in (None, "load", "smoke")
        assert (case["offline"] is None) == (case["runtime"] is not None)
    for case in STORED:
        assert (CORPUS / case["case"] / case["model"]).is_dir(), case["case"]


@pytest.mark.parametrize("case", OFFLINE, ids=_ids(OFFLINE))
def test_stored_case_fails_offline(case: dict) -> None:
    # validate_paths: an ensemble's step models are looked up among its siblings (the same repository)
    [result] = validate_paths([CORPUS / case["case"] / case["model"]])
    assert_expected(result, case)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("case", GENERATED, ids=_ids(GENERATED))
def test_generated_case_fails_offline(case: dict, tmp_path: Path) -> None:
    model_dir = GENERATORS[case["case"]](tmp_path)
    started = time.monotonic()
    result = validate_model_dir(model_dir)
    assert time.monotonic() - started < 5  # FIFOs, sockets and an 8 GiB file cannot slow it down
    assert result.model == case["model"]
    assert_expected(result, case)
    assert all("\n" not in p.line() for p in result.problems)


@pytest.mark.parametrize("case", RUNTIME, ids=_ids(RUNTIME))
def test_runtime_case_is_clean_offline_and_has_smoke_requests(case: dict) -> None:
    model_dir = CORPUS / case["case"] / case["model"]
    result = validate_model_dir(model_dir)
    assert result.ok and result.problems == [], [p.line() for p in result.problems]
    assert result.served_versions == [1]
    assert load_smoke_file(model_dir / "smoke.json")


# --- parsing -----------------------------------------------------------------------------------------


def test_parse_error_names_file_line_and_column() -> None:
    text = 'name: "linear"\nbackend: "python"\nmax_batch_size: "x"\n'
    with pytest.raises(ModelConfigError) as err:
        parse_config_text(text, "linear/config.pbtxt")
    assert str(err.value) == "linear/config.pbtxt:3:17: Couldn't parse integer: \"x\""


def test_parse_gives_tritons_schema() -> None:
    config = parse_config_text(config_text(), "config.pbtxt")
    assert isinstance(config, mc.ModelConfig)
    assert config.max_batch_size == 4 and config.input[0].dims == [3]


def test_result_carries_config_versions_and_served_versions(tmp_path: Path) -> None:
    policy = "version_policy: { latest { num_versions: 2 } }"
    model = write_model(tmp_path / "linear", versions=(1, 2, 3), extra=policy)
    result = validate_model_dir(model)
    assert result.ok and result.problems == []
    assert result.versions == [1, 2, 3] and result.served_versions == [2, 3]
    assert result.config is not None and result.config["name"] == "linear"
    assert result.config["input"][0]["name"] == "x"
    json.dumps(result.config)


# --- version_policy (TRITON_NOTES "version_policy (measured with versions 1, 2, 3)") ---------------

POLICIES = [
    ("", [3]),
    ("version_policy: { latest { num_versions: 2 } }", [2, 3]),
    ("version_policy: { specific { versions: [ 1, 3 ] } }", [1, 3]),
    ("version_policy: { all { } }", [1, 2, 3]),
    ("version_policy: { specific { versions: [ 1, 5 ] } }", [1]),
    ("version_policy: { specific { versions: [ 5 ] } }", []),
    ("version_policy: { latest { num_versions: 5 } }", [1, 2, 3]),
    ("version_policy: { latest { } }", []),
    ("version_policy: { }", [1, 2, 3]),  # Triton's VersionsToLoad: neither latest nor specific → all
]


@pytest.mark.parametrize(("policy", "served"), POLICIES)
def test_served_versions_matches_triton(policy: str, served: list[int]) -> None:
    config = parse_config_text(config_text(extra=policy), "config.pbtxt")
    assert served_versions(config, [3, 1, 2]) == served
    as_dict = validate_config_dict(config)
    assert served_versions(as_dict, [1, 2, 3]) == served


def validate_config_dict(config: mc.ModelConfig) -> dict:
    from google.protobuf import json_format

    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def test_served_versions_without_config_is_latest_one() -> None:
    assert served_versions(None, [1, 7, 3]) == [7]
    assert served_versions(None, []) == []


def test_partly_absent_specific_is_a_warning(tmp_path: Path) -> None:
    policy = "version_policy: { specific { versions: [ 1, 5 ] } }"
    model = write_model(tmp_path / "linear", versions=(1, 2), extra=policy)
    result = validate_model_dir(model)
    assert result.ok and result.served_versions == [1]
    [warning] = result.warnings
    assert warning.field == "version_policy.specific.versions" and "[ 5 ] absent" in warning.message


def test_a_models_own_bake_settings_are_checked_as_the_daemons_are(tmp_path: Path) -> None:
    """`tritonctl.bake_s` and the limits in config.pbtxt (docs/bake.md): Triton ignores them, tritonctl would
    bake on the daemon's limits; a bad one is an error naming the parameter, a good one passes."""
    good = ('parameters { key: "tritonctl.bake_s" value { string_value: "5m" } }\n'
            'parameters { key: "tritonctl.bake_max_failure_ratio" value { string_value: "0.05" } }')
    assert validate_model_dir(write_model(tmp_path / "good", extra=good)).ok
    bad = 'parameters { key: "tritonctl.bake_max_failure_ratio" value { string_value: "5%" } }'
    result = validate_model_dir(write_model(tmp_path / "bad", extra=bad))
    [error] = result.errors
    assert (error.field, error.message) == ('parameters["tritonctl.bake_max_failure_ratio"]',
                                            '"5%": expected a number'), error


# --- stamp_parameter ------------------------------------------------------------------------------


def test_stamp_parameter_appends_and_round_trips() -> None:
    original = "# my comment stays\n" + config_text()
    stamped = stamp_parameter(original, "tritonctl.digest", "ab" * 32)
    assert stamped.startswith(original)
    config = parse_config_text(stamped, "config.pbtxt")
    assert config.parameters["tritonctl.digest"].string_value == "ab" * 32
    expected = parse_config_text(original, "config.pbtxt")
    expected.parameters["tritonctl.digest"].string_value = "ab" * 32
    assert config == expected


def test_stamp_parameter_replaces_an_existing_key() -> None:
    original = config_text(extra='parameters { key: "k" value { string_value: "old" } }\n'
                                  'parameters { key: "other" value { string_value: "kept" } }\n')
    stamped = stamp_parameter(stamp_parameter(original, "k", "new"), "k", "newer")
    config = parse_config_text(stamped, "config.pbtxt")
    assert config.parameters["k"].string_value == "newer"
    assert config.parameters["other"].string_value == "kept"
    assert len(config.parameters) == 2 and config.input[0].name == "x"


@pytest.mark.parametrize("value", ['with "quotes" and \\ backslash', "line\nbreak", "\u00fcnicode \u6a21", ""])
def test_stamp_parameter_escapes_values(value: str) -> None:
    text = config_text().rstrip("\n")  # no trailing newline, and a comment at the very end
    stamped = stamp_parameter(text + "  # last line", "key", value)
    assert parse_config_text(stamped, "config.pbtxt").parameters["key"].string_value == value


def test_stamp_parameter_refuses_unparsable_text() -> None:
    with pytest.raises(ModelConfigError):
        stamp_parameter("name: ", "k", "v")


# --- problems and results ---------------------------------------------------------------------------


def test_problem_line_is_one_line() -> None:
    problem = Problem("m/config.pbtxt", "name", 'bad\nname "x\ty"', "error")
    assert problem.line() == 'm/config.pbtxt: name: bad\\nname "x\\ty"'


def test_warnings_alone_leave_the_model_ok(tmp_path: Path) -> None:
    model = write_model(tmp_path / "linear", extra="instance_group [ { kind: KIND_GPU } ]")
    (model / "v2").mkdir()
    (model / "01").mkdir()
    result = validate_model_dir(model)
    assert result.ok and result.first_error is None
    assert {p.field for p in result.warnings} == {"v2", "01", "instance_group[1].kind"}


def test_missing_backend_inferred_from_model_py_is_a_warning(tmp_path: Path) -> None:
    model = write_model(tmp_path / "linear")
    text = (model / "config.pbtxt").read_text().replace('backend: "python"\n', "")
    (model / "config.pbtxt").write_text(text)
    (model / "2").mkdir()  # python rules apply to the inferred backend too: 2/ (served) has no model.py
    result = validate_model_dir(model)
    assert [p.field for p in result.warnings] == ["backend"]
    assert 'infers "python" from 1/model.py' in result.warnings[0].message
    assert [p.field for p in result.errors] == ["2/model.py"]


def test_unserved_version_without_model_py_is_a_warning(tmp_path: Path) -> None:
    model = write_model(tmp_path / "linear", versions=(2,))
    (model / "1").mkdir()
    result = validate_model_dir(model)
    assert result.ok and [p.field for p in result.warnings] == ["1/model.py"]


def test_explicit_name_checks_a_directory_named_otherwise(tmp_path: Path) -> None:
    tree = write_model(tmp_path / ("ab" * 32), name="linear")  # a snapshot tree, named by digest
    result = validate_model_dir(tree, name="linear")
    assert result.ok and result.model == "linear"
    wrong = validate_model_dir(tree, name="other")
    assert wrong.first_error is not None and wrong.first_error.file == "other/config.pbtxt"


def test_symlinks_inside_the_model_are_fine(tmp_path: Path) -> None:
    real = write_model(tmp_path / "store" / "linear", versions=(1,))
    (real / "2").symlink_to("1")
    (real / "1" / "weights.bin").write_bytes(b"0")
    (real / "1" / "alias.bin").symlink_to("weights.bin")
    link = tmp_path / "repo" / "linear"
    link.parent.mkdir()
    link.symlink_to(real)  # the model directory itself may be a symlink (a swap-in publish)
    result = validate_model_dir(link)
    assert result.ok and result.problems == [] and result.versions == [1, 2]


def test_only_config_pbtxt_and_the_served_model_py_are_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.py is read for its auto_complete_config (controlplane/validation/autocomplete.py); nothing else."""
    model = write_model(tmp_path / "linear")
    with open(model / "1" / "weights.bin", "wb") as fh:
        fh.truncate(8 << 30)  # sparse: reading it would take long
    opened: list[str] = []
    real_open = os.open

    def spy(path: str, *args: object, **kwargs: object) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    result = validate_model_dir(model)
    assert result.ok
    assert [Path(p).name for p in opened] == ["config.pbtxt", "model.py"]


def test_bad_paths_become_problems_not_exceptions(tmp_path: Path) -> None:
    assert validate_model_dir(tmp_path / "absent").first_error.message == "does not exist"  # type: ignore[union-attr]
    (tmp_path / "file").write_text("x")
    assert validate_model_dir(tmp_path / "file").first_error.message == "is not a directory"  # type: ignore[union-attr]


def test_validate_paths_expands_a_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo / "a")
    write_model(repo / "b", name="wrong")
    (repo / ".git").mkdir()
    (repo / "README.md").write_text("not a model\n")
    results = validate_paths([repo])
    assert [r.model for r in results] == ["a", "b"]
    assert [r.ok for r in results] == [True, False]
    [from_file] = validate_paths([repo / "a" / "config.pbtxt"])
    assert from_file.model == "a" and from_file.ok
    [readme] = validate_paths([repo / "README.md"])
    assert readme.ok and [p.severity for p in readme.problems] == ["warning"]


def test_models_written_by_corpus_gen_are_valid(tmp_path: Path) -> None:
    assert validate_model_dir(write_model(tmp_path / "linear")).problems == []
    assert "execute" in MODEL_PY
    text_format.Parse(config_text(), mc.ModelConfig())
