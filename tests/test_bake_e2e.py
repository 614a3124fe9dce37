"""Bake (issue 38, docs/bake.md) against the real daemon and tritonserver, clients sending requests throughout.

One daemon with `--bake 4s` (min 20 requests, failure limit 0.01), one model per test:
- a version that raises in `execute` on about a fifth of its inputs (what Triton counts as a failure)
  but passes its smoke test is rolled back within the bake with nobody acting (outcome `rolled_back`,
  cause `analysis`, not quarantined), and no request fails after the rollback finished;
- a good version passes its bake;
- a version nobody sends requests to ends `inconclusive` and keeps serving;
- `load --bake 1h` bakes one deploy, `promote` ends it `passed`;
- a model's own `tritonctl.bake_s` parameter overrides the daemon's;
- a change set with one failing member rolls back as a set (its members bake together), and an ensemble
  with its steps (a renamed tensor) rolls back through its staged switch, the old pipeline answering;
- a version whose memory footprint grew more than `bake_warn_load_ratio` (2) is warned about: one audit line,
  a mark in `versions`.
A daemon of its own: a bake in progress resumes after a restart, with its window.
And with `bake_max_latency_ratio = 2` (a daemon of its own): a version 50 ms slower per request is rolled
back by the latency limit, on the p99s Triton's metrics report (a launched tritonserver exports them).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests import jsonschemas
from tests.harness import DaemonProcess, api_get, gen_config, python_model, wait_for

BAKE_S = "4"
# Generation GEN answers GEN; with FAILING, inputs above 0.8 raise in execute (about 20 % of uniform inputs).
PRELUDE = """
import time

GEN = {gen}
FAILING = {failing}
DELAY_S = {delay_s}

def answer(x):
    if DELAY_S:
        time.sleep(DELAY_S)
    if FAILING and float(x.flat[0]) > 0.8:
        raise ValueError("this version fails on inputs above 0.8")
    return np.full_like(x, GEN, dtype=np.float32)
"""


def write_model(repo: Path, name: str, gen: int, *, failing: bool = False, delay_s: float = 0.0,
                ballast_mb: int = 0) -> None:
    """A python model answering its generation (`delay_s` late, holding `ballast_mb` of memory once loaded);
    its smoke test (input 0) passes either way."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(gen_config(name, gen))
    init = f"self.ballast = np.ones({ballast_mb} * 262144, dtype=np.float32)" if ballast_mb else "pass"
    (repo / name / "1" / "model.py").write_text(
        python_model("answer(x)", init=init, prelude=PRELUDE.format(gen=gen, failing=failing, delay_s=delay_s)))
    smoke = {"requests": [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
                           "outputs": [{"name": "gen", "data": [gen]}]}]}
    (repo / name / "smoke.json").write_text(json.dumps(smoke))


@contextmanager
def clients(url: str, model: str, threads: int = 2) -> Iterator[dict[str, Any]]:
    """Clients sending uniform random inputs in a closed loop; each result with the time it came back."""
    seen: dict[str, Any] = {"ok": [], "failed": []}  # (monotonic time, generation or error)
    stop = threading.Event()
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        client = grpcclient.InferenceServerClient(url)
        try:
            while not stop.is_set():
                x = grpcclient.InferInput("x", [1, 1], "FP32")
                x.set_data_from_numpy(np.array([[rng.random()]], dtype=np.float32))
                try:
                    gen = float(client.infer(model, [x]).as_numpy("gen")[0][0])
                    with lock:
                        seen["ok"].append((time.monotonic(), gen))
                except Exception as exc:  # noqa: BLE001 - counted and reported by the test
                    with lock:
                        seen["failed"].append((time.monotonic(), str(exc)))
                time.sleep(0.005)
        finally:
            client.close()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    try:
        yield seen
    finally:
        stop.set()
        for w in workers:
            w.join(15)


