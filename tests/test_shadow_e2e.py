"""The shadow (issue 55 item 4; docs/bake.md "Shadow") against the real daemon, its gateway and tritonserver, with
clients sending requests through the gateway throughout.

One daemon with the safe defaults (canary steps and a bake) and a config file that shadows every deploy for a
few seconds first (`shadow_s`); each model sets its own short steps and bake (config parameters):

- a version that disagrees on a fifth of its inputs is rolled back by its shadow with 0 failed client
  requests, before any step: the clients only ever got the previous version's answers, the canary's history
  is empty and no `canary` step line was audited; `status --json` `shadow` names the first disagreement
  (output, index, both values) and keeps no inputs (`shadow_keep_inputs` false: none in status, the audit
  or the state directory);
- a correct version passes its shadow and goes on through its steps;
- a version that raises on some inputs: its errors are counted, it is rolled back, no client request fails;
- with `shadow_keep_inputs = true` (the config file changed, SIGHUP) the first disagreement's inputs are shown;
- `load --shadow 1h` shadows one deploy; `promote` moves it on to its first step, `abort` ends it.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests import jsonschemas
from tests.harness import DaemonProcess, gen_config, python_model, wait_for
from tests.test_canary_e2e import GATEWAY, clients, free_port, rollback_to, serving

pytestmark = pytest.mark.skipif(not GATEWAY, reason="the gateway process (controlplane.gateway, issue 54) is not "
                                                    "here: a shadow needs it to copy and compare the traffic")

SHADOW_S = 8
# GEN answers GEN; OVER: inputs above 0.8 get GEN + 1 (a fifth of uniform inputs disagree); FAILING: inputs in
# (0.6, 0.8) raise
PRELUDE = """
GEN = {gen}
OVER = {over}
FAILING = {failing}

def answer(x):
    v = float(x.flat[0])
    if FAILING and 0.6 < v < 0.8:
        raise ValueError("this version fails on inputs between 0.6 and 0.8")
    return np.full_like(x, GEN + 1 if OVER and v > 0.8 else GEN, dtype=np.float32)
# {note}
"""


def write_model(repo: Path, name: str, gen: int, *, over: bool = False, failing: bool = False, note: str = "",
                steps: str = "[50, 100]", bake_s: str = "3s") -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    params = "".join(f'parameters {{ key: "tritonctl.{key}" value {{ string_value: "{value}" }} }}\n'
                     for key, value in (("canary_steps", steps), ("bake_s", bake_s)))
    (repo / name / "config.pbtxt").write_text(gen_config(name, gen) + params)
    prelude = PRELUDE.format(gen=gen, over=over, failing=failing, note=note)
    (repo / name / "1" / "model.py").write_text(python_model("answer(x)", prelude=prelude))
    smoke = {"requests": [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
                           "outputs": [{"name": "gen", "data": [gen]}]}]}
    (repo / name / "smoke.json").write_text(json.dumps(smoke))


def config_text(keep_inputs: bool) -> str:
    return f'shadow_s = "{SHADOW_S}s"\nshadow_keep_inputs = {"true" if keep_inputs else "false"}\n'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("shadow")
    repo = base / "repo"
    repo.mkdir()
    config = base / "tritonctl.toml"
    config.write_text(config_text(False))
    proc = DaemonProcess(repo, base / "state", switch_at_once=False, extra_args=["--metrics-port", str(free_port())],
                         env={"TRITONCTL_CONFIG": str(config)})
    proc.config = config  # type: ignore[attr-defined]
    proc.start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def client_urls(daemon: DaemonProcess) -> tuple[str, str]:
    """(gRPC, HTTP) HOST:PORT of the daemon's gateway, from its record (`<state>/gateway/gateway.json`): with
    free ports asked for, `status --json`'s Triton URLs are tritonserver's own loopback ports, not the gateway's."""
    ports = json.loads((daemon.state_dir / "gateway" / "gateway.json").read_text())["ports"]
    return f"127.0.0.1:{ports['grpc']}", f"127.0.0.1:{ports['http']}"


