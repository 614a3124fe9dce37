"""End to end with an MLflow model registry as the source: the real daemon (`tritonctl daemon
--repository mlflow+http://HOST:PORT`, its launched tritonserver) against a real `mlflow server`
(tests/mlflowserver.py), driven the way a team promotes models: register a version, move the alias.

One server and one daemon for the module; the tests run in order and build on each other's versions:
- a version registered without the alias deploys nothing (status: held, alias champion names no
  version); moving `champion` to it deploys it, and MLflow shows `tritonctl.state=serving` and the
  digest on that version, `status` the alias as a tag;
- a version that fails to load is rolled back (the previous one keeps serving) and tagged in MLflow;
- moving the alias back serves the old digest without downloading it again (the audit says 0 files);
  another alias on the served version is a tag of its digest until it is deleted;
- the `MLmodel` -> flavors.triton layout (NVIDIA's MLflow plugin) serves too; deleting its alias shows
  the model `removed` while it keeps serving; a registered model that is not a Triton model is `invalid`
  with that reason;
- (slow) the MLflow server stopped: serving untouched, `status` says so; started again: the next alias
  move deploys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, answers, gen_config, python_model, triton_client, wait_for
from tests.mlflowserver import MLflowServer, mlflow_server  # noqa: F401 - fixture

# ruff: noqa: F811 - the fixture imported above is a parameter below

MODEL = "mlgen"
FLAVORED = "mlflav"


def gen_files(name: str, gen: int, *, init: str = "pass") -> dict[str, str | bytes]:
    """A Triton model directory answering `gen` (config.pbtxt at the root of the artifacts)."""
    return {"config.pbtxt": gen_config(name, gen),
            "1/model.py": python_model("np.full_like(x, GEN, dtype=np.float32)", init=init, prelude=f"\nGEN = {gen}\n")}


class Setup:
    def __init__(self, server: MLflowServer, base: Path) -> None:
        self.server = server
        self.daemon = DaemonProcess(f"mlflow+{server.url}", base / "state",  # type: ignore[arg-type]
                                    env={"TRITONCTL_LOAD_TIMEOUT_S": "60"}, extra_args=["--poll-interval", "0.2"])
        self.versions: dict[int, str] = {}  # generation -> the MLflow version of MODEL holding it
        self.digests: dict[str, str] = {}  # MLflow version -> the digest it served as

    def row(self, name: str) -> dict[str, Any]:
        return self.daemon.model_status(name)

    def wait_tag(self, name: str, version: str, states: tuple[str, ...]) -> dict[str, str]:
        def tagged() -> Any:
            tags = self.server.version_tags(name, version)
            return tags if tags.get("tritonctl.state") in states else None

        try:
            return dict(wait_for(tagged, 60, 0.2, f"{name} version {version} tagged {states}"))
        except AssertionError as exc:
            tags = self.server.version_tags(name, version)
            raise AssertionError(f"{exc}: {tags}\n{self.daemon.log_tail()}") from None


@pytest.fixture(scope="module")
def setup(mlflow_server: MLflowServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    s = Setup(mlflow_server, tmp_path_factory.mktemp("mlflowe2e"))
    s.daemon.start(wait=False)  # both start at once: the daemon polls until MLflow answers
    mlflow_server.wait_up()
    s.daemon.wait_ready()
    yield s
    assert s.daemon.stop() == 0, s.daemon.log_tail()


@pytest.fixture(scope="module")
def client(setup: Setup) -> Iterator[grpcclient.InferenceServerClient]:
    with triton_client(setup.daemon) as c:
        yield c


def serves(setup: Setup, client: grpcclient.InferenceServerClient, name: str, gen: int) -> None:
    try:
        wait_for(lambda: answers(client, name, float(gen)), 90, 0.2, f"{name} answering {gen}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{setup.row(name)}\n{setup.daemon.log_tail()}") from None


def test_alias_move_deploys_and_writes_back(setup: Setup, client: grpcclient.InferenceServerClient) -> None:
    server = setup.server
    v1 = setup.versions[1] = server.register(MODEL, gen_files(MODEL, 1))
    # registered, alias not moved: the daemon sees it, deploys nothing and shows it held, with why
    row = wait_for(lambda: (r := setup.row(MODEL)).get("sync") == "held" and r, 30, 0.2, f"{MODEL} held")
    assert row["sync_reason"] == "alias champion names no version" and row["state"] == "new", row
    assert row["digest"] is None, row
    server.set_alias(MODEL, "champion", v1)
    serves(setup, client, MODEL, 1)
    row = wait_for(lambda: (r := setup.row(MODEL))["state"] == "serving" and r, 30, 0.2, f"{MODEL} serving")
    assert "champion" in wait_for(lambda: setup.row(MODEL)["tags"] or None, 30, 0.2, "the alias as a tag")
    tags = setup.wait_tag(MODEL, v1, ("serving",))
    assert tags["tritonctl.digest"] == row["digest"]
    setup.digests[v1] = row["digest"]
    capture = [e for e in setup.daemon.audit("--model", MODEL) if e["action"] == "mlflow"]
    assert capture and f"version {v1} (run " in capture[0]["message"], capture


def test_version_that_fails_to_load_is_rolled_back_and_tagged(setup: Setup,
                                                              client: grpcclient.InferenceServerClient) -> None:
    server = setup.server
    bad = server.register(MODEL, gen_files(MODEL, 2, init="raise RuntimeError('broken on purpose')"))
    server.set_alias(MODEL, "champion", bad)
    tags = setup.wait_tag(MODEL, bad, ("rolled_back", "quarantined", "failed"))
    assert tags["tritonctl.digest"] != setup.digests[setup.versions[1]]
    assert answers(client, MODEL, 1.0)  # the previous version never stopped serving
    assert setup.row(MODEL)["digest"] == setup.digests[setup.versions[1]]


def test_alias_back_serves_the_old_digest_without_downloading(setup: Setup,
                                                              client: grpcclient.InferenceServerClient) -> None:
    server = setup.server
    v3 = setup.versions[3] = server.register(MODEL, gen_files(MODEL, 3))
    server.set_alias(MODEL, "champion", v3)
    serves(setup, client, MODEL, 3)
    setup.wait_tag(MODEL, v3, ("serving",))
    v1 = setup.versions[1]
    server.set_alias(MODEL, "champion", v1)
    serves(setup, client, MODEL, 1)
    wait_for(lambda: setup.row(MODEL)["digest"] == setup.digests[v1], 30, 0.2, f"{MODEL} at v1's digest")
    setup.wait_tag(MODEL, v1, ("serving",))
    assert "tritonctl.state" not in wait_for(  # v3 no longer serves: its state tag is gone, its digest stays
        lambda: (t := server.version_tags(MODEL, v3)).get("tritonctl.state") != "serving" and t, 30, 0.2)
    newest = next(e for e in setup.daemon.audit("--model", MODEL) if e["action"] == "mlflow")
    assert f"version {v1} " in newest["message"] and ": 0 of 2 files downloaded" in newest["message"], newest
    # every alias on the served version is a tag of what serves, and stops being one when it goes
    server.set_alias(MODEL, "staging", v1)
    wait_for(lambda: sorted(setup.row(MODEL)["tags"]) == ["champion", "staging"], 30, 0.2, "staging as a tag")
    server.delete_alias(MODEL, "staging")
    wait_for(lambda: setup.row(MODEL)["tags"] == ["champion"], 30, 0.2, "staging no longer a tag")


def test_triton_flavor_layout_serves_and_a_deleted_alias_shows_removed(
        setup: Setup, client: grpcclient.InferenceServerClient) -> None:
    server = setup.server
    files = {f"mymodel/{rel}": text for rel, text in gen_files(FLAVORED, 7).items()}
    files["MLmodel"] = "flavors:\n  triton:\n    data: mymodel\n"  # what NVIDIA's plugin logs
    version = server.register(FLAVORED, files, artifact_path="triton")
    server.set_alias(FLAVORED, "champion", version)
    serves(setup, client, FLAVORED, 7)
    setup.wait_tag(FLAVORED, version, ("serving",))
    server.delete_alias(FLAVORED, "champion")
    wait_for(lambda: setup.row(FLAVORED).get("sync") == "removed", 30, 0.2, f"{FLAVORED} removed")
    assert answers(client, FLAVORED, 7.0)  # what serves keeps serving, as for a deleted directory
    # a registered model that is not a Triton model: listed, and refused with its one reason
    server.set_alias("mlsklearn", "champion", server.register("mlsklearn", {"MLmodel": "flavors:\n  sklearn: {}\n",
                                                                          "model.pkl": b"\x80\x04."}))
    row = wait_for(lambda: (r := setup.row("mlsklearn")).get("sync") == "invalid" and r, 30, 0.2, "mlsklearn refused")
    assert "not a Triton model" in row["sync_reason"], row


@pytest.mark.slow
def test_mlflow_stopped_and_started_again(setup: Setup, client: grpcclient.InferenceServerClient) -> None:
    """Its own model, so that it holds in the slow tier alone (the tests above do not run there)."""
    server, name = setup.server, "mlrestart"
    server.set_alias(name, "champion", server.register(name, gen_files(name, 1)))
    serves(setup, client, name, 1)
    server.stop()
    try:
        wait_for(lambda: "unreachable" in (setup.daemon.status()["watch"].get("reason") or ""), 30, 0.2,
                 "status saying MLflow is unreachable")
        assert answers(client, name, 1.0)  # what serves keeps serving while MLflow is away
    finally:
        server.start()
    server.set_alias(name, "champion", server.register(name, gen_files(name, 2)))
    serves(setup, client, name, 2)
    status = json.loads(setup.daemon.cli("status", "--json").stdout)
    assert "unreachable" not in (status["watch"].get("reason") or "")