def _bake_daemon(tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("bake")
    repo = base / "repo"
    repo.mkdir()
    proc = DaemonProcess(repo, base / "state", extra_args=["--bake", f"{BAKE_S}s", *extra],
                         env={"TRITONCTL_BAKE_MIN_REQUESTS": "20", "TRITONCTL_BAKE_MAX_FAILURE_RATIO": "0.01"}).start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """Through the gateway (the default with --launch-triton)."""
    yield from _bake_daemon(tmp_path_factory)


@pytest.fixture(scope="module")
def in_place_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """--no-gateway: Triton reloads in place; a set goes back through the change set's staged plan."""
    yield from _bake_daemon(tmp_path_factory, "--no-gateway")


def serving(daemon: DaemonProcess, name: str, gen_digest: str | None = None) -> str | None:
    """The digest `name` serves once it serves something other than `gen_digest` (None: anything)."""
    row = daemon.model_status(name)
    if row.get("state") == "serving" and row.get("digest") and row["digest"] != gen_digest:
        return str(row["digest"])
    return None


def bake_of(daemon: DaemonProcess, name: str) -> dict[str, Any]:
    return dict(daemon.model_status(name).get("bake") or {})


def first_version_baked(daemon: DaemonProcess, name: str) -> str:
    """Write generation 1 of `name`, wait until it serves and its own bake (no requests) ended."""
    write_model(daemon.repository, name, 1)
    d1 = str(wait_for(lambda: serving(daemon, name), 90, 0.3, f"{name} gen 1 serving"))
    wait_for(lambda: bake_of(daemon, name).get("state") == "inconclusive", 30, 0.3, f"{name} gen 1's bake ended")
    return d1


@pytest.mark.triton
def test_a_version_failing_a_fifth_of_requests_is_rolled_back_by_its_bake(daemon: DaemonProcess) -> None:
    d1 = first_version_baked(daemon, "fails")
    with clients(daemon.triton_url(), "fails") as seen:
        wait_for(lambda: len(seen["ok"]) >= 20, 30, 0.1, "gen 1 answering")
        write_model(daemon.repository, "fails", 2, failing=True)
        # the bad version serves (its smoke test passes), then its bake fails it: nobody acts
        d2 = str(wait_for(lambda: bake_of(daemon, "fails").get("digest", d1) != d1
                          and bake_of(daemon, "fails")["digest"], 90, 0.2, "gen 2 baking"))
        wait_for(lambda: bake_of(daemon, "fails").get("state") == "failed"
                 and daemon.model_status("fails")["digest"] == d1, 60, 0.1, "the bake's rollback to gen 1")
        rolled_back = time.monotonic()
        time.sleep(2.0)  # clients keep sending to the restored version
    jsonschemas.assert_valid("status", daemon.status())
    bake = bake_of(daemon, "fails")
    assert bake["digest"] == d2 and bake["failures"] > 0 and bake["failure_ratio"] > 0.01, bake
    assert bake["reason"].startswith("failure ratio ") and "> 0.01 over " in bake["reason"], bake
    assert bake["requests"] >= 20, bake
    # within the bake: it started at most BAKE_S ago when it ended
    started, ended = bake["started"], daemon.audit("--model", "fails", "--action", "bake")[0]
    assert ended["outcome"] == "failed" and ended["digest"] == d2 and ended["duration_ms"] < float(BAKE_S) * 1000, \
        (started, ended)
    late = [f for f in seen["failed"] if f[0] > rolled_back]
    assert not late, late[:3]
    assert seen["failed"], "the bad version failed no request: the test proved nothing"
    assert any(gen == 2.0 for _, gen in seen["ok"]) and seen["ok"][-1][1] == 1.0
    rollback = daemon.audit("--model", "fails", "--action", "rollback")[0]
    assert (rollback["outcome"], rollback["actor"]) == ("rolled_back", "tritonctl:bake"), rollback
    assert "failure ratio" in rollback["message"], rollback
    # not quarantined: held (not redeployed by the watcher), and `load --digest` may try it again
    versions = {v["digest"]: v for v in daemon.json("versions", "fails")}
    assert versions[d2]["quarantined"] is False, versions[d2]
    row = daemon.model_status("fails")
    assert row["sync"] == "held" and "rolled back by tritonctl:bake" in row["sync_reason"], row


@pytest.mark.triton
def test_a_good_version_passes_its_bake(daemon: DaemonProcess) -> None:
    d1 = first_version_baked(daemon, "good")
    with clients(daemon.triton_url(), "good") as seen:
        write_model(daemon.repository, "good", 2)
        d2 = str(wait_for(lambda: serving(daemon, "good", d1), 90, 0.2, "gen 2 serving"))
        assert "baking" in daemon.model_status("good")["sync_reason"]
        jsonschemas.assert_valid("status", daemon.status())  # a bake in progress
        wait_for(lambda: bake_of(daemon, "good").get("state") == "passed", 30, 0.2, "gen 2's bake passed")
    bake = bake_of(daemon, "good")
    assert bake["digest"] == d2 and bake["failures"] == 0 and bake["requests"] >= 20, bake
    assert bake["latency_ms"] > 0 and bake["reason"].startswith("passed: failure ratio 0.00"), bake
    assert daemon.model_status("good")["digest"] == d2
    assert not seen["failed"], seen["failed"][:3]
    assert daemon.audit("--model", "good", "--action", "bake")[0]["outcome"] == "ok"


@pytest.mark.triton
def test_a_version_without_requests_ends_inconclusive_and_keeps_serving(daemon: DaemonProcess) -> None:
    d1 = first_version_baked(daemon, "quiet")
    bake = bake_of(daemon, "quiet")
    assert (bake["digest"], bake["requests"]) == (d1, 0), bake
    assert bake["reason"] == "inconclusive: 0 requests < bake_min_requests 20; kept", bake
    assert serving(daemon, "quiet") == d1
    assert daemon.audit("--model", "quiet", "--action", "bake")[0]["outcome"] == "inconclusive"


@pytest.mark.triton
def test_load_bake_bakes_one_deploy_and_promote_ends_it(daemon: DaemonProcess) -> None:
    d1 = first_version_baked(daemon, "promoted")
    assert daemon.run("policy", "promoted", "manual").exit_code == 0
    write_model(daemon.repository, "promoted", 2)
    loaded = daemon.run("load", "promoted", "--bake", "1h")
    assert loaded.exit_code == 0, loaded.output
    bake = bake_of(daemon, "promoted")
    assert bake["state"] == "baking" and bake["digest"] != d1, bake
    assert "s left" in daemon.model_status("promoted")["sync_reason"]
    # a baking model serves the newest content: converged, so /v1/ready keeps its pod in the Service
    # (the watcher may still be settling the edit `load` already took: pending a moment, then synced)
    for path in ("/v1/ready", "/v1/models/promoted/ready"):
        wait_for(lambda path=path: api_get(daemon, path)[0] == 200, 15, 0.2, f"{path} 200 during the bake")
    assert bake_of(daemon, "promoted")["state"] == "baking"
    promoted = daemon.run("promote", "promoted")
    assert promoted.exit_code == 0 and "passed" in promoted.output, promoted.output
    assert bake_of(daemon, "promoted")["state"] == "passed"
    again = daemon.run("promote", "promoted")
    assert again.exit_code == 2 and "has no bake in progress" in again.output, again.output
    bad = daemon.run("load", "promoted", "--bake", "soon")
    assert bad.exit_code == 2 and "--bake: 'soon' is not a duration" in bad.output, bad.output
    # `rollback` during a bake rolls back as always; the bake ends with it
    write_model(daemon.repository, "promoted", 3)
    assert daemon.run("load", "promoted", "--bake", "1h").exit_code == 0
    d3 = bake_of(daemon, "promoted")["digest"]
    rolled = daemon.run("rollback", "promoted")
    assert rolled.exit_code == 0, rolled.output
    bake = bake_of(daemon, "promoted")
    assert (bake["digest"], bake["state"]) == (d3, "failed") and bake["reason"].startswith("ended by a rollback"), bake
    assert daemon.model_status("promoted")["digest"] != d3


@pytest.mark.triton
def test_a_models_own_bake_parameter_overrides_the_daemons(daemon: DaemonProcess) -> None:
    write_model(daemon.repository, "own", 1)
    config = daemon.repository / "own" / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "tritonctl.bake_s" value { string_value: "1h" } }\n')
    wait_for(lambda: serving(daemon, "own"), 90, 0.3, "own serving")
    bake = bake_of(daemon, "own")
    started, until = (datetime.fromisoformat(bake[k].replace("Z", "+00:00")) for k in ("started", "until"))
    assert bake["state"] == "baking" and (until - started).total_seconds() == 3600, bake
    assert daemon.run("promote", "own").exit_code == 0