def first_version(daemon: DaemonProcess, name: str) -> str:
    write_model(daemon.repository, name, 1)
    return str(wait_for(lambda: serving(daemon, name), 90, 0.3, f"{name} gen 1 serving"))


def shadow_of(daemon: DaemonProcess, name: str) -> dict[str, Any]:
    return dict(daemon.model_status(name).get("shadow") or {})


def messages(daemon: DaemonProcess, name: str, action: str) -> list[str]:
    return [e["message"] for e in daemon.audit("--model", name, "--action", action, "--since", "1h")]


def test_a_version_that_disagrees_is_rolled_back_before_any_client_sees_it(daemon: DaemonProcess) -> None:
    d1 = first_version(daemon, "sd")
    grpc, _ = client_urls(daemon)
    with clients(grpc, "sd") as seen:
        wait_for(lambda: len(seen["ok"]) > 50, 60, 0.2, "clients served by gen 1")
        write_model(daemon.repository, "sd", 1, over=True)
        rollback = wait_for(lambda: rollback_to(daemon, "sd", d1), 90, 0.2, "the shadow rolled back")
        time.sleep(2)
    assert seen["failed"] == [], seen["failed"][:3]
    assert {gen for _, gen, _ in seen["ok"]} == {1.0}  # clients only ever got the serving version's answers
    assert rollback["actor"] == "tritonctl:bake" and "shadow agreement" in rollback["message"]
    row = daemon.model_status("sd")
    assert row["digest"] == d1 and row["bake"]["state"] == "failed"
    assert (row["canary"]["state"], row["canary"]["weight"], row["canary"]["history"]) == ("rolled_back", 0, [])
    shadow = row["shadow"]
    assert shadow["state"] == "rolled_back" and shadow["pairs"] >= 20 and shadow["agreement"] < 1
    first = shadow["disagreements"][0]
    assert (first["kind"], first["output"], first["index"], first["serving"], first["shadow"]) == \
        ("value", "gen", 0, 1.0, 2.0)
    assert all("inputs" not in d for d in shadow["disagreements"])  # shadow_keep_inputs = false
    d2 = next(e["digest"] for e in daemon.audit("--model", "sd", "--action", "shadow", "--since", "1h"))
    assert d2 != d1 and not [m for m in messages(daemon, "sd", "canary")]  # no step line, ever
    kept = next(b for b in json.loads((daemon.state_dir / "bakes.json").read_text()) if b["model"] == "sd")
    assert kept["canary"]["shadow"]["figures"]["disagreements"] and \
        all("inputs" not in d for d in kept["canary"]["shadow"]["figures"]["disagreements"])  # nor on disk
    jsonschemas.assert_valid("status", daemon.status())


def test_a_correct_version_passes_the_shadow_and_goes_on_to_its_steps(daemon: DaemonProcess) -> None:
    d1 = first_version(daemon, "sc")
    grpc, _ = client_urls(daemon)
    with clients(grpc, "sc") as seen:
        wait_for(lambda: len(seen["ok"]) > 50, 60, 0.2, "clients served by gen 1")
        write_model(daemon.repository, "sc", 1, note="the same answers, other content")
        d2 = str(wait_for(lambda: serving(daemon, "sc", d1), 90, 0.1, "gen 2 deployed (its shadow)"))
        assert daemon.model_status("sc")["canary"]["state"] == "shadow"
        wait_for(lambda: daemon.model_status("sc")["bake"]["state"] == "passed", 90, 0.3, "the shadow and every step")
    assert seen["failed"] == []
    row = daemon.model_status("sc")
    assert row["digest"] == d2 and row["shadow"]["state"] == "passed" and row["shadow"]["agreement"] == 1.0
    assert row["shadow"]["pairs"] >= 20 and row["shadow"]["disagreements"] == []
    assert [h["weight"] for h in row["canary"]["history"]] == [50, 100] and row["canary"]["state"] == "done"
    assert any(m.startswith("step 1/2: 50%") for m in messages(daemon, "sc", "canary"))


