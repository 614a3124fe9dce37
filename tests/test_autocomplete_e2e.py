"""Models whose config their own auto_complete_config completes, served by the daemon (issue 57, item 1).

The five corpus models of the issue (tests/corpus_autocomplete: auto_complete, bls_simple, multi_file,
batch_auto_complete, nobatch_auto_complete; written here after Triton's QA shapes), none with a
config.pbtxt, deployed by a real daemon and its launched tritonserver: each serves requests through
tritonclient (bls_simple forwards to another model: no `expected 0 inputs but got 1`); what Triton
completed is recorded with the digest and shown by `versions`, `diff` and `status -o wide`; an ensemble
over such a step is checked against the recorded completed config; a daemon whose tritonserver does not
complete configs refuses such a model before its load, as an environment fault.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests import jsonschemas
from tests.harness import DaemonProcess, wait_for

pytestmark = pytest.mark.triton

CORPUS = Path(__file__).parent / "corpus_autocomplete"
MODELS = ("add_sub_int32", "auto_complete", "batch_auto_complete", "bls_simple", "multi_file", "nobatch_auto_complete")
PIPE = '''name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "A" data_type: {type} dims: [ 1, 16 ] }}, {{ name: "B" data_type: {type} dims: [ 1, 16 ] }} ]
output [ {{ name: "S" data_type: {type} dims: [ 1, 16 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "add_sub_int32" model_version: -1
  input_map {{ key: "INPUT0" value: "A" }} input_map {{ key: "INPUT1" value: "B" }}
  output_map {{ key: "OUTPUT0" value: "S" }} }} ] }}
'''


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _serving(daemon: DaemonProcess, names: tuple[str, ...]) -> bool:
    states = {row["model"]: row["state"] for row in daemon.status()["models"]}
    return all(states.get(name) == "serving" for name in names)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("autocomplete")
    repo = base / "repo"
    shutil.copytree(CORPUS, repo, ignore=shutil.ignore_patterns("README.md"))
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(PIPE.format(name="pipe", type="TYPE_INT32"))
    proc = DaemonProcess(repo, base / "state", settle_s=0.1, auto_complete=True).start()
    try:
        wait_for(lambda: _serving(proc, (*MODELS, "pipe")), 180, 0.5, "every model serving")
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    yield client
    client.close()


def test_the_five_corpus_models_serve_requests(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    a, b = np.array([1, 2, 3, 4], dtype=np.float32), np.array([4, 3, 2, 1], dtype=np.float32)
    for name, shape in (("auto_complete", (4,)), ("nobatch_auto_complete", (4,)), ("batch_auto_complete", (2, 4))):
        x, y = np.broadcast_to(a, shape).copy(), np.broadcast_to(b, shape).copy()
        result = client.infer(name, [_tensor("INPUT0", x, "FP32"), _tensor("INPUT1", y, "FP32")], client_timeout=30)
        assert result.as_numpy("OUTPUT0").tolist() == (x + y).tolist(), name
        assert result.as_numpy("OUTPUT1").tolist() == (x - y).tolist(), name
    values = np.array([1.5, -2.0, 3.0], dtype=np.float32)
    doubled = client.infer("multi_file", [_tensor("INPUT0", values, "FP32")], client_timeout=30).as_numpy("OUTPUT0")
    assert doubled.tolist() == [3.0, -4.0, 6.0]  # its model.py's own modules, imported at completion and at load
    first, second = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, dtype=np.int32)
    result = client.infer("bls_simple", [_tensor("MODEL_NAME", np.array([b"add_sub_int32"], dtype=np.object_), "BYTES"),
                                         _tensor("INPUT0", first, "INT32"), _tensor("INPUT1", second, "INT32")],
                          client_timeout=30)
    assert result.as_numpy("OUTPUT0").tolist() == (first + second).tolist()  # forwarded through a BLS request
    assert result.as_numpy("OUTPUT1").tolist() == (first - second).tolist()
    summed = client.infer("pipe", [_tensor("A", first, "INT32"), _tensor("B", second, "INT32")], client_timeout=30)
    assert summed.as_numpy("S").tolist() == (first + second).tolist()
    validated = daemon.cli("validate", str(CORPUS))
    assert validated.stdout.count("completed by the model at load: inputs/outputs checked after the load") == 6


def test_what_triton_completed_is_recorded_with_the_digest_and_shown(daemon: DaemonProcess,
                                                                     client: grpcclient.InferenceServerClient) -> None:
    versions = daemon.json("versions", "auto_complete")
    jsonschemas.assert_valid("versions", versions)
    [active] = [v for v in versions if v["active"]]
    completed = active["completed_config"]["config"]
    assert [(t["name"], t["data_type"]) for t in completed["input"]] == [("INPUT0", "TYPE_FP32"),
                                                                         ("INPUT1", "TYPE_FP32")]
    assert [t["name"] for t in completed["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert "parameters" not in completed  # the digest stamp is the row's key, not part of what it shows
    assert active["config"] == {"name": "auto_complete", "backend": "python"}  # what the files hold
    status = daemon.status()
    jsonschemas.assert_valid("status", status)
    rows = {row["model"]: row for row in status["models"]}
    assert rows["batch_auto_complete"]["completed_config"]["config"]["max_batch_size"] == 4
    assert "dynamic_batching" in rows["batch_auto_complete"]["completed_config"]["config"]
    assert rows["pipe"]["completed_config"] is None  # an ensemble's config is its own
    wide = daemon.cli("status", "-o", "wide").stdout
    assert ("completed by Triton: INPUT0 FP32[4], INPUT1 FP32[4] -> OUTPUT0 FP32[4], OUTPUT1 FP32[4]; "
            "max_batch_size 0") in wide
    assert "completed by Triton: INPUT0 FP32[4], INPUT1 FP32[4] -> OUTPUT0 FP32[4], OUTPUT1 FP32[4]; " \
           "max_batch_size 4; dynamic batching" in daemon.cli("versions", "batch_auto_complete").stdout
    # verification read the digest back from the config Triton serves: the stamp a publish wrote
    served = client.get_model_config("auto_complete", as_json=True)["config"]
    assert served["parameters"]["tritonctl.digest"]["string_value"] == rows["auto_complete"]["digest"]
    assert "tritonctl.digest" in (daemon.state_dir / "serving" / "auto_complete" / "config.pbtxt").read_text()


def test_an_edit_of_what_the_model_declares_shows_in_diff(daemon: DaemonProcess,
                                                         client: grpcclient.InferenceServerClient) -> None:
    model = daemon.repository / "nobatch_auto_complete" / "1" / "model.py"
    before = daemon.model_status("nobatch_auto_complete")["digest"]
    model.write_text(model.read_text().replace('"dims": [4]', '"dims": [8]'))
    wait_for(lambda: daemon.model_status("nobatch_auto_complete")["digest"] not in (None, before)
             and daemon.model_status("nobatch_auto_complete")["sync"] == "synced", 60, 0.2, "the edit serving")
    after = daemon.model_status("nobatch_auto_complete")["digest"]
    document = daemon.json("diff", "nobatch_auto_complete", before, after)
    jsonschemas.assert_valid("diff", document)
    changed = {line.replace(" ", "") for line in document["completed_config_diff"].splitlines()}
    assert {'-"4"', '+"8"'} <= changed, document["completed_config_diff"]  # the dims its method declares
    plain = daemon.cli("diff", "nobatch_auto_complete", before, after).stdout
    assert "config completed by Triton: changed" in plain
    x = np.ones(8, dtype=np.float32)
    result = client.infer("nobatch_auto_complete", [_tensor("INPUT0", x, "FP32"), _tensor("INPUT1", x, "FP32")],
                          client_timeout=30)
    assert result.as_numpy("OUTPUT0").tolist() == [2.0] * 8


def test_an_ensemble_is_checked_against_the_completed_step_config(daemon: DaemonProcess) -> None:
    """add_sub_int32 declares INT32 tensors only in its auto_complete_config: an FP32 ensemble over it is
    refused from the config Triton completed (recorded at the step's load), before Triton sees it."""
    bad = daemon.repository / ".badpipe"
    (bad / "1").mkdir(parents=True)
    (bad / "config.pbtxt").write_text(PIPE.format(name="badpipe", type="TYPE_FP32"))
    bad.rename(daemon.repository / "badpipe")
    row = wait_for(lambda: (r := daemon.model_status("badpipe")) and r.get("sync") == "invalid" and r, 60, 0.2,
                   "badpipe refused")
    [snap] = daemon.json("versions", "badpipe")
    assert not snap["valid"]
    assert any(p["field"].startswith("ensemble_scheduling.step[0]") and "TYPE_INT32" in p["message"]
               for p in snap["problems"]), snap["problems"]
    assert row["state"] != "serving"


def test_a_tritonserver_that_does_not_complete_configs_refuses_them_before_the_load(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(CORPUS / "auto_complete", repo / "auto_complete")
    proc = DaemonProcess(repo, tmp_path / "state", settle_s=0.1, env={"TRITONCTL_TRITON_AUTO_COMPLETE": "false"})
    proc.start()
    try:
        audit: list[dict[str, Any]] = wait_for(lambda: [e for e in proc.audit("--model", "auto_complete")
                                                        if e["action"] == "deploy"], 90, 0.3, "the deploy's end")
        assert audit[0]["outcome"] == "failed", audit[0]
        assert "runs with --disable-auto-complete-config (triton_auto_complete = false)" in audit[0]["message"]
        snapshots = proc.json("versions", "auto_complete")
        assert snapshots[0]["valid"] and not snapshots[0]["quarantined"]  # the host's fault, not the content's
    finally:
        assert proc.stop() == 0, proc.log_tail()


def test_the_published_config_and_the_recorded_one_survive_a_restart(daemon: DaemonProcess) -> None:
    """The completed configs are rows of the registry: the read verbs answer them without the daemon too."""
    document = json.loads(daemon.cli("versions", "multi_file", "--json", "--db-url",
                                     f"sqlite:///{daemon.state_dir / 'registry.db'}").stdout)
    assert document[0]["completed_config"]["config"]["input"][0]["name"] == "INPUT0"