@pytest.mark.triton
def test_a_change_set_with_one_failing_member_rolls_back_as_a_set(daemon: DaemonProcess) -> None:
    names = ("set_a", "set_b")
    for name in names:
        write_model(daemon.repository, name, 1)
    firsts = {name: str(wait_for(lambda name=name: serving(daemon, name), 90, 0.3, f"{name} gen 1")) for name in names}
    for name in names:
        assert daemon.run("policy", name, "manual").exit_code == 0
    write_model(daemon.repository, "set_a", 2)
    write_model(daemon.repository, "set_b", 2, failing=True)  # fails a fifth of its inputs; its smoke test passes
    with clients(daemon.triton_url(), "set_a", threads=1) as seen_a, \
            clients(daemon.triton_url(), "set_b", threads=1) as seen_b:
        loaded = daemon.run("load", "set_a", "set_b")  # one change set
        assert loaded.exit_code == 0, loaded.output
        bakes = {name: bake_of(daemon, name) for name in names}
        assert all(b["state"] == "baking" and b["digest"] != firsts[n] for n, b in bakes.items()), bakes
        assert bakes["set_a"]["until"] == bakes["set_b"]["until"], bakes  # one window for the set
        # set_b crosses the failure limit: the whole set goes back, set_a (which answered well) with it
        wait_for(lambda: all(bake_of(daemon, n).get("state") == "failed"
                             and daemon.model_status(n)["digest"] == firsts[n] for n in names),
                 60, 0.1, "the set's rollback to gen 1")
        rolled_back = time.monotonic()
        wait_for(lambda: all(any(t > rolled_back for t, _ in seen["ok"]) for seen in (seen_a, seen_b)),
                 15, 0.1, "answers after the rollback")
    jsonschemas.assert_valid("status", daemon.status())
    failed, along = bake_of(daemon, "set_b"), bake_of(daemon, "set_a")
    assert failed["reason"].startswith("failure ratio ") and failed["failures"] > 0, failed
    assert along["reason"].startswith("rolled back with its change set: set_b: failure ratio "), along
    assert not [f for f in seen_a["failed"] + seen_b["failed"] if f[0] > rolled_back]
    assert seen_b["failed"] and not seen_a["failed"], (seen_b["failed"][:3], seen_a["failed"][:3])
    for name in names:
        bake = daemon.audit("--model", name, "--action", "bake")[0]
        assert (bake["outcome"], bake["digest"]) == ("failed", bakes[name]["digest"]), bake
        rollback = daemon.audit("--model", name, "--action", "rollback")[0]
        assert (rollback["outcome"], rollback["actor"]) == ("rolled_back", "tritonctl:bake"), rollback
        assert "set_b: failure ratio" in rollback["message"], rollback
        versions = {v["digest"]: v for v in daemon.json("versions", name)}
        assert versions[bakes[name]["digest"]]["quarantined"] is False  # failed its bake: not bad content
    changeset = json.loads(daemon.audit("--action", "changeset")[0]["message"])
    assert changeset["message"].startswith("rolled back as a set"), changeset
    assert {(m["model"], m["digest"], m["previous_digest"]) for m in changeset["members"]} == \
           {(n, firsts[n], bakes[n]["digest"]) for n in names}, changeset


