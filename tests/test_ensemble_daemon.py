"""Ensembles in the daemon: a step model it does not serve is an environment fault (the deploy fails,
the digest is not quarantined, deploying the step and loading again serves the ensemble); a map key
that does not fit the step model's recorded config is the ensemble's content fault (invalid snapshot,
never sent to Triton)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from controlplane.store.registry import Registry
from tests.corpus_gen import write_model
from tests.harness import DaemonProcess, wait_for

PIPE = ('name: "NAME"\nplatform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "step" model_version: -1 '
        'input_map { key: "KEY" value: "x" } output_map { key: "y" value: "y" } } ] }\n')


def publish(repo: Path, name: str, key: str = "x") -> None:
    """An ensemble written aside and renamed into the watched repository (a careful writer)."""
    staging = repo / f".staging-{name}"
    (staging / "1").mkdir(parents=True)
    (staging / "1" / "README").write_text("an ensemble's version directory holds no model file\n")
    (staging / "config.pbtxt").write_text(PIPE.replace("NAME", name).replace("KEY", key))
    staging.rename(repo / name)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("ensemble")
    repo = base / "repo"
    repo.mkdir()
    proc = DaemonProcess(repo, base / "state", settle_s=0.1).start()
    yield proc
    assert proc.stop() == 0, proc.log_tail()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ensemble_waits_for_its_step_and_a_bad_map_key_is_invalid(daemon: DaemonProcess) -> None:
    publish(daemon.repository, "pipe")
    failed = wait_for(lambda: daemon.audit("--model", "pipe", "--action", "deploy", "--outcome", "failed"), 30,
                      what="pipe's deploy refused")
    assert ('pipe/config.pbtxt: ensemble_scheduling.step[0].model_name: step model "step" is not served by this '
            "daemon; deploy it first") in failed[0]["message"]
    registry = Registry(f"sqlite:///{daemon.state_dir / 'registry.db'}")
    try:
        [snap] = registry.list_snapshots("pipe")
        assert snap.valid and not snap.quarantined  # an environment fault: the content is fine

        staging = write_model(daemon.repository / ".staging-step", name="step")
        staging.rename(daemon.repository / "step")
        wait_for(lambda: daemon.model_status("step").get("state") == "serving", 30, what="step serving")
        # The step's arrival deploys the waiting ensemble with it (one change set) or the operator's load
        # does, whichever comes first: either way pipe serves, through the step, what it computes.
        loaded = daemon.json("load", "pipe")
        assert loaded["outcome"] in ("ok", "noop"), loaded
        wait_for(lambda: daemon.model_status("pipe").get("state") == "serving", 30, what="pipe serving")
        client = grpcclient.InferenceServerClient(daemon.triton_url())
        try:
            x = grpcclient.InferInput("x", [1, 3], "FP32")
            x.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
            assert client.infer("pipe", [x], client_timeout=10).as_numpy("y").tolist() == [[6.0]]
        finally:
            client.close()

        publish(daemon.repository, "pipe_bad", key="nosuch")
        invalid = wait_for(lambda: daemon.audit("--model", "pipe_bad", "--outcome", "invalid"), 30,
                           what="pipe_bad invalid")
        assert ('pipe_bad/config.pbtxt: ensemble_scheduling.step[0].input_map: key "nosuch" is not an input of '
                '"step" (inputs: x)') in invalid[0]["message"]
        assert not daemon.audit("--model", "pipe_bad", "--action", "deploy")
    finally:
        registry.close()
        shutil.rmtree(daemon.repository / "pipe_bad", ignore_errors=True)
