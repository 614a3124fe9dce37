"""A tritonserver the daemon launches fresh loads the models the registry serves in its own start-up
(`--load-model`, controlplane/startup/preload.py), not one load request each afterwards (issue 26: a
restart onto a fresh server restored 1,000 models in 151 s where Triton's own start-up loads them in about
a second). Against a real tritonserver: the second start (its server stopped with the first daemon, as
after a reboot) restores nothing, every model serves at READY; a model that fails to load there leaves
the others serving and is restored (and fails) as before; with `launch_loads_serving = false` every model
is restored one by one (what the first test would see without the change); a start-up load that hangs
makes the daemon launch the server without preloads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.store.registry import Registry
from tests.harness import DaemonProcess, answers, copy_example, triton_client, wait_for, write_gen_model
from tests.test_metrics import free_port, scrape, value

MODELS = ("linear", "sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")


def serving(daemon: DaemonProcess) -> set[str]:
    return {m["model"] for m in daemon.status()["models"] if m["state"] == "serving"}


def restores(daemon: DaemonProcess, messages: bool = False) -> dict[str, list[Any]]:
    """model -> its restores' outcomes (`messages`: (outcome, message)), oldest first."""
    out: dict[str, list[Any]] = {}
    for event in reversed(daemon.audit("--action", "restore", "--limit", "100")):
        out.setdefault(event["model"], []).append((event["outcome"], event["message"]) if messages
                                                  else event["outcome"])
    return out