@pytest.mark.triton
@pytest.mark.parametrize("mode", ["gateway", "in_place"])
def test_an_ensemble_and_its_steps_roll_back_as_a_set_with_the_old_pipeline_answering(
        mode: str, request: pytest.FixtureRequest) -> None:
    """The set that needs its staged switch: `pipe` over `a` → `b`, all three edited at once (the tensor
    between them renamed), `b` raising on a fifth of its inputs. Its bake fails, and the set goes back:
    through the gateway in one switch back to the names the bake kept loaded; without it (`--no-gateway`)
    through the change set's own plan (old steps staged under private names, `pipe` pointed at them,
    then the public steps, then `pipe` back). Every member `rolled_back`, the pipeline answering
    throughout the rollback."""
    daemon: DaemonProcess = request.getfixturevalue("daemon" if mode == "gateway" else "in_place_daemon")
    from tests.test_changesets import request_every, write_pipe

    members = ("a", "b", "pipe")
    write_pipe(daemon.repository, "t1", 10)
    try:
        firsts = {m: str(wait_for(lambda m=m: serving(daemon, m), 90, 0.3, f"{m} serving")) for m in members}
    except AssertionError as exc:  # say what the daemon says of the set (a run under load timed out once)
        rows = {m: daemon.model_status(m) for m in members}
        raise AssertionError(f"{exc}\n{rows}\n{daemon.log_tail(6000)}") from None
    wait_for(lambda: all(bake_of(daemon, m).get("state") not in (None, "baking") for m in members), 30, 0.3,
             "the first set's bake ended")
    rng = random.Random(7)

    def pipe(client: grpcclient.InferenceServerClient) -> float:
        x = grpcclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[rng.random()]], dtype=np.float32))
        return float(client.infer("pipe", [x], client_timeout=10).as_numpy("y")[0][0])

    with request_every(daemon.triton_url(), pipe, 0.01) as stats:
        write_pipe(daemon.repository, "t2", 20)
        (daemon.repository / "b" / "1" / "model.py").write_text(python_model(
            "check(x) * 20", src="t2", dst="y",
            prelude="\ndef check(x):\n    if float(x.flat[0]) > 1.8:\n        raise ValueError('fails above 1.8')\n"
                    "    return x.astype(np.float32)\n"))
        wait_for(lambda: bake_of(daemon, "pipe").get("digest") not in (None, firsts["pipe"]), 90, 0.2, "the set baking")
        baked = {m: bake_of(daemon, m)["digest"] for m in members}
        wait_for(lambda: all(daemon.model_status(m)["digest"] == firsts[m] for m in members)
                 and all(bake_of(daemon, m).get("state") == "failed" for m in members), 60, 0.2, "the set rolled back")
        failed_at_rollback = stats["failed"]
        answered = stats["ok"]
        wait_for(lambda: stats["ok"] > answered + 20, 15, 0.1, "answers after the rollback")
    assert stats["failed"] == failed_at_rollback, stats["errors"]  # none after the rollback finished
    assert failed_at_rollback > 0 and stats["answers"][-1] < 20, stats  # gen 10 again: (x + 1) * 10, not * 20
    assert any(answer >= 20 for answer in stats["answers"])  # the new pipeline did answer before its bake failed
    for member in members:
        rollback = daemon.audit("--model", member, "--action", "rollback")[0]
        assert (rollback["outcome"], rollback["actor"], rollback["digest"]) == \
               ("rolled_back", "tritonctl:bake", firsts[member]), rollback
        assert daemon.audit("--model", member, "--action", "bake")[0]["digest"] == baked[member]
    changeset = json.loads(daemon.audit("--action", "changeset")[0]["message"])
    assert changeset["message"].startswith("rolled back as a set in one switch of the gateway" if mode == "gateway"
                                           else "rolled back as a set (deployed a, b, pipe with the old pipeline"), \
        changeset