def test_a_version_that_errs_on_some_inputs_is_rolled_back_with_no_client_failure(daemon: DaemonProcess) -> None:
    d1 = first_version(daemon, "se")
    grpc, _ = client_urls(daemon)
    with clients(grpc, "se") as seen:
        wait_for(lambda: len(seen["ok"]) > 50, 60, 0.2, "clients served by gen 1")
        write_model(daemon.repository, "se", 1, failing=True)
        rollback = wait_for(lambda: rollback_to(daemon, "se", d1), 90, 0.2, "the shadow rolled back")
        time.sleep(1)
    assert seen["failed"] == []
    assert "shadow errors" in rollback["message"]
    shadow = shadow_of(daemon, "se")
    assert shadow["errors"]["shadow"] >= 1 and shadow["errors"]["serving"] == 0
    first = shadow["disagreements"][0]
    assert first["kind"] == "error" and "between 0.6 and 0.8" in first["shadow"]


def test_with_keep_inputs_the_first_disagreements_inputs_are_shown(daemon: DaemonProcess) -> None:
    d1 = first_version(daemon, "sk")
    daemon.config.write_text(config_text(True))  # type: ignore[attr-defined]
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    time.sleep(2)  # the reload applies from the next deploy
    grpc, _ = client_urls(daemon)
    try:
        with clients(grpc, "sk"):
            write_model(daemon.repository, "sk", 1, over=True)
            wait_for(lambda: rollback_to(daemon, "sk", d1), 90, 0.2, "the shadow rolled back")
    finally:
        daemon.config.write_text(config_text(False))  # type: ignore[attr-defined]
        daemon.proc.send_signal(signal.SIGHUP)
    first = shadow_of(daemon, "sk")["disagreements"][0]
    (kept,) = first["inputs"]
    assert (kept["name"], kept["datatype"], kept["shape"], kept["truncated"]) == ("x", "FP32", [1, 1], False)
    assert kept["data"][0] > 0.8  # the input the versions answered differently


def test_load_shadow_then_promote_moves_on_and_abort_ends_it(daemon: DaemonProcess) -> None:
    d1 = first_version(daemon, "sp")
    assert daemon.run("policy", "sp", "manual").exit_code == 0
    write_model(daemon.repository, "sp", 2, steps="[50, 100]", bake_s="1h")  # answers change: a retrained model
    loaded = daemon.run("load", "sp", "--shadow", "1h")
    assert loaded.exit_code == 0, loaded.output
    d2 = str(daemon.model_status("sp")["digest"])
    assert d2 != d1 and daemon.model_status("sp")["canary"]["state"] == "shadow"
    grpc, _ = client_urls(daemon)
    client = grpcclient.InferenceServerClient(grpc)
    try:
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
        # fewer than bake_min_requests (20): figures to look at, no verdict yet
        assert {float(client.infer("sp", [x]).as_numpy("gen")[0][0]) for _ in range(10)} == {1.0}
        shadow = wait_for(lambda: shadow_of(daemon, "sp") if shadow_of(daemon, "sp").get("pairs", 0) >= 10 else None,
                          30, 0.3, "the pairs counted")
        assert shadow["state"] == "running" and shadow["agreement"] == 0.0  # every answer changed
        promoted = daemon.run("promote", "sp")
        assert promoted.exit_code == 0 and "50%" in promoted.output, promoted.output
        assert daemon.model_status("sp")["shadow"]["state"] == "promoted"
        answers = {float(client.infer("sp", [x]).as_numpy("gen")[0][0]) for _ in range(60)}
        assert answers == {1.0, 2.0}  # the first step: half the requests on the new version
        aborted = daemon.run("abort", "sp")
        assert aborted.exit_code == 0, aborted.output
        assert {float(client.infer("sp", [x]).as_numpy("gen")[0][0]) for _ in range(20)} == {1.0}
    finally:
        client.close()
    assert daemon.model_status("sp")["digest"] == d1
    assert any(m.startswith("promoted by") for m in messages(daemon, "sp", "shadow"))