def first_start(tmp_path: Path, init: str = "pass", env: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A repository of the examples and `flaky` (initialize() body `init`), every model served once by a
    daemon that then stopped, its tritonserver with it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in MODELS:
        copy_example(name, repo)
    write_gen_model(repo, "flaky", 1, init=init)
    state = tmp_path / "state"
    daemon = DaemonProcess(repo, state, env=env or {}).start()
    try:
        wait_for(lambda: serving(daemon) == {*MODELS, "flaky"}, 120, 0.5, "every model serving")
    finally:
        assert daemon.stop(kill_triton=True) == 0, daemon.log_tail()
    return repo, state


FLAG_INIT = "import os\n        if os.path.exists({flag!r}): raise RuntimeError('flag file present')"


@pytest.mark.triton
def test_a_fresh_tritonserver_loads_what_the_registry_serves_in_its_own_start_up(tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    repo, state = first_start(tmp_path, init=FLAG_INIT.format(flag=str(flag)))
    flag.write_text("")  # from now on `flaky` fails to load, wherever it is loaded
    daemon = DaemonProcess(repo, state).start()  # the control API answers while Triton starts
    try:
        wait_for(lambda: set(MODELS) <= set(restores(daemon)), 120, 0.2, "the reconcile after the launch")
        log = daemon.log_tail(200_000)
        assert "launching tritonserver with the 5 models the registry serves loading in its start-up" in log, log
        assert "tritonserver live" in log and "its start-up loads done (5 of 5 finished" in log, log
        assert serving(daemon) >= set(MODELS)
        with triton_client(daemon) as client:  # Triton serves them, and has not gone down for `flaky`
            for name in MODELS:
                assert client.is_model_ready(name), name
            assert not client.is_model_ready("flaky")
        # the four loaded in Triton's start-up: the reconcile verified them (READY, the recorded digest)
        # and audited each as restored there; `flaky` it restored itself, by a load request that failed
        wait_for(lambda: "flaky" in restores(daemon), 30, 0.5, "the reconcile's restore of flaky")
        done = restores(daemon, messages=True)
        assert set(done) == {*MODELS, "flaky"}, done
        for name in MODELS:
            assert len(done[name]) == 1 and done[name][0][0] == "ok", done
            assert "loaded in tritonserver's start-up" in done[name][0][1], done
        assert done["flaky"][0][0] == "failed" and "start-up" not in done["flaky"][0][1], done
        row = daemon.model_status("flaky")  # owed a restore, with Triton's reason, retried with backoff
        assert "flag file present" in str(row), row
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


@pytest.mark.triton
def test_without_launch_loads_serving_each_model_is_restored_by_its_own_load(tmp_path: Path) -> None:
    env = {"TRITONCTL_LAUNCH_LOADS_SERVING": "false"}
    repo, state = first_start(tmp_path, env=env)
    daemon = DaemonProcess(repo, state, env=env).start()
    try:
        assert "launching tritonserver with the" not in daemon.log_tail(200_000)
        assert serving(daemon) == {*MODELS, "flaky"}
        done = restores(daemon)
        assert set(done) == {*MODELS, "flaky"} and all(o == ["ok"] for o in done.values()), done
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


@pytest.mark.triton
@pytest.mark.slow
def test_a_start_up_load_that_hangs_makes_the_daemon_launch_without_preloads(tmp_path: Path) -> None:
    flag = tmp_path / "hang"
    hang = f"import os, time\n        while os.path.exists({str(flag)!r}): time.sleep(0.2)"
    repo, state = first_start(tmp_path, init=hang)
    flag.write_text("")  # `flaky`'s initialize() now waits for the flag to go
    env = {"TRITONCTL_LOAD_TIMEOUT_S": "6"}
    started = time.monotonic()
    daemon = DaemonProcess(repo, state, env=env).start(wait=False)
    try:
        daemon.wait_ready(120)
        log = daemon.log_tail(200_000)
        assert "none in the last" in log and "launching tritonserver without them" in log, log
        assert serving(daemon) >= set(MODELS)
        # the plain server's restores: each good model by its own load request (the reconcile after the launch)
        wait_for(lambda: set(MODELS) <= set(restores(daemon)), 60, 0.2, "the restores after the launch")
        done = restores(daemon)
        assert set(MODELS) <= set(done) and all(done[m] == ["ok"] for m in MODELS), done
        assert time.monotonic() - started < 100
    finally:
        flag.unlink(missing_ok=True)
        assert daemon.stop() == 0, daemon.log_tail()


def loads(port: int) -> tuple[float, float]:
    """The daemon's load counters: (load requests sent, deploys Triton's start-up loaded)."""
    samples = scrape(port)
    return (value(samples, "tritonctl_triton_loads_total", via="request"),
            value(samples, "tritonctl_triton_loads_total", via="startup"))


def deploys(daemon: DaemonProcess, model: str) -> list[tuple[str, str]]:
    """`model`'s deploys' (outcome, message), newest first."""
    return [(e["outcome"], e["message"]) for e in daemon.audit("--model", model, "--action", "deploy")]


@pytest.mark.triton
@pytest.mark.parametrize("gateway", [True, False], ids=["gateway", "no-gateway"])
def test_a_first_start_deploys_through_tritons_start_up_and_a_load_failing_there_is_a_failed_deploy(
        tmp_path: Path, gateway: bool) -> None:
    """Through the gateway (the default) and in place (`--no-gateway`): the deploys go to Triton's start-up
    either way; what a rollback then loads differs (below)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in MODELS:
        copy_example(name, repo)
    write_gen_model(repo, "flaky", 1)
    write_gen_model(repo, "broken", 1, init="raise RuntimeError('broken at init')")
    write_gen_model(repo, "smoky", 1, smoke_gen=1)
    write_gen_model(repo, "wrong", 1, smoke_gen=7)  # loads in the start-up, fails its smoke request after it
    state, port = tmp_path / "state", free_port()
    args = ["--metrics-port", str(port), *([] if gateway else ["--no-gateway"])]
    daemon = DaemonProcess(repo, state, extra_args=args).start()  # the control API answers while Triton starts
    try:
        wait_for(lambda: serving(daemon) == {*MODELS, "flaky", "smoky"}, 120, 0.2, "every good model serving")
        wait_for(lambda: deploys(daemon, "wrong"), 60, 0.2, "wrong's deploy ended")
        log = daemon.log_tail(200_000)
        assert ("launching tritonserver with the 0 models the registry serves loading in its start-up, "
                "and the 8 deploys of this start") in log, log
        # every deploy went to Triton's start-up (the ensemble with its steps), not one load request each
        assert loads(port) == (0, 7)
        for name in (*MODELS, "flaky", "smoky"):
            assert [o for o, _ in deploys(daemon, name)] == ["ok"], name  # the rows of any deploy
        # verified together after the start-up, a smoke request that fails is a failed deploy all the same
        [(outcome, message)] = deploys(daemon, "wrong")
        assert outcome == "failed" and "smoke" in message, message
        assert daemon.model_status("wrong")["state"] == "failed"
        # failing there is a failed deploy: nothing to roll back to, Triton's reason from its log
        [(outcome, message)] = deploys(daemon, "broken")
        assert outcome == "failed" and "broken at init" in message and "start-up" in message, message
        assert daemon.model_status("broken")["state"] == "failed"
    finally:
        assert daemon.stop(kill_triton=True) == 0, daemon.log_tail()

    write_gen_model(repo, "flaky", 2, init="raise RuntimeError('gen 2 fails')")  # a new content that fails
    write_gen_model(repo, "smoky", 2, smoke_gen=1)  # loads, then answers 2 to a smoke request that wants 1
    daemon = DaemonProcess(repo, state, extra_args=args).start()
    try:
        for name in ("flaky", "smoky"):
            wait_for(lambda name=name: len(deploys(daemon, name)) == 2, 120, 0.2, f"{name}'s second deploy ended")
        [(outcome, message), _first] = deploys(daemon, "flaky")
        assert outcome == "rolled_back" and "gen 2 fails" in message, (message, daemon.log_tail(8000))
        [(outcome, message), _first] = deploys(daemon, "smoky")
        assert outcome == "rolled_back" and "smoke" in message, message
        with triton_client(daemon) as client:
            assert answers(client, "flaky", 1) and answers(client, "smoky", 1)
        requests, startup = loads(port)
        # smoky's gen 2 in the start-up; in place, the rollbacks reload gen 1 into the names gen 2 took (2 load
        # requests); through the gateway gen 1's private names loaded in the start-up beside gen 2's (what
        # the routes the gateway kept reach) and a rollback switches nothing back: no load request
        assert (startup, requests) == (1, 0 if gateway else 2), (requests, startup)
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


@pytest.mark.triton
@pytest.mark.parametrize("gateway", [True, False], ids=["gateway", "no-gateway"])
def test_a_first_start_killed_after_its_wave_is_published_is_recovered_at_the_next(tmp_path: Path,
                                                                                   gateway: bool) -> None:
    """The first start's deploys record each step for the whole wave at once (controlplane/deploy/staged.py):
    a daemon killed right after the wave's `PUBLISHED` (TRITONCTL_FAULT) leaves every deployment open, and
    the next start finishes each one: every model serves, none is left open, each end audited. In place
    (`--no-gateway`) the published tree is the model's own name, loaded and rolled forward; through the
    gateway the route decides (controlplane/deploy/routed.py `recover`): none was switched to the new names,
    so each deploy ends rolled back (`failed`: no previous version) and the deploy the model is owed serves it
    (that deploy may switch first: the recovery then finds the new name routed and READY, rolled forward)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    names = ("k1", "k2", "k3")
    for name in names:
        write_gen_model(repo, name, 1)
    state = tmp_path / "state"
    args = [] if gateway else ["--no-gateway"]
    daemon = DaemonProcess(repo, state, env={"TRITONCTL_FAULT": "after_publish"}, extra_args=args).start(wait=False)
    assert daemon.proc is not None and daemon.proc.wait(90) == 97, daemon.log_tail()
    daemon.env = {}
    daemon.start()
    try:
        wait_for(lambda: serving(daemon) == set(names), 120, 0.2, "every model serving after the restart")
        with triton_client(daemon) as client:
            assert all(answers(client, name, 1) for name in names)
        def ended(name: str) -> bool:  # from the step the wave reached
            outcomes = deploys(daemon, name)
            interrupted = [o for o, m in outcomes if "interrupted at step 'published'" in m]
            if not gateway:
                return interrupted == ["ok"] and any("rolled forward" in m for _, m in outcomes)
            # not switched: rolled back (`failed`), then the deploy it is owed serves it (or, that deploy first,
            # the route reaches the new name READY: rolled forward)
            return len(interrupted) == 1 and interrupted[0] in ("failed", "ok") and outcomes[0][0] == "ok"

        # (the restart's own deploy of a model not serving yet may end first, the recovery waiting for its lock;
        # measured: one sent before the relaunched tritonserver listened ended `failed`, unreachable, and retried)
        wait_for(lambda: all(ended(name) for name in names), 60, 0.2, "each interrupted deploy ended")
        registry = Registry(f"sqlite:///{state / 'registry.db'}")
        try:
            assert registry.open_deployments() == []
        finally:
            registry.close()
    finally:
        assert daemon.stop(kill_triton=True) == 0, daemon.log_tail()