@pytest.mark.triton
def test_a_version_whose_footprint_grew_is_warned_about_in_the_audit_and_versions(daemon: DaemonProcess) -> None:
    write_model(daemon.repository, "heavy", 1)
    d1 = str(wait_for(lambda: serving(daemon, "heavy"), 90, 0.3, "heavy gen 1 serving"))
    write_model(daemon.repository, "heavy", 2, ballast_mb=150)  # its stub holds about 150 MB more (measured)
    warned = wait_for(lambda: daemon.audit("--model", "heavy", "--action", "bake", "--outcome", "warning"), 90, 0.3,
                      "the bake's warning line")
    assert len(warned) == 1 and warned[0]["digest"] != d1 and warned[0]["actor"] == "tritonctl:bake", warned
    message = warned[0]["message"]
    assert re.search(r"(^|; )memory \d+ MB, [\d.]+ x the previous digest's \d+ MB", message), message
    assert message.endswith("(bake_warn_load_ratio 2)"), message
    jsonschemas.assert_valid("audit", daemon.audit("--model", "heavy"))
    versions = daemon.json("versions", "heavy")
    jsonschemas.assert_valid("versions", versions)
    marks = {v["digest"]: v["bake_warning"] for v in versions}
    assert marks == {d1: None, warned[0]["digest"]: message}, marks
    shown = daemon.run("versions", "heavy")
    assert shown.exit_code == 0 and "! " in shown.output, shown.output
    wait_for(lambda: bake_of(daemon, "heavy").get("state") == "inconclusive", 30, 0.3, "gen 2's bake ended")
    assert len(daemon.audit("--model", "heavy", "--action", "bake", "--outcome", "warning")) == 1  # one line only


@pytest.mark.triton
def test_a_bake_in_progress_resumes_after_a_daemon_restart(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_model(repo, "kept", 1)
    first = DaemonProcess(repo, tmp_path / "state", extra_args=["--bake", "1h"]).start()
    try:
        wait_for(lambda: bake_of(first, "kept").get("state") == "baking", 90, 0.3, "kept baking")
        before = bake_of(first, "kept")
    finally:
        assert first.stop() == 0, first.log_tail()
    second = DaemonProcess(repo, tmp_path / "state", extra_args=["--bake", "1h"]).start()
    try:
        # the restarted daemon reads the bake back once its start has verified what serves
        after = wait_for(lambda: (b := bake_of(second, "kept")).get("state") and b, 60, 0.3, "the bake read back")
        assert after["state"] == "baking", after
        assert (after["digest"], after["started"], after["until"]) == \
               (before["digest"], before["started"], before["until"]), (before, after)
        assert second.run("promote", "kept").exit_code == 0
    finally:
        assert second.stop() == 0, second.log_tail()
    third = DaemonProcess(repo, tmp_path / "state", extra_args=["--bake", "1h"]).start()
    try:  # the last bake is shown after a restart too, ended
        ended = wait_for(lambda: (b := bake_of(third, "kept")).get("state") and b, 60, 0.3, "the bake read back")
        assert ended["state"] == "passed", ended
    finally:
        assert third.stop() == 0, third.log_tail()


@pytest.mark.triton
def test_a_version_50_ms_slower_is_rolled_back_by_the_latency_limit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    slow = DaemonProcess(repo, tmp_path / "state", extra_args=["--bake", f"{BAKE_S}s"],
                         env={"TRITONCTL_BAKE_MAX_LATENCY_RATIO": "2"}).start()
    try:
        d1 = first_version_baked(slow, "slow")
        with clients(slow.triton_url(), "slow") as seen:
            time.sleep(float(BAKE_S) + 1)  # the previous version's latency over the last bake_s before the switch
            write_model(repo, "slow", 2, delay_s=0.05)
            wait_for(lambda: bake_of(slow, "slow").get("state") == "failed"
                     and slow.model_status("slow")["digest"] == d1, 90, 0.1, "the latency limit's rollback")
        status = slow.status()
        jsonschemas.assert_valid("status", status)  # every field of `bake` filled (tests/test_json_contract.py)
        bake = bake_of(slow, "slow")
        assert all(value is not None for value in bake.values()), bake
        # a launched tritonserver exports latency summaries: the p99s are compared, not the means
        assert bake["latency_stat"] == "p99", bake
        assert bake["latency_ms"] >= 50 and bake["baseline_latency_ms"] < 50, bake  # without the 50 ms sleep
        assert bake["reason"].startswith("latency ratio ") and "> 2 (p99 " in bake["reason"], bake
        assert not seen["failed"], seen["failed"][:3]
        rollback = slow.audit("--model", "slow", "--action", "rollback")[0]
        assert (rollback["outcome"], rollback["actor"]) == ("rolled_back", "tritonctl:bake"), rollback
    finally:
        assert slow.stop() == 0, slow.log_tail()
